"""Child side of the stall watchdog (``--stall-timeout``): is this process
making progress?

A thread of the shim's looks at the process every ``interval`` seconds
(a tenth of the stall timeout, at most ``MAX_INTERVAL``) and asks whether
anything moved since its last look.  Progress is any of:

- CPU time: the process (every thread: XLA's executing a program or a
  compile, Python's data loading) or one of the processes it started (a
  ``gsutil cp`` it waits for) used at least ``BUSY_SHARE`` of a core.  A
  process that waits in a collective, in ``time.sleep`` or on a lock uses
  well under 1% (JAX's own background threads included);
- I/O: at least ``BUSY_IO`` bytes read or written, files and sockets alike
  (a checkpoint save, a download), where the system counts them;
- the main thread's stack changed: it moved to another line;
- the main thread is inside JAX's compiler or its ``initialize()``: a long
  compile is work, and a join waits for the others under JAX's own timeout;
- the script said so: ``jaxrun.alive()``, for a long phase that shows none
  of the above.

The looks cost a few microseconds each, once per interval; nothing is
hooked, so the script's own calls run as fast as without jaxrun.

What the launcher hears is only the changes: the file
``contract.ACTIVITY_FILE`` holds ``busy`` or ``idle`` (``contract``'s
words), rewritten whole (a new file renamed over the old) each time the
state changes.  The launcher reads it, or the far-end agent does and sends
the change home.  Where each process waits is not reported here: when
every process has been idle for the stall timeout, the launcher asks for
stack dumps (SIGUSR1), which say it.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from jaxrun import contract, portable

MAX_INTERVAL = 5.0
MIN_INTERVAL = 0.05
BUSY_SHARE = 0.05  # of one core, over an interval
BUSY_IO = 64 * 1024  # bytes per interval
# Frames of JAX's that are work, or a wait that JAX bounds itself.
_BUSY_FILES = (os.sep + os.path.join("jax", "_src", "compiler.py"),)
_JOIN_FILE = os.sep + os.path.join("jax", "_src", "distributed.py")

_beats = 0
_started: Sampler | None = None


def alive() -> None:
    """Tell jaxrun's stall watchdog that this process is making progress:
    for a long phase that uses no CPU, no I/O and stays on one line (a wait
    on a slow external service, say).  Cheap enough to call in any loop."""
    global _beats
    _beats += 1


def interval_for(stall_timeout: float) -> float:
    return min(MAX_INTERVAL, max(MIN_INTERVAL, stall_timeout / 10))


def main_stack(main: int) -> tuple:
    """The main thread's frames as (code, line) pairs, innermost first."""
    frame = sys._current_frames().get(main)
    stack = []
    while frame is not None:
        stack.append((frame.f_code, frame.f_lineno))
        frame = frame.f_back
    return tuple(stack)


def children_cpu() -> dict[int, float]:
    """CPU seconds of each process this one started and that still runs
    (grandchildren too): a tool the script waits for works for it."""
    import psutil  # here: the sampler's thread pays for the import, not the script's start

    used = {}
    try:
        kids = psutil.Process().children(recursive=True)
    except psutil.Error:
        return used
    for kid in kids:
        try:
            times = kid.cpu_times()
        except psutil.Error:
            continue
        used[kid.pid] = times.user + times.system
    return used


def busy_place(stack: tuple) -> bool:
    """Inside JAX's compiler, or in its ``initialize()`` (waiting for the others to join)."""
    for code, _ in stack:
        name = code.co_filename
        if name.endswith(_BUSY_FILES) or (name.endswith(_JOIN_FILE) and code.co_name == "initialize"):
            return True
    return False


class Sampler:
    """The sampler: its thread, its last look, and the state last written."""

    def __init__(self, path: str, interval: float, clock=time.monotonic, cpu=time.process_time,
                 io=portable.io_bytes, stack=None, children=None):
        self.path, self.interval = path, interval
        self.clock, self.cpu, self.io = clock, cpu, io
        main = threading.main_thread().ident
        self.stack = stack or (lambda: main_stack(main))
        self.children = children or children_cpu
        self.state: str | None = None
        self.lock = threading.Lock()  # FINISHED is the last word: no look after it writes over it
        self.finished = False
        self.last = self._look()

    def _look(self) -> tuple:
        return self.clock(), self.cpu(), self.io(), self.stack(), _beats, self.children()

    def moved(self) -> bool:
        """Whether the process made progress since the last look."""
        (t0, cpu0, io0, stack0, beats0, kids0), now = self.last, self._look()
        self.last = now
        t, cpu, io, stack, beats, kids = now
        enough = BUSY_SHARE * max(t - t0, 1e-9)
        if cpu - cpu0 >= enough or beats != beats0 or stack != stack0:
            return True
        if any(used - kids0.get(pid, 0.0) >= enough for pid, used in kids.items()):
            return True
        if io is not None and io0 is not None and io - io0 >= BUSY_IO:
            return True
        return busy_place(stack)

    def write(self, state: str) -> None:
        with self.lock:
            if state == self.state or self.finished:
                return
            self.state = state
            self.finished = state == contract.FINISHED
            try:
                contract.write_private(self.path, state.encode() + b"\n")
            except OSError:
                pass  # a hint: the launcher then keeps the state it heard last

    def run(self) -> None:
        self.write(contract.BUSY)
        while not self.finished:
            time.sleep(self.interval)
            self.write(contract.BUSY if self.moved() else contract.IDLE)


def script_returned() -> None:
    """The script returned: the process says FINISHED, and its sampler stops."""
    if _started is not None:
        _started.write(contract.FINISHED)


def start(environ=os.environ) -> Sampler | None:
    """Start the sampler if the launcher asked for one (``--stall-timeout``)."""
    global _started
    path, timeout = environ.get(contract.ACTIVITY_FILE), environ.get(contract.STALL_TIMEOUT)
    if not path or not timeout or _started is not None:
        return _started
    try:
        seconds = float(timeout)
    except ValueError:
        return None
    if seconds <= 0:
        return None
    _started = Sampler(path, interval_for(seconds))
    threading.Thread(target=_started.run, name="jaxrun-activity", daemon=True).start()
    return _started
