"""What can stop a run from outside the event loop, for the whole run.

``RunControl`` lives from before the backend opens (SSH connections, a
preload server importing jax) to after the last attempt, and owns:

- the signal handlers: SIGINT, SIGTERM and SIGHUP ask the run to stop, at any
  stage; SIGUSR1 asks every process for a stack dump;
- the stop flag that every wait during start-up polls (``RunHooks.stopping``),
  so a signal, ``--timeout`` or a dead thread ends a start-up that hangs;
- the report of a launcher thread's death, as an event for the supervisor;
- the watchdog: once a stop has begun, jaxrun exits within the grace period
  plus ``WATCHDOG_SLACK``, whatever its own threads are doing.  Reaching the
  watchdog is a bug in jaxrun; it kills everything the run started and exits.

Signal handlers run in the main thread between two bytecodes, possibly inside
code that holds a lock, so they only set attributes, put on a SimpleQueue
(which is reentrant) and write to a pipe.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import threading
import time
from collections.abc import Callable

from jaxrun import contract
from jaxrun.core.backend import RunHooks
from jaxrun.core.deadline import NEVER, Deadline
from jaxrun.core.events import SignalReceived, ThreadDied
from jaxrun.core.outcome import INTERNAL_ERROR, StopReason, exit_code

# Beyond --grace (or a dump wait): SIGKILL, exits, the last output, a backend's
# clean-up.  A run still alive after this is stuck in jaxrun itself.
WATCHDOG_SLACK = 10.0


class RunControl:
    def __init__(self, grace: float, emergency: Callable[[str, int], None] | None = None,
                 slack: float = WATCHDOG_SLACK):
        self.grace, self.slack = grace, slack
        self.events: queue.SimpleQueue = queue.SimpleQueue()
        self.signum: int | None = None  # the first stop signal
        self.fault: ThreadDied | None = None  # the first launcher thread that died
        self.deadline: Deadline = NEVER  # the current attempt's --timeout
        self.hooks = RunHooks(stopping=self.stopping, thread_died=self.thread_died, stop_begun=self.arm)
        self.emergency = emergency  # the watchdog's last resort: (why, exit status)
        self._previous: dict[int, object] = {}
        self._alarm_r, self._alarm_w = os.pipe()
        os.set_blocking(self._alarm_w, False)
        self._watchdog: threading.Thread | None = None
        self._buffer = b""
        # An interactive session's say on SIGINT: True when it took the
        # signal (Ctrl-C meant for a statement), which then stops nothing.
        self.intercept: Callable[[int], bool] | None = None

    # -- the stop flag ----------------------------------------------------------
    def stopping(self) -> bool:
        return (self.signum is not None or self.fault is not None
                or self.deadline.passed())

    def stop_reason(self) -> StopReason | None:
        """Why the run is stopping, if it is: jaxrun's fault first, then a signal, then --timeout."""
        if self.fault is not None:
            return StopReason.INTERNAL
        if self.signum is not None:
            return StopReason.SIGNAL
        if self.deadline.passed():
            return StopReason.TIMEOUT
        return None

    def exit_status(self) -> int | None:
        """What a run that stopped before its processes ran exits with: the
        one exit-status rule (``core.outcome.exit_code``) with no process to blame."""
        reason = self.stop_reason()
        return None if reason is None else exit_code(reason, self.signum, None)

    def thread_died(self, name: str, error: BaseException) -> None:
        event = ThreadDied(name, f"{type(error).__name__}: {error}".rstrip(": "))
        self.events.put(event)  # first: whoever sees the flag finds the event queued
        if self.fault is None:
            self.fault = event
            self.arm(0.0)

    # -- signals ------------------------------------------------------------------
    def install(self) -> None:
        for signum in (*contract.STOP_SIGNALS, signal.SIGUSR1):
            # A stop signal that whoever started jaxrun ignores (``nohup``
            # SIGHUP) stays ignored, as ``python SCRIPT`` keeps it: a hangup
            # must not end a run started under nohup.  Its processes inherit
            # it so (the preloading server passes it on: server.IGNORED).
            if signum in contract.STOP_SIGNALS and signal.getsignal(signum) == signal.SIG_IGN:
                continue
            self._previous[signum] = signal.signal(signum, self._on_signal)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _on_signal(self, signum: int, _frame) -> None:
        if signum == signal.SIGINT and self.intercept is not None and self.intercept(signum):
            return
        self.events.put(SignalReceived(signum))
        if signum in contract.STOP_SIGNALS and self.signum is None:
            self.signum = signum
            self.arm(self.grace)

    # -- the watchdog -----------------------------------------------------------------
    def start_watchdog(self) -> None:
        self._watchdog = threading.Thread(target=self._watch, name="jaxrun-watchdog", daemon=True)
        self._watchdog.start()

    def arm(self, wait: float) -> None:
        """A stop has begun and may take ``wait`` seconds of its own (safe in
        a signal handler).  The first arming counts."""
        try:
            os.write(self._alarm_w, f"{wait:.3f}\n".encode())
        except OSError:
            pass  # already armed and the pipe is full, or the run is over

    def reset(self) -> None:
        """An attempt ended in time: stand down until the next stop begins."""
        try:
            os.write(self._alarm_w, b"reset\n")
        except OSError:
            pass

    def close(self) -> None:
        """The run is over: the watchdog stands down."""
        try:
            os.write(self._alarm_w, b"done\n")
        except OSError:
            pass
        if self._watchdog is not None:
            self._watchdog.join(timeout=1)
        os.close(self._alarm_w)
        os.close(self._alarm_r)

    def _watch(self) -> None:
        while True:
            line = self._read_line(None)
            if line == "done":
                return
            if line == "reset":
                continue
            allowed = float(line) + self.slack
            deadline = time.monotonic() + allowed
            while line is not None:  # later armings (a timeout, then a signal) do not move it
                line = self._read_line(max(0.0, deadline - time.monotonic()))
                if line in ("done", "reset"):
                    break
            if line == "done":
                return
            if line is None:
                break
        why = f"jaxrun was still running {allowed:.0f} s after the stop began"
        if self.emergency is not None:
            self.emergency(why, self.exit_status() or INTERNAL_ERROR)

    def _read_line(self, timeout: float | None) -> str | None:
        """The next message from ``arm``/``close``; None when the time is up."""
        buffered = self._buffer
        while b"\n" not in buffered:
            ready, _, _ = select.select([self._alarm_r], [], [], timeout)
            if not ready:
                return None
            try:
                chunk = os.read(self._alarm_r, 4096)
            except OSError:
                return "done"
            if not chunk:
                return "done"
            buffered += chunk
        line, _, self._buffer = buffered.partition(b"\n")
        return line.decode()
