"""How an attempt stops, the same way whatever stops it.

A failure, a signal, ``--timeout``, a stall or jaxrun's own fault: ask the
survivors for a stack dump (SIGUSR1) or forward the signal, wait out one
deadline shared by all of them, then SIGKILL their process groups.  JAX
catches SIGTERM as a preemption notice and a process blocked in a
collective ignores it, so the SIGKILL is what actually ends a stuck job.
After SIGKILL, a process whose end is not confirmed within
``KILL_CONFIRM_WAIT`` (its waiter thread died, a remote host vanished) is
given up on.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

from jaxrun.core.backend import RunHooks
from jaxrun.core.outcome import StopReason, Verdict
from jaxrun.launcher.attempt.slots import Slots

# After a failure or a timeout, how long survivors get to write their stack dumps.
DUMP_WAIT = 0.5
TIMEOUT_DUMP_WAIT = 1.5
# After SIGKILL, how long a process's end may take to be confirmed before it
# is given up on (a local one ends at once; a remote one's host may be gone).
KILL_CONFIRM_WAIT = 5.0


class StopSequence:
    def __init__(self, slots: Slots, hooks: RunHooks, clock: Callable[[], float], note: Callable[[str], None]):
        self.slots, self.hooks, self.clock, self.note = slots, hooks, clock, note
        self.reason: StopReason | None = None  # why the attempt stops; None: it runs on
        self.signum: int | None = None  # a stop on a signal: which
        self.began: float | None = None  # when a stop on a signal began (self.clock)
        self.kill_at: float | None = None
        self.kill_sent = False  # SIGKILL went out: later exits are ours, not failures
        self.lost: list[int] = []  # ranks given up on after SIGKILL

    def begin(self, reason: StopReason, wait: float, signum: int | None) -> None:
        """Stop the attempt: ``signum`` to every survivor now, SIGKILL after ``wait``."""
        self.reason = reason
        self.hooks.stop_begun(wait)
        if signum is not None:
            self.send_all(signum)
        self.kill_at = self.clock() + wait

    def on_signal(self, signum: int, grace: float) -> None:
        self.signum, self.began = signum, self.clock()
        self.begin(StopReason.SIGNAL, grace, signum)

    def fault(self) -> None:
        """A launcher thread died: dumps, then SIGKILL soon, whatever stop was under way."""
        if self.reason is None or self.reason is StopReason.FAILURE:
            self.reason = StopReason.INTERNAL
            self.hooks.stop_begun(DUMP_WAIT)
            self.send_all(signal.SIGUSR1)
            self.kill_at = min(self.kill_at or float("inf"), self.clock() + DUMP_WAIT)

    def due(self, now: float) -> bool:
        """The kill's moment has come: SIGKILL, or give up on those that never
        confirmed theirs.  True: the attempt is over."""
        if self.kill_at is None or now < self.kill_at:
            return False
        if self.kill_sent:
            self._give_up()
            return True
        self.kill_survivors()
        return False

    def send_all(self, signum: int) -> None:
        ranks = self.slots.running()
        if self.slots.timeline is not None:  # a stack dump asked, a signal forwarded, SIGKILL
            self.slots.timeline.signalled(signum, ranks)
        for rank in ranks:
            self.slots[rank].child.send(signum)

    def kill_survivors(self) -> None:
        self.kill_sent = True
        self.send_all(signal.SIGKILL)
        self.kill_at = self.clock() + KILL_CONFIRM_WAIT

    def sweep(self) -> None:
        """SIGKILL to every group the attempt started: grandchildren left in one."""
        for child in self.slots.children():
            child.send(signal.SIGKILL)

    def _give_up(self) -> None:
        """SIGKILL went out long ago and these never confirmed their end."""
        self.lost = self.slots.running()
        for slot in (self.slots[rank] for rank in self.lost):
            slot.record.returncode, slot.record.ended_at, slot.record.verdict = \
                -signal.SIGKILL, time.time(), Verdict.STOPPED
            slot.ended()
        self.note(f"jaxrun: gave up waiting for process {','.join(map(str, self.lost))} "
                  f"{KILL_CONFIRM_WAIT:g} s after SIGKILL")
