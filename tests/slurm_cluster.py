"""A real single-node Slurm cluster on this machine, for the tests of the Slurm profile (tests/test_slurm.py).

Daemons, all on loopback and all in one temporary folder (their configs, sockets, state and logs):

- munged: Slurm's authentication, with a key made for this cluster;
- mariadbd: the accounting database (a fresh data directory);
- slurmdbd: the accounting daemon, which `sacct` asks (the Snakemake executor plugin polls job states with it);
- slurmctld and slurmd: the controller and this machine as its one node, with all its CPUs, its memory and
  one GPU slot (gres/gpu without a device file: GPU rules are placed with `--gpus=1` as on a real cluster,
  and the smoke config's GPU jobs run under the CUDA simulator).

Clients find the cluster through the environment of `SlurmCluster.env` (SLURM_CONF), except one: the
executor's job step runs `srun` with every SLURM_* variable removed, so it reads Slurm's default path. The
cluster therefore links /etc/slurm/slurm.conf to its own file while it runs (and refuses to start where that
path already holds another file: a machine with its own Slurm). Nothing else outside the folder is written.
The daemons must run as root (slurmd starts jobs as their users). Debian's packages: slurm-wlm slurmdbd munge
mariadb-server (`.ci/run` installs them).

Any step that fails raises `SlurmUnavailable` with one line saying which daemon or command failed and the
last line of its log.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGES = "slurm-wlm slurmdbd munge mariadb-server"
DAEMONS = {"munged": "munge", "mariadbd": "mariadb-server", "mariadb-install-db": "mariadb-server",
           "slurmdbd": "slurmdbd", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-client",
           "sacct": "slurm-client", "sacctmgr": "slurm-client", "scontrol": "slurm-client", "sinfo": "slurm-client"}
SBIN = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")  # where clients look without $SLURM_CONF
CLUSTER = "gpunn"
ACCOUNT = "gpunn"


class SlurmUnavailable(RuntimeError):
    """The cluster could not be started; the message is one line."""


def find_program(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in SBIN:
        if os.access(os.path.join(folder, name), os.X_OK):
            return os.path.join(folder, name)
    return None


def missing_programs() -> list[str]:
    """Programs the cluster needs that are not on this machine, as 'program (Debian package)'."""
    return [f"{name} ({package})" for name, package in DAEMONS.items() if find_program(name) is None]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1].strip() if lines else "(empty log)"


def _memory_mb() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise SlurmUnavailable("cannot read MemTotal from /proc/meminfo")


class SlurmCluster:
    """Start with `start()` (or `with SlurmCluster() as cluster:`), stop with `stop()`: daemons end, the folder
    goes unless keep=True. `run(*argv)` runs a Slurm client command against this cluster."""

    def __init__(self, root: str | os.PathLike | None = None, keep: bool = False):
        # unix socket paths must stay under 108 bytes: a short folder under /tmp, not pytest's long tmp_path
        self.root = Path(root) if root else Path(tempfile.mkdtemp(prefix="gpunn-slurm-"))
        self.keep = keep
        self.node = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.memory_mb = _memory_mb()
        self.processes: dict[str, subprocess.Popen] = {}
        self.env = dict(os.environ)
        self.version = ""
        self.linked_default_conf = False

    # --- the configuration files --------------------------------------------------------------------------

    def _write(self, name: str, text: str, mode: int = 0o644) -> Path:
        path = self.root / name
        path.write_text(text)
        path.chmod(mode)
        return path

    def _configure(self) -> None:
        root = self.root
        for folder in ("munge", "db", "state", "spool", "logs"):
            (root / folder).mkdir(mode=0o700, exist_ok=True)
        (root / "munge").chmod(0o755)  # munged: every user's jobs must reach its socket
        self.munge_socket = root / "munge" / "munge.socket"
        self.db_socket = root / "db.sock"
        self.db_port, self.dbd_port, self.ctld_port, self.slurmd_port = (free_port() for _ in range(4))
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        self.dbd_conf = self._write("slurmdbd.conf", (
            f"DbdHost=localhost\nDbdAddr=127.0.0.1\nDbdPort={self.dbd_port}\nSlurmUser=root\n{auth}"
            f"StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\nStoragePort={self.db_port}\n"
            f"StorageUser=root\nStorageLoc=slurm_acct_db\n"
            f"PidFile={root}/slurmdbd.pid\nLogFile={root}/logs/slurmdbd.log\nDebugLevel=info\n"), mode=0o600)
        self._write("gres.conf", f"NodeName={self.node} Name=gpu File=/dev/null Count=1\n")
        self._write("cgroup.conf", "CgroupPlugin=autodetect\n")
        self.conf = self._write("slurm.conf", (
            f"ClusterName={CLUSTER}\nSlurmctldHost={self.node}(127.0.0.1)\n"
            f"SlurmctldPort={self.ctld_port}\nSlurmdPort={self.slurmd_port}\n"
            f"SlurmUser=root\nSlurmdUser=root\n{auth}"
            f"StateSaveLocation={root}/state\nSlurmdSpoolDir={root}/spool\n"
            f"SlurmctldPidFile={root}/slurmctld.pid\nSlurmdPidFile={root}/slurmd.pid\n"
            f"SlurmctldLogFile={root}/logs/slurmctld.log\nSlurmdLogFile={root}/logs/slurmd.log\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            # no cgroups here (a container, a CI machine): processes tracked by parent pid, no task binding
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "MpiDefault=none\nSwitchType=switch/none\nLaunchParameters=use_interactive_step\n"
            "SchedulerType=sched/builtin\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n"
            "GresTypes=gpu\nReturnToService=2\nMinJobAge=600\nKillWait=5\n"
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={self.dbd_port}\nAccountingStorageTRES=gres/gpu\n"
            f"AccountingStoragePass={self.munge_socket}\n"  # for slurmdbd connections: the munged socket
            "JobCompType=jobcomp/none\nAccountingStoreFlags=job_comment\n"  # sacct shows the rule (plugin's --comment)
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} "
            "Gres=gpu:1 State=UNKNOWN\n"
            f"PartitionName=main Nodes={self.node} Default=YES MaxTime=INFINITE State=UP\n"))
        self.env.update(SLURM_CONF=str(self.conf))

    # --- the daemons ----------------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.root / "logs" / f"{name}.out", "ab")  # noqa: SIM115 (the daemon's log, open while it runs)
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                   start_new_session=True)
        log.close()
        self.processes[name] = process
        return process

    def _wait_for(self, what: str, ready, log: Path, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            process = self.processes.get(what)
            if process is not None and process.poll() is not None:
                raise SlurmUnavailable(f"{what} exited with status {process.returncode}: {self._why(what, log)}")
            if ready():
                return
            time.sleep(0.25)
        raise SlurmUnavailable(f"{what} not ready after {timeout:.0f} s: {self._why(what, log)}")

    def _why(self, what: str, log: Path) -> str:
        """The daemon's last log line, else the last line it printed."""
        line = _last_line(log)
        return line if not line.startswith("(") else _last_line(self.root / "logs" / f"{what}.out")

    def run(self, *argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """A Slurm client command against this cluster (its output as text)."""
        program = find_program(argv[0]) or argv[0]
        done = subprocess.run([program, *argv[1:]], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise SlurmUnavailable(f"`{' '.join(argv)}` failed ({done.returncode}): "
                                   f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
        return done

    def _ok(self, *argv: str) -> bool:
        try:
            return self.run(*argv, check=False, timeout=20).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def start(self) -> SlurmCluster:
        if os.geteuid() != 0:
            raise SlurmUnavailable("slurmd must run as root to start jobs; run the Slurm tests as root")
        missing = missing_programs()
        if missing:
            raise SlurmUnavailable(f"not installed: {', '.join(missing)}; apt-get install {PACKAGES}")
        try:
            self._start()
        except SlurmUnavailable:
            self.stop()
            raise
        return self

    def _link_default_conf(self) -> None:
        if DEFAULT_CONF.is_symlink() and not DEFAULT_CONF.exists():
            DEFAULT_CONF.unlink()  # left by a test cluster that was killed
        if DEFAULT_CONF.exists() or DEFAULT_CONF.is_symlink():
            raise SlurmUnavailable(f"{DEFAULT_CONF} exists (this machine's own Slurm), and jobs' srun would read it "
                                   "instead of the test cluster's: run the Slurm tests on a machine without one")
        DEFAULT_CONF.parent.mkdir(parents=True, exist_ok=True)
        DEFAULT_CONF.symlink_to(self.conf)
        self.linked_default_conf = True

    def _start(self) -> None:
        root = self.root
        self._configure()
        self._link_default_conf()
        logs = root / "logs"
        self._spawn("munged", [find_program("munged"), "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={root}/munge/munge.key", f"--pid-file={root}/munge/munged.pid",
                               f"--seed-file={root}/munge/munged.seed", f"--log-file={logs}/munged.log"])
        self._wait_for("munged", self.munge_socket.exists, logs / "munged.log")

        install = subprocess.run([find_program("mariadb-install-db"), "--no-defaults", f"--datadir={root}/db",
                                  "--user=root", "--auth-root-authentication-method=normal",
                                  "--skip-test-db"], capture_output=True, text=True)
        if install.returncode != 0:
            raise SlurmUnavailable(f"mariadb-install-db failed: {(install.stderr or install.stdout).strip()[-300:]}")
        self._spawn("mariadbd", [find_program("mariadbd"), "--no-defaults", f"--datadir={root}/db", "--user=root",
                                 f"--socket={self.db_socket}", f"--port={self.db_port}", "--bind-address=127.0.0.1",
                                 f"--pid-file={root}/mariadbd.pid", f"--log-error={logs}/mariadbd.log",
                                 "--skip-name-resolve", "--innodb-buffer-pool-size=64M"])
        self._wait_for("mariadbd", self.db_socket.exists, logs / "mariadbd.log")

        self._spawn("slurmdbd", [find_program("slurmdbd"), "-D"])  # reads slurmdbd.conf beside $SLURM_CONF
        self._wait_for("slurmdbd", lambda: self._ok("sacctmgr", "-n", "list", "cluster"), logs / "slurmdbd.log")
        self.run("sacctmgr", "-i", "add", "cluster", CLUSTER)
        self.run("sacctmgr", "-i", "add", "account", ACCOUNT, "Description=gpunn tests", "Organization=gpunn")
        self.run("sacctmgr", "-i", "add", "user", "root", f"Account={ACCOUNT}", f"DefaultAccount={ACCOUNT}")

        self._spawn("slurmctld", [find_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        self._wait_for("slurmctld", lambda: self._ok("scontrol", "ping"), logs / "slurmctld.log")
        self._spawn("slurmd", [find_program("slurmd"), "-D", "-N", self.node, "-f", str(self.conf)])

        def node_idle():
            state = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.strip()
            return state.startswith("idle") or state.startswith("mixed")
        self._wait_for("slurmd", node_idle, logs / "slurmd.log")
        self.version = self.run("sinfo", "--version").stdout.strip()

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            process = self.processes[name]
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()
        if self.linked_default_conf and DEFAULT_CONF.is_symlink():
            DEFAULT_CONF.unlink()
            self.linked_default_conf = False
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
