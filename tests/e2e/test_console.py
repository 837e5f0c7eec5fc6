"""Local children write their own log files; the console follows those files.

End to end with real processes (both launch modes), plus the output pump on
its own with real files, with and without inotify.
"""

import os
import re
import select
import signal
import threading
import time

import pytest

from jaxrun import portable
from jaxrun.core.events import Stream, StreamClosed
from jaxrun.launcher.output import filewatch, pump as pump_module

# Its scripts are plain Python: one launch mode, without the preloading server.
pytestmark = [pytest.mark.timeout(120), pytest.mark.plain_python]


def read_until(job, wanted: list[bytes], within: float) -> bytes:
    """Read a running jaxrun's stdout until every wanted piece has shown up."""
    got = b""
    deadline = time.monotonic() + within
    fd = job.proc.stdout.fileno()
    while not all(w in got for w in wanted) and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            data = os.read(fd, 1 << 16)
            if not data:
                break
            got += data
    return got


def run_ok(jaxrun, tmp_path, source: str, *args):
    """Run a script to success; returns its console output and its log folder."""
    script = tmp_path / "job.py"
    script.write_text(source)
    logs = tmp_path / "logs"
    code, out, err = jaxrun(*args, "--log-dir", logs, script)
    assert code == 0, err
    return out, err, logs


@pytest.mark.both_modes
def test_children_write_into_pipes_of_their_own_that_jaxrun_moves_into_the_logs(jaxrun, tmp_path):
    """A pipe, not the file: a log's write error (a full disk) never reaches the process."""
    out, _, logs = run_ok(jaxrun, tmp_path, (
        "import os\n"
        "print(os.readlink('/proc/self/fd/1'), os.readlink('/proc/self/fd/2'))\n"
        "print('group', os.getpgid(0) == os.getpid(), 'session', os.getsid(0))\n"
    ), "-n", 2)
    sessions, pipes = set(), set()
    for rank in range(2):
        where, group = (logs / f"process-{rank}.stdout").read_text().splitlines()
        assert all(name.startswith("pipe:[") for name in where.split()), where
        pipes.update(where.split())
        # Leader of its own group (one killpg takes its descendants), in the launcher's session.
        assert group.startswith("group True session ")
        sessions.add(group.split()[-1])
        assert f"[{rank}] {where}" in out
    assert len(sessions) == 1 and int(sessions.pop()) != 0
    assert len(pipes) == 4  # one per stream of each process


def test_a_quiet_process_line_shows_while_it_runs(launch, tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text(
        "import os, time\n"
        "print('hello from', os.environ['JAXRUN_PROCESS_ID'], flush=True)\n"
        "time.sleep(60)\n"
    )
    job = launch("-n", 2, "--grace", "1", script)
    seen = read_until(job, [b"[0] hello from 0", b"[1] hello from 1"], within=60)
    still_running = job.proc.poll() is None
    job.proc.send_signal(signal.SIGINT)
    assert job.wait(timeout=60) == 130
    assert b"[0] hello from 0" in seen and b"[1] hello from 1" in seen, seen
    assert still_running


def test_steady_output_shows_while_it_runs(launch, tmp_path):
    script = tmp_path / "steady.py"
    script.write_text(
        "import itertools, time\n"
        "for i in itertools.count():\n"
        "    print('tick', i)\n"
        "    time.sleep(0.005)\n"
    )
    job = launch("-n", 1, "--grace", "1", script)
    seen = read_until(job, [b"[0] tick 200\n"], within=60)
    still_running = job.proc.poll() is None
    job.proc.send_signal(signal.SIGINT)
    job.wait(timeout=60)
    assert b"[0] tick 200\n" in seen and still_running


def test_a_flood_reaches_the_console_whole(jaxrun, tmp_path):
    out, err, logs = run_ok(jaxrun, tmp_path, (
        "import os, sys\n"
        "rank = os.environ['JAXRUN_PROCESS_ID']\n"
        "line = f'{rank} '.encode() + b'x' * 97 + b'\\n'\n"
        "for _ in range(100):\n"
        "    os.write(1, line * 2000)\n"  # 20 MB a process, as fast as it can
        "os.write(2, b'done ' + rank.encode())\n"
    ), "-n", 2)
    for rank in range(2):
        expected = (f"{rank} ".encode() + b"x" * 97 + b"\n") * 200_000
        assert (logs / f"process-{rank}.stdout").read_bytes() == expected
        assert out.count(f"[{rank}] {rank} xxx") == 200_000
        assert f"[{rank}] done {rank}\n" in err  # a last partial line, completed on the console


@pytest.mark.both_modes
def test_grandchildren_share_the_log_and_nothing_is_overwritten(jaxrun, tmp_path):
    out, _, logs = run_ok(jaxrun, tmp_path, (
        "import subprocess, sys\n"
        "print('parent before', flush=True)\n"
        "subprocess.run([sys.executable, '-c', 'print(\"grandchild\")'], check=True)\n"
        "print('parent after', flush=True)\n"
    ), "-n", 1)
    assert (logs / "process-0.stdout").read_text() == "parent before\ngrandchild\nparent after\n"
    assert "[0] parent before\n[0] grandchild\n[0] parent after\n" in out


def test_console_ranks_limits_the_console_never_the_logs(jaxrun, tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import os, sys\nr = os.environ['JAXRUN_PROCESS_ID']\n"
                      "print('out', r)\nprint('err', r, file=sys.stderr)\n")
    logs = tmp_path / "logs"
    code, out, err = jaxrun("-n", 3, "--console-ranks", "0,2", "--log-dir", logs, script)
    assert code == 0, err
    assert "[0] out 0" in out and "[2] out 2" in out and "[1]" not in out
    assert "[0] err 0" in err and "[2] err 2" in err and "[1]" not in err
    for rank in range(3):
        assert (logs / f"process-{rank}.stdout").read_text() == f"out {rank}\n"
        assert (logs / f"process-{rank}.stderr").read_text() == f"err {rank}\n"
    code, out, err = jaxrun("-n", 2, "--console-ranks", "none", "--output", "grouped", script)
    assert code == 0, err
    assert "out" not in out and "process 0 output" not in out
    assert "jaxrun: logs in" in err


@pytest.mark.parametrize("value, message", [
    ("2", "--console-ranks: there is no process 2 among 2"),
    ("1-0", "is not a list of ranks"),
    ("first", "is not a list of ranks"),
])
def test_console_ranks_bad_values_are_one_line_errors(jaxrun, tmp_path, value, message):
    script = tmp_path / "never.py"
    script.write_text("open(__file__ + '.ran', 'w').close()\n")
    code, out, err = jaxrun("-n", 2, "--console-ranks", value, script)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "never.py.ran").exists()


class Collector:
    """Stands in for the console printer: what the pump showed, and when each stream ended."""

    def __init__(self):
        self.shown: dict[int, bytes] = {}
        self.lock = threading.Lock()

    def show(self, rank, stream, data):
        with self.lock:
            self.shown[rank] = self.shown.get(rank, b"") + data

    def wait_for(self, rank, text: bytes, within=10.0) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with self.lock:
                if text in self.shown.get(rank, b""):
                    return True
            time.sleep(0.01)
        return False


def inotify_descriptors() -> set[int]:
    """This process's open inotify descriptors."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify":
                found.add(int(fd))
        except OSError:  # closed meanwhile
            pass
    return found


def inotify_watched_inodes() -> set[int]:
    """Inodes that some inotify descriptor of this process watches (from /proc fdinfo)."""
    found = set()
    for fd in inotify_descriptors():
        try:
            with open(f"/proc/self/fdinfo/{fd}") as f:
                found |= {int(m, 16) for m in re.findall(r"^inotify wd:\S+ ino:([0-9a-f]+)", f.read(), re.M)}
        except OSError:  # closed meanwhile
            pass
    return found


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
def test_the_pump_follows_growing_files(tmp_path, monkeypatch, inotify):
    if not inotify:  # as on a system without inotify: a 10 Hz tick
        monkeypatch.setattr(filewatch.FileWatch, "arm", lambda self, paths: None)
    import queue

    events = queue.SimpleQueue()
    shown = Collector()
    # With inotify a quiet file is watched, not polled: a poll interval far
    # longer than the wait below shows that the watch, not a tick, woke the pump.
    pump = pump_module.OutputPump(events, shown.show, coalesce=60.0 if inotify else pump_module.COALESCE)
    paths = [tmp_path / f"p{r}.log" for r in range(2)]
    writers = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for p in paths]
    try:
        dones = [pump.follow(str(path), rank, Stream.STDOUT)[1] for rank, path in enumerate(paths)]
        time.sleep(0.5)  # quiet files: the pump is waiting on them now
        if inotify:
            inodes = {os.stat(p).st_ino for p in paths}
            deadline = time.monotonic() + 10  # the pump thread runs at the lowest priority
            while not inodes <= inotify_watched_inodes() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert inodes <= inotify_watched_inodes(), "the quiet files are not watched"
        os.write(writers[1], b"first line\npartial")
        assert shown.wait_for(1, b"first line\n", within=5.0)
        pump.coalesce = pump_module.COALESCE  # else the pump's stop would wait out a 60 s pause
        assert b"partial" not in shown.shown[1]  # held until its line ends, or the file ends
        for i in range(50):  # then steady output
            os.write(writers[0], b"step %d\n" % i)
            time.sleep(0.002)
        assert shown.wait_for(0, b"step 49\n")
        for done in dones:  # the log writer's word: each file is complete
            done()
        closed = [events.get(timeout=5) for _ in paths]
        assert {(e.rank, e.stream) for e in closed} == {(0, Stream.STDOUT), (1, Stream.STDOUT)}
        assert all(isinstance(e, StreamClosed) for e in closed)
        assert shown.shown[1] == b"first line\npartial"
        assert shown.shown[0] == b"".join(b"step %d\n" % i for i in range(50))
    finally:
        pump.stop()
        for fd in writers:
            os.close(fd)


def watch_numbers(fd: int) -> set[int]:
    """The watch descriptors an inotify descriptor has now.  An instance
    numbers its watches on from the last it gave: a fresh one starts at 1."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return {int(m, 16) for m in re.findall(r"^inotify wd:([0-9a-f]+)", f.read(), re.M)}


def wait_until(check, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return check()


@pytest.mark.skipif(not os.path.exists("/proc/self/fdinfo") or portable.inotify() is None,
                    reason="inotify and /proc: Linux")
def test_the_pump_keeps_one_watch_and_lets_it_go_when_every_writer_is_gone(tmp_path):
    """One inotify descriptor serves every quiet spell (its watches removed
    and added again, never a new descriptor, whose close waits for the
    kernel); re-armed, it does not wake for what happened before; and once
    every writer is gone its watches are removed before the streams are
    said closed, and the descriptor is closed after ``stop``."""
    import queue

    events = queue.SimpleQueue()
    shown = Collector()
    before = inotify_descriptors()
    pump = pump_module.OutputPump(events, shown.show, coalesce=60.0)  # woken by the watch, never by a tick
    paths = [tmp_path / f"p{r}.log" for r in range(2)]
    writers = [os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND) for p in paths]
    inodes = {os.stat(p).st_ino for p in paths}
    try:
        dones = [pump.follow(str(path), rank, Stream.STDOUT)[1] for rank, path in enumerate(paths)]
        assert wait_until(lambda: inodes <= inotify_watched_inodes()), "the quiet files are not watched"
        ours = inotify_descriptors() - before
        assert len(ours) == 1
        (watch,) = ours
        first = watch_numbers(watch)
        assert len(first) == 2
        for i in range(3):  # three quiet spells, each ended by a line
            os.write(writers[i % 2], b"line %d\n" % i)
            assert shown.wait_for(i % 2, b"line %d\n" % i, within=5.0)
            assert wait_until(lambda: inodes <= inotify_watched_inodes()), "not watched again once quiet"
            assert inotify_descriptors() - before == ours
        # The same instance, its watches added again after each spell: a new
        # descriptor (whose close waits for the kernel) would number them from 1.
        again = watch_numbers(watch)
        assert len(again) == 2 and min(again) > max(first) + 2, (first, again)
        # Quiet and watched: the pump sleeps.  Had the removals' events been
        # left queued, the watch would wake it at once, round after round.
        cpu = portable.thread_cpu()[pump.thread.native_id]
        time.sleep(1.0)
        assert portable.thread_cpu()[pump.thread.native_id] - cpu < 0.2
        for done in dones:
            done()
        closed = [events.get(timeout=5) for _ in paths]
        assert all(isinstance(e, StreamClosed) for e in closed)
        assert not inodes & inotify_watched_inodes(), "still watched once every writer is gone"
    finally:
        pump.stop()
        for fd in writers:
            os.close(fd)
    assert wait_until(lambda: not inotify_descriptors() & ours), "the watch's descriptor was never closed"
    assert shown.shown == {0: b"line 0\nline 2\n", 1: b"line 1\n"}

def test_an_endless_line_is_shown_in_pieces_not_hoarded(tmp_path):
    import queue

    shown = Collector()
    pump = pump_module.OutputPump(queue.SimpleQueue(), shown.show)
    path = tmp_path / "bar.log"
    writer = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        pump.follow(str(path), 0, Stream.STDERR)
        for i in range(400):  # a progress bar redrawn with \r, never a newline
            os.write(writer, b"\rstep %06d of 400 [" % i + b"#" * 300 + b"]")
        assert shown.wait_for(0, b"\rstep 000")  # shown while the line goes on
        assert len(shown.shown[0]) > pump_module.LONGEST_LINE
    finally:
        pump.stop()
        os.close(writer)
