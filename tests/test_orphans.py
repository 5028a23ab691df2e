"""A gpunn job ends with the Snakemake that started it (gpunn.orphans): no process left, no timing lock held."""

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import time

from gpunn import orphans

HOLD = textwrap.dedent("""\
    import os, sys, time
    from gpunn.cli import main  # the CLI's entry starts the watcher; the job's command is replaced by a hold
    from gpunn import cli
    def hold(args):
        from gpunn.timing_lock import timing_lock
        with timing_lock("test hold"):
            with open("started", "w") as handle:
                handle.write(str(os.getpid()))
            time.sleep(60)
    cli._cmd_hold = hold
    parser = cli.build_parser
    def build_parser():
        p = parser()
        sub = next(a for a in p._actions if a.dest == "command")
        sub.add_parser("hold").set_defaults(func=hold)
        return p
    cli.build_parser = build_parser
    sys.exit(main(["hold"]))
    """)


def _gone(pid: int) -> bool:
    stat = orphans._stat(pid)
    if stat is None:
        return True
    with open(f"/proc/{pid}/stat") as handle:  # a zombie nobody reaps counts as gone
        return handle.read().rsplit(")", 1)[1].split()[0] == "Z"


def test_a_process_started_by_hand_has_no_snakemake_to_watch():
    assert orphans.snakemake_ancestor() is None and orphans.exit_with_snakemake() is None


def test_killing_snakemake_ends_its_gpunn_job_and_frees_the_timing_lock(tmp_path):
    (tmp_path / "hold.py").write_text(HOLD)
    (tmp_path / "Snakefile").write_text(textwrap.dedent(f"""\
        rule hold:
            output: "done.txt"
            shell: "{sys.executable} hold.py 2>&1 | tee hold.log; touch {{output}}"
        """))
    lock = tmp_path / "timing.lock"
    env = {**os.environ, "GPUNN_TIMING_LOCK": str(lock)}
    snakemake = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1", "-s", "Snakefile"],
                                 cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while not (tmp_path / "started").is_file() or not (tmp_path / "started").read_text():
            assert time.monotonic() < deadline and snakemake.poll() is None, "the job never started"
            time.sleep(0.2)
        job = int((tmp_path / "started").read_text())
        snakemake.send_signal(signal.SIGKILL)
        snakemake.wait(10)
        deadline = time.monotonic() + 10
        while not _gone(job):
            assert time.monotonic() < deadline, "the gpunn job outlived its Snakemake"
            time.sleep(0.2)
    finally:
        if snakemake.poll() is None:
            snakemake.kill()
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: BlockingIOError otherwise
    finally:
        os.close(fd)
    assert "Snakemake (pid" in (tmp_path / "hold.log").read_text() and not (tmp_path / "done.txt").exists()
