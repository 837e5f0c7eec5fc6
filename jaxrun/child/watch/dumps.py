"""Stack dumps on the launcher's ask (SIGUSR1), taken where they cannot
crash the process.

faulthandler's dump on a signal reads every thread's frames inside the C
handler, without the GIL, while the other threads go on.  On CPython 3.11 a
thread that runs Python at that moment (a frame pushed or popped, a call
from C back into Python) hands the reader a frame that is not whole, and
the process dies of SIGSEGV; the thread that took the signal can be that
thread too.  ``bench/dumps.py`` sends dumps to a process with two threads
busy in Python: faulthandler's handler took it down in seconds, this one
never did.  A job must never die of being looked at.

So the handler is Python's own.  Its C half writes the signal's number to
the wakeup fd, a pipe of ours; a thread of ours, asleep on that pipe
without the GIL, wakes and writes the dump holding the GIL, when every
other thread stands between two bytecodes or in C with the GIL let go: each
thread's frames are whole.  A main thread blocked in C++ (a collective,
JAX's shutdown barrier) lets the GIL go, so it is dumped as before.  What
this gives up: a process whose stuck thread holds the GIL (C code that
never lets it go) writes no dump, and the launcher says none came.

The dump has faulthandler's shape, which the launcher's readers parse
(``reporting/stacks.py``, ``launcher/inspect/stacks.py``): the main thread
first as the ``Current thread``, then the others, innermost frame first, at
most 100 frames and 100 threads, and a blank line after the last; the
dumping thread itself is left out.
It goes straight to fd 2 in one write where the kernel allows (the main
thread may hold ``sys.stderr``'s lock), and then whatever asked to follow
each dump (the flight recorder's block) is written.

A script that takes the wakeup fd for its own use (asyncio's
``add_signal_handler``) leaves the thread asleep: then the Python handler,
run in the main thread when it next runs Python code, sees that no dump
came and writes it itself.  At the interpreter's end SIGUSR1 is ignored
again (Python would restore its default, which ends the process), as
faulthandler left it: a dump asked for in a clean exit's last moments
must not turn exit 0 into a signal.

The same pipe carries the launcher's other asks (:func:`relay`: the trace's
SIGUSR2): the C half writes one byte for each signal delivered, so each ask
reaches its callback in our thread at once, while the main thread sits in
a compile or a collective.  Python's own handler runs once for all the
signals that came during one long call, so two asks (a trace's start and
its stop) would have been heard as one, late.
"""

from __future__ import annotations

import _signal as signal  # not signal's enums: contract.STOP_SIGNALS says why
import atexit
import os
import sys
import threading
import time

MAX_FRAMES = 100  # faulthandler's limits
MAX_THREADS = 100
FALLBACK_WAIT = 0.25  # seconds the main thread waits for our thread's dump before writing its own

_after: list = []  # called after each dump, in the dumping thread
_lock = threading.RLock()  # one dump at a time (the main thread's may interrupt its own)
_asks: dict = {signal.SIGUSR1: lambda: dump()}  # signal number: what each one of it asks for
_woken: dict = {}  # per signal: how many our thread has read from the wakeup pipe
_heard: dict = {}  # per signal: how many times the main thread's handler has run for it


def install() -> None:
    """Take SIGUSR1 as the ask for a dump.  From the main thread, before the script."""
    atexit.register(_ignore_from_now_on)
    signal.signal(signal.SIGUSR1, _heard_in_main)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    os.set_inheritable(read_fd, False)
    os.set_inheritable(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_serve, args=(read_fd,), name="jaxrun-dumps", daemon=True).start()


def after_each(write) -> None:
    """Call ``write()`` after each dump (in the dumping thread)."""
    _after.append(write)


def relay(signum: int, ask) -> None:
    """Call ``ask()`` once for each ``signum`` delivered, in our thread (in
    the main thread where the script took the wakeup fd).  After
    :func:`install`, from the main thread."""
    _asks[signum] = ask
    signal.signal(signum, _heard_in_main)


def _serve(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 64)
        except OSError:
            return
        if not data:
            return
        for signum, ask in list(_asks.items()):
            count = data.count(signum)
            _woken[signum] = _woken.get(signum, 0) + count
            if count and signal.getsignal(signum) is not _heard_in_main:
                continue  # the script took the signal over: it is its own now
            if signum == signal.SIGUSR1:
                count = min(count, 1)  # one dump shows all a burst of asks would
            for _ in range(count):
                _call(ask)


def _call(ask) -> None:
    try:
        ask()
    except Exception:  # noqa: BLE001 - one ask that fails must not end our thread
        pass


def _heard_in_main(signum, frame) -> None:
    """The Python handler of each signal we serve, run in the main thread.
    Our thread has almost always served it by now; where it was not woken
    (the wakeup fd taken by the script), it is served from here."""
    _heard[signum] = _heard.get(signum, 0) + 1
    deadline = time.monotonic() + FALLBACK_WAIT
    while _woken.get(signum, 0) < _heard[signum]:
        if time.monotonic() > deadline:
            _woken[signum] = _heard[signum]
            _call(_asks[signum])
            return
        time.sleep(0.005)


def heard() -> int:
    """How many times the main thread's handler has run so far, all signals
    together: its CPU while it ran (waiting for our thread, 5 ms at a time)
    is jaxrun's, and a sampler that sees it change leaves that CPU out."""
    return sum(_heard.values())


HANDLER = _heard_in_main.__code__  # on the main thread's stack while an ask is served: not the script's


def _ignore_from_now_on() -> None:
    """At the interpreter's end, Python gives each signal it handled its
    default back, which ends the process: an ask that late is ignored."""
    for signum in _asks:
        signal.signal(signum, signal.SIG_IGN)


def dump() -> None:
    """Write every thread's stack to fd 2, then what follows each dump."""
    with _lock:
        write(text())
        for then in _after:
            try:
                then()
            except Exception:  # noqa: BLE001 - a block that fails must not stop the next dump
                pass


def write(text: str) -> None:
    data = text.encode("utf-8", "backslashreplace")
    while data:
        try:
            data = data[os.write(2, data):]
        except InterruptedError:
            continue
        except OSError:
            return


def text(frames: dict | None = None, main: int | None = None, skip: int | None = None) -> str:
    """Every thread's stack in faulthandler's shape, the main thread first."""
    frames = sys._current_frames() if frames is None else frames
    main = threading.main_thread().ident if main is None else main
    skip = threading.get_ident() if skip is None else skip
    order = [main] if main in frames else []
    order += [ident for ident in frames if ident not in (main, skip)]
    blocks = []
    for count, ident in enumerate(order):
        if count >= MAX_THREADS:
            blocks.append("...\n")
            break
        head = "Current thread" if ident == main else "Thread"
        blocks.append(f"{head} 0x{ident:016x} (most recent call first):\n" + _stack(frames[ident]))
    return "\n".join(blocks) + "\n"  # a blank line ends it: whole, whatever ran the script


def _stack(frame) -> str:
    while frame is not None and frame.f_code is HANDLER:
        frame = frame.f_back  # our handler, waiting for our thread's dump: not where the thread was
    if frame is None:
        return "  <no Python frame>\n"
    lines = []
    while frame is not None:
        if len(lines) >= MAX_FRAMES:
            lines.append("  ...\n")
            break
        code = frame.f_code
        line = frame.f_lineno
        lines.append(f'  File "{_ascii(code.co_filename)}", line {"???" if line is None else line} '
                     f"in {_ascii(code.co_name)}\n")
        frame = frame.f_back
    return "".join(lines)


def _ascii(name: str) -> str:
    return name.encode("ascii", "backslashreplace").decode("ascii")
