"""The stack dump on SIGUSR1 (jaxrun.child.watch.dumps), in real processes.

faulthandler's C handler, which the shim used to install, killed a process
whose threads ran Python within a few dozen dumps (bench/dumps.py: 0 of 3
runs survived, 32 asks median).  The rule: a dump never kills the process,
and it keeps faulthandler's shape, main thread first, which the launcher
reads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from fixtures import looked_at

from jaxrun.launcher.inspect import stacks as inspect_stacks
from jaxrun.reporting import stacks

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def start(tmp_path, *argv, cwd=None) -> tuple[subprocess.Popen, object]:
    err = tmp_path / "err"
    env = {**os.environ, "PYTHONPATH": ROOT}
    with open(err, "w") as f:
        child = subprocess.Popen([sys.executable, *map(str, argv)], stdout=subprocess.PIPE, stderr=f, env=env,
                                 text=True, cwd=cwd)
    return child, err


@pytest.mark.timeout(60)
def test_dumps_asked_every_millisecond_never_kill_a_process_whose_threads_run_python(tmp_path):
    child, err = start(tmp_path, looked_at.PATH, "jaxrun", 3)
    try:
        assert child.stdout.readline() == "ready\n"
        asks = looked_at.ask_until_gone(child)
        assert child.wait(timeout=30) == 0, err.read_text()[-2000:]
        assert child.stdout.read() == "survived\n"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()
    text = err.read_text()
    dumped = text.count("Current thread 0x")
    assert asks > 300 and dumped > 10, (asks, dumped)
    # Each dump: the main thread first, in the script; the busy threads after
    # it while they ran; the thread that writes the dump, and the handler,
    # left out.
    each = [inspect_stacks.threads("Current thread 0x" + part) for part in text.split("Current thread 0x")[1:]]
    assert all(dump[0][0].startswith("Current thread 0x") and dump[0][1][-1][2] == "<module>" for dump in each)
    busy = [dump for dump in each if len(dump) == 3]
    assert busy and all(any(f[2] == "busy" for f in frames) for dump in busy for _, frames in dump[1:]), each[0]
    assert "dumps.py" not in text


PARKED = """
import sys, time
from jaxrun.child.watch import dumps
dumps.install()  # as the shim does
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.parametrize("how", ["-m", "run_path"])
def test_a_dump_of_a_process_parked_in_c_is_whole_and_reads_as_faulthandlers(tmp_path, how):
    """The shape the launcher's readers parse: whole (dump_complete), also
    without the interpreter's entry frame that ``python -m`` (every way
    jaxrun starts a controller) gives, and the main thread's innermost frame
    in the user's file (user_frame)."""
    script = tmp_path / "parked_module.py"
    script.write_text(PARKED)
    run_path = f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')"
    child, err = start(tmp_path, *(["-m", "parked_module"] if how == "-m" else ["-c", run_path]), cwd=tmp_path)
    try:
        assert child.stdout.readline() == "ready\n"
        assert not stacks.dump_complete(err.read_text())
        child.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not stacks.dump_complete(err.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        text = err.read_text()
        assert stacks.dump_complete(text), text
        # Asked as soon as it said "ready": still in that print, or asleep after it.
        assert stacks.user_frame(text) in ((str(script), 5, "<module>", 'print("ready", flush=True)'),
                                           (str(script), 6, "<module>", "time.sleep(30)"))
        assert child.poll() is None  # alive, still asleep
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


IN_ONE_LONG_CALL = """
import hashlib, os, signal, sys, threading, time
from jaxrun.child.watch import dumps
mode = sys.argv[1]
sent, heard = [], []
if mode == "relayed":
    dumps.install()  # as the shim does
    dumps.relay(signal.SIGUSR2, lambda: heard.append(time.monotonic()))
else:  # Python's own handler, which the trace's ask had
    signal.signal(signal.SIGUSR2, lambda *_: heard.append(time.monotonic()))
if mode == "taken over":  # a script's own handler after jaxrun's: the signal is the script's alone
    dumps.install()
    dumps.relay(signal.SIGUSR2, lambda: heard.append(-1.0))
    signal.signal(signal.SIGUSR2, lambda *_: heard.append(time.monotonic()))
began = time.monotonic()
hashlib.pbkdf2_hmac("sha256", b"k", b"s", 50_000)
rate = 50_000 / (time.monotonic() - began)

def ask():
    for _ in range(2):  # a trace's start and its stop, while the main thread computes
        time.sleep(0.3)
        sent.append(time.monotonic())
        os.kill(os.getpid(), signal.SIGUSR2)

threading.Thread(target=ask).start()
hashlib.pbkdf2_hmac("sha256", b"k", b"s", int(rate * 3))  # about 3 s in C, the GIL let go, no signal checked
ended = time.monotonic()
time.sleep(0.5)
# How long the call went on after the last ask; the asks heard; those heard while it ran
# (Python's handler runs as the call returns, a moment before ``ended`` is read).
print(f"{ended - max(sent):.2f} {len(heard)} {sum(t < ended - 0.1 for t in heard)}", flush=True)
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["relayed", "python", "taken over"])
def test_each_ask_is_heard_at_once_while_the_main_thread_is_in_one_long_call(tmp_path, mode):
    """The trace's start and stop (SIGUSR2, relayed by ``dumps.relay``) reach
    their callback as they come, twice, while the main thread sits in C
    (a compile, a collective).  Python's own handler, shown for contrast,
    hears both late, as one: a trace that never stopped.  A script that
    installs its own handler after jaxrun's has the signal to itself."""
    script = tmp_path / "busy.py"
    script.write_text(IN_ONE_LONG_CALL)
    child, err = start(tmp_path, script, mode)
    try:
        out, _ = child.communicate(timeout=45)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err.read_text()
    after, count, during = out.split()
    assert float(after) > 0.3, out  # both asks came while the main thread was in the call
    assert (int(count), int(during)) == ((2, 2) if mode == "relayed" else (1, 0)), out
