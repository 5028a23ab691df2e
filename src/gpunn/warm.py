"""Warm jobs: a server that has imported gpunn, numba and numba-cuda and set up numba's CUDA target once forks each
job from that state, so that a job starts in about 0.65 s instead of 1.7-2.4 s (docs/notes/issue-40-progress.md).

    GPUNN_WARM=1 python -m gpunn train ...   the job runs in a fork of the server (started on the first such job)
    python -m gpunn.warm stop                stops this user's servers (the pipeline's last step does)

- The client is the job's own process, as Snakemake and gpunn.placement started it: it sends the server its command,
  environment, working folder, CPU affinity and pid, with stdin, stdout and stderr as descriptors; it forwards
  SIGTERM, SIGINT and SIGHUP to the job; it prints the job's CPU time and peak memory as one `gpunn warm job:` line
  (the job is not in its process tree, where Snakemake's benchmark looks: gpunn.report.job_times reads the line
  instead) and exits with the job's status. While the client lives, it holds what gpunn.placement took (GPU slot,
  cores); a job whose client is gone ends.
- The server holds no CUDA context (none survives a fork): each job makes its own and loads its kernels from the
  disk cache (gpunn.kernel_cache). There is one server per user, Python, gpunn source state and environment that the
  preloaded modules read when imported (KEY_PREFIXES: numba's settings, BLAS threads, library paths, the kernel
  cache and the home folder it defaults to); it ends after IDLE_S without a job.
- If the server cannot be reached or started, the client runs the job itself, as without GPUNN_WARM.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import time

ENABLE_VARIABLE = "GPUNN_WARM"
COMMANDS = ("train", "evaluate", "features", "time-batches", "sweep-blocks", "profile")  # the GPU jobs' commands
KEY_PREFIXES = ("NUMBA_", "CUDA_", "PYTHON", "LD_", "OMP_", "OPENBLAS_", "GOTO_", "MKL_", "VECLIB_", "NUMEXPR_",
                "GPUNN_KERNEL_CACHE", "XDG_CACHE_HOME", "HOME", "PATH")
NOT_KEY = ("CUDA_VISIBLE_DEVICES",)  # read when the job makes its context, after the fork
IDLE_S = 120.0  # a server ends this long after its last job (GPUNN_WARM_IDLE_S sets it for the servers it starts)
IDLE_VARIABLE = "GPUNN_WARM_IDLE_S"
START_S = 60.0  # how long a client waits for a server it started to answer
POLL_S = 0.05


# --------------------------------------------------------------------------------------------- framing
def _send(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    header = struct.pack("!I", len(data))
    if fds:
        socket.send_fds(sock, [header + data], fds)
    else:
        sock.sendall(header + data)


def _recv_exact(sock: socket.socket, size: int, first: bytes = b"") -> bytes:
    """`first` and what follows it on the socket, at least `size` bytes."""
    data = first
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def _receive(sock: socket.socket, with_fds: int = 0) -> tuple[dict, list[int]]:
    """One message (and up to `with_fds` descriptors sent with it)."""
    data, fds = b"", []
    if with_fds:
        data, fds, _, _ = socket.recv_fds(sock, 1 << 16, with_fds)
        if not data:
            raise ConnectionError("closed")
    data = _recv_exact(sock, 4, data)
    (size,) = struct.unpack("!I", data[:4])
    data = _recv_exact(sock, 4 + size, data)
    return json.loads(data[4 : 4 + size]), fds


# --------------------------------------------------------------------------------------------- where
def server_key(environ=None) -> str:
    """16 hex digits: this Python, gpunn's source state and the environment the preloaded modules read."""
    from gpunn.kernel_cache import source_state

    environ = os.environ if environ is None else environ
    digest = hashlib.sha256(f"{sys.executable}\0{sys.version}\0{source_state()}\0".encode())
    for name in sorted(environ):
        if name.startswith(KEY_PREFIXES) and name not in NOT_KEY:
            digest.update(f"{name}={environ[name]}\0".encode())
    return digest.hexdigest()[:16]


def folder() -> str:
    """This user's folder of server sockets: <temp>/gpunn-warm-<uid>, private to the user."""
    path = os.path.join(tempfile.gettempdir(), f"gpunn-warm-{os.getuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def socket_path(key: str) -> str:
    return os.path.join(folder(), f"{key}.sock")


# --------------------------------------------------------------------------------------------- client
def wanted(argv) -> bool:
    """Whether this command should run in a warm server: GPUNN_WARM=1, one of COMMANDS, and not on Slurm (where each
    job has a node of its own, and a server would outlive nothing)."""
    return (os.environ.get(ENABLE_VARIABLE) == "1" and bool(argv) and argv[0] in COMMANDS
            and not os.environ.get("SLURM_JOB_ID"))


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def _start_server(path: str) -> socket.socket | None:
    """Connect to the server at `path`, starting it first (one client at a time, under a lock) if none answers."""
    import fcntl
    import subprocess

    with open(path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = _connect(path)
        if sock is not None:
            return sock
        if os.path.exists(path):
            os.unlink(path)  # a server that ended without removing it
        with open(path + ".log", "ab") as log:
            idle = os.environ.get(IDLE_VARIABLE, str(IDLE_S))
            server = subprocess.Popen([sys.executable, "-m", "gpunn.warm", "serve", path, idle],
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                      close_fds=True)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline and server.poll() is None:  # a server that failed to start: no wait
            sock = _connect(path)
            if sock is not None:
                return sock
            time.sleep(POLL_S)
    return None


def run(argv) -> int | None:
    """Run `gpunn argv` in a fork of the warm server: its exit status, or None when no server could take it (the
    caller then runs it itself)."""
    try:
        path = socket_path(server_key())
        sock = _connect(path) or _start_server(path)
    except OSError:
        return None
    if sock is None:
        return None
    from gpunn.orphans import exit_with_snakemake, starttime

    request = {"argv": list(argv), "env": dict(os.environ), "cwd": os.getcwd(),
               "affinity": sorted(os.sched_getaffinity(0)), "client": [os.getpid(), starttime(os.getpid())]}
    with sock:
        try:
            _send(sock, request, [0, 1, 2])
            started, _ = _receive(sock)
        except (OSError, ConnectionError, ValueError):
            return None  # the server took nothing: run it here
        pid = started["pid"]
        exit_with_snakemake()  # the job watches this process, this process its Snakemake

        def forward(signum, _frame):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, forward)
        try:
            done, _ = _receive(sock)
        except (OSError, ConnectionError, ValueError):
            print("gpunn: error: the warm server ended before the job did (its log: "
                  f"{socket_path(server_key())}.log); run the job again", file=sys.stderr, flush=True)
            return 1
    from gpunn.jobusage import usage_line

    print(usage_line(done["cpu_time_s"], done["max_rss_mb"], pid), file=sys.stderr, flush=True)
    return int(done["status"])


# --------------------------------------------------------------------------------------------- server
def preload() -> None:
    """What the GPU jobs import and set up first: gpunn's job commands, the GPU engine with its kernels (defined,
    not compiled) and numba's CUDA target. No CUDA context."""
    import gpunn.backends.gpu.engine  # noqa: F401
    import gpunn.batch_timing  # noqa: F401
    import gpunn.cli  # noqa: F401
    import gpunn.evaluate  # noqa: F401
    import gpunn.features  # noqa: F401
    import gpunn.profiling  # noqa: F401
    import gpunn.train  # noqa: F401
    from gpunn.device import simulator_enabled

    if not simulator_enabled():
        from numba.cuda.descriptor import cuda_target

        cuda_target.target_context.refresh()


def _job(request: dict, fds: list[int]) -> None:
    """In the forked child: become the client's job and run it; never returns."""
    code = 1
    try:
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
            os.close(fd)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.sched_setaffinity(0, request["affinity"])
        _watch_client(*request["client"])
        sys.argv = ["gpunn", *request["argv"]]
        from gpunn import cli

        code = cli.main(request["argv"])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException as exc:  # noqa: BLE001 (reported on the job's stderr, then the status)
        print(f"gpunn: error: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _watch_client(pid: int, started: str) -> None:
    """End this job once its client is gone (killed with Snakemake, or by hand)."""
    import threading

    from gpunn.orphans import starttime

    def watch():
        while starttime(pid) == started:
            time.sleep(0.5)
        print(f"gpunn: the job's client (pid {pid}) is gone: stopping the job, no outputs", file=sys.stderr,
              flush=True)
        os._exit(1)

    threading.Thread(target=watch, name="gpunn-warm-client", daemon=True).start()


def serve(path: str, idle_s: float = IDLE_S) -> None:
    """Accept jobs on the socket `path` until IDLE_S pass without one; one forked child per job."""
    import select

    preload()
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # not the first job's cores
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = socket.socketpair()  # a child's end wakes the loop at once
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    jobs: dict[int, socket.socket] = {}  # child pid -> its client's connection
    stopping = []  # SIGTERM (`stop`): take no new job, answer the running ones, then end

    def stop_accepting(*_):
        stopping.append(True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # the next client starts a new server

    signal.signal(signal.SIGTERM, stop_accepting)
    last = time.monotonic()
    print(f"gpunn warm server {os.getpid()}: serving {path}", flush=True)
    try:
        while jobs or (not stopping and time.monotonic() - last < idle_s):
            waiting = [wake_read] if stopping else [listener, wake_read]
            readable, _, _ = select.select(waiting, [], [], 1.0)
            if wake_read in readable:
                wake_read.recv(4096)
            if listener in readable:
                conn, _ = listener.accept()
                try:
                    request, fds = _receive(conn, with_fds=3)
                except (OSError, ConnectionError, ValueError):
                    conn.close()
                    continue
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    for closing in (listener, wake_read, wake_write, conn, *jobs.values()):
                        closing.close()
                    _job(request, fds)
                for fd in fds:
                    os.close(fd)
                jobs[pid] = conn
                print(f"job {pid}: gpunn {' '.join(request['argv'])}", flush=True)
                _send(conn, {"pid": pid})
            _reap(jobs)
            if jobs:
                last = time.monotonic()
    finally:
        listener.close()
        if not stopping:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def _reap(jobs: dict[int, socket.socket]) -> None:
    """Answer the clients of the jobs that ended: status, CPU time, peak memory."""
    while jobs:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = jobs.pop(pid, None)
        if conn is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        print(f"job {pid}: ended, status {code}", flush=True)
        with contextlib.suppress(OSError):
            _send(conn, {"status": code if code >= 0 else 128 - code,
                         "cpu_time_s": usage.ru_utime + usage.ru_stime, "max_rss_mb": usage.ru_maxrss / 1024})
        conn.close()


def stop() -> int:
    """Ask every warm server of this user to end (each takes no new job, answers its running ones, then ends; they
    end after their idle time anyway): the number asked."""
    stopped = 0
    base = folder()
    for name in os.listdir(base):
        if not name.endswith(".sock.log"):
            continue
        pid = _server_pid(os.path.join(base, name))
        if pid and os.path.exists(os.path.join(base, name[: -len(".log")])):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
                stopped += 1
    return stopped


def _server_pid(log: str) -> int | None:
    try:
        with open(log) as handle:
            lines = [line for line in handle if line.startswith("gpunn warm server ")]
    except OSError:
        return None
    return int(lines[-1].split()[3].rstrip(":")) if lines else None


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"] and len(argv) in (2, 3):
        serve(argv[1], float(argv[2]) if len(argv) == 3 else IDLE_S)
        return 0
    if argv == ["stop"]:
        print(f"gpunn.warm: stopped {stop()} server(s)")
        return 0
    print("usage: python -m gpunn.warm serve SOCKET [IDLE_S] | stop", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
