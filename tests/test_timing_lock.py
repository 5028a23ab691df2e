"""The machine-wide timing lock: a timed job waits for another one and says so in its log, two holders never
overlap, and the lock is released however the block ends. Every test uses a lock file of its own."""

import fcntl
import json
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from gpunn.errors import GpunnError
from gpunn.timing_lock import timing_lock


@pytest.fixture
def lock_file(tmp_path, monkeypatch):
    path = tmp_path / "timing.lock"
    monkeypatch.setenv("GPUNN_TIMING_LOCK", str(path))
    return path


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdout=subprocess.PIPE, text=True,
                            **kwargs)


def _holder() -> subprocess.Popen:
    """Another process holding the lock for 3 s ("holder job"), returned once it holds it."""
    holder = _python("""
        import time
        from gpunn.timing_lock import timing_lock
        with timing_lock("holder job", log=print):
            print("locked", flush=True)
            time.sleep(3)
        """)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def test_a_job_waits_for_the_holder_and_logs_it(lock_file):
    holder = _holder()
    try:
        lines = []
        start = time.monotonic()
        with timing_lock("waiting job", log=lines.append) as lock:
            elapsed = time.monotonic() - start
        assert holder.wait(timeout=30) == 0
    finally:
        holder.kill()
    assert lock.waited_s >= 2.0 and elapsed >= 2.0
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"waiting for the timing lock {lock_file}: held by pid {holder.pid} (holder job, since ")
    assert lines[1] == f"got the timing lock after {lock.waited_s:.1f} s of waiting"


def test_a_simulated_job_skips_the_lock_while_it_is_held(lock_file):
    """skip (a GPU variant under the simulator, whose times measure nothing): no wait and no line while another
    job holds the lock; the holder keeps it."""
    holder = _holder()
    try:
        lines = []
        start = time.monotonic()
        with timing_lock("simulated job", log=lines.append, skip=True) as lock:
            elapsed = time.monotonic() - start
        assert holder.poll() is None  # still holding it
    finally:
        holder.kill()
    assert lines == [] and lock.waited_s == 0.0 and lock.path == "" and elapsed < 1.0


def test_two_holders_never_overlap(lock_file, tmp_path):
    code = """
        import json, sys, time
        from gpunn.timing_lock import timing_lock
        intervals = []
        for _ in range(3):
            with timing_lock("timed block " + sys.argv[1], log=lambda line: None):
                entered = time.time()
                time.sleep(0.2)
                intervals.append((entered, time.time()))
        print(json.dumps(intervals))
        """
    jobs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(k)], stdout=subprocess.PIPE,
                             text=True) for k in range(2)]
    intervals = sorted(i for job in jobs for i in json.loads(job.communicate(timeout=60)[0]))
    assert len(intervals) == 6
    for (_, first_exit), (second_enter, _) in zip(intervals, intervals[1:]):
        assert first_exit <= second_enter, intervals


def test_a_free_lock_is_taken_silently_and_world_writable(lock_file):
    lines = []
    old_umask = os.umask(0o022)
    try:
        with timing_lock("job", log=lines.append) as lock:
            holder = json.loads(lock_file.read_text())
    finally:
        os.umask(old_umask)
    assert lines == [] and lock.waited_s == 0.0 and lock.path == str(lock_file)
    assert holder["pid"] == os.getpid() and holder["what"] == "job"
    assert lock_file.stat().st_mode & 0o777 == 0o666
    assert lock_file.read_text() == ""  # no stale holder once released


def _free(path) -> bool:
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(fh, fcntl.LOCK_UN)
        return True


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_released_when_the_block_fails(lock_file, error):
    with pytest.raises(error), timing_lock("job", log=print):
        assert not _free(lock_file)
        raise error()
    assert _free(lock_file)


def test_nested_use_in_one_process_does_not_wait_for_itself(lock_file):
    lines = []
    with timing_lock("outer", log=lines.append):
        with timing_lock("inner", log=lines.append) as inner:
            assert inner.waited_s == 0.0
        assert not _free(lock_file)  # the outer block still holds it
    assert _free(lock_file) and lines == []


def test_unusable_lock_path_is_one_clear_error(tmp_path, monkeypatch):
    path = tmp_path / "no-such-dir" / "timing.lock"
    monkeypatch.setenv("GPUNN_TIMING_LOCK", str(path))
    with pytest.raises(GpunnError) as caught, timing_lock("job"):
        pass
    message = str(caught.value)
    assert str(path) in message and "GPUNN_TIMING_LOCK" in message and "\n" not in message


def test_a_symlink_planted_at_the_lock_path_is_refused_in_one_line(lock_file, tmp_path):
    """Another user's link in the shared temp folder must not have the job truncate and write the file it points to."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    victim.chmod(0o600)
    lock_file.symlink_to(victim)
    with pytest.raises(GpunnError) as caught, timing_lock("job", log=print):
        pass
    message = str(caught.value)
    assert message.startswith(f"the lock file {lock_file} is a symbolic link (to {victim}): ")
    assert "GPUNN_TIMING_LOCK" in message and "\n" not in message
    assert victim.read_text() == "precious\n" and victim.stat().st_mode & 0o777 == 0o600


def test_a_hard_link_or_a_folder_at_the_lock_path_is_refused(lock_file, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("precious\n")
    os.link(other, lock_file)
    with pytest.raises(GpunnError, match=r"^the lock file .* has 2 hard links: .*GPUNN_TIMING_LOCK"), \
            timing_lock("job"):
        pass
    assert other.read_text() == "precious\n"
    lock_file.unlink()
    lock_file.mkdir()
    with pytest.raises(GpunnError, match=r"^(the lock file .* is not a regular file|cannot open the timing lock)"), \
            timing_lock("job"):
        pass


def test_a_record_left_by_an_exited_holder_names_no_one(lock_file):
    lock_file.write_text(json.dumps({"pid": 2 ** 22 + 12345, "what": "gone", "since": time.time()}))
    from gpunn.timing_lock import describe_holder
    assert describe_holder(str(lock_file)) == "another process (not yet recorded)"
    lock_file.write_text(json.dumps({"pid": os.getpid(), "what": "me\x1b[2J" + "x" * 300, "since": time.time()}))
    described = describe_holder(str(lock_file))
    assert re.fullmatch(rf"pid {os.getpid()} \(me\?\[2Jx{{151}}\.\.\., since \d\d:\d\d:\d\d\)", described), described
