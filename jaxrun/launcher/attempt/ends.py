"""The ends of an attempt's processes, and what the attempt came to.

Each end is written into its life's record as it is heard.  An end that
may be part of a stop jaxrun is about to hear of (a helper's, or a death by
SIGTERM, SIGINT or SIGHUP) is held for ``HOLD_WAIT`` before it counts as a
failure: a signal to the whole process tree reaches the helpers too.  A
recoverable job's failure that would spare the others is held for
``ECHO_WAIT``: process 0's end aborts every other process (the coordination
service goes with it), and the news of those aborts may come first, over
another host's channel.  Process 0's end, heard meanwhile, stops the job,
and the held ones are its consequences, not failures the others go on after.

The root cause is settled at the end, from evidence (``core.causes.settle``),
not from the order the ends arrived in; the Outcome carries it, with one
exit status (``core.outcome.exit_code``).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from jaxrun import contract
from jaxrun.core import causes
from jaxrun.core.events import Exited, ThreadDied
from jaxrun.core.outcome import Outcome, ProcessRecord, Stall, StopReason, Verdict, exit_code
from jaxrun.launcher.attempt.slots import Slots
from jaxrun.launcher.attempt.stop import StopSequence

# How long an end that may belong to a stop waits for the stop signal before
# it is taken for a failure.
HOLD_WAIT = 0.3
# How long a recoverable job's failure of a process other than 0 waits for
# process 0's end before the others go on without it.
ECHO_WAIT = 1.0


class Ends:
    def __init__(self, clock: Callable[[], float]):
        self.clock = clock
        self.heard: list[int] = []  # ranks that ended with a failure, in the order heard
        self.held: list[int] = []  # failures waiting out HOLD_WAIT for a stop signal (until hold_until)
        self.hold_until: float | None = None
        self.root_cause: int | None = None  # rank
        self.last_end: float | None = None  # when the last exit was heard (self.clock)

    def record(self, record: ProcessRecord, event: Exited, running: bool, spares: bool = False) -> bool:
        """Write the end into its record; True: a failure to judge now.
        ``running``: no stop is under way, so an end that may be one's is held;
        ``spares``: a failure would leave the others running, so it is held
        for process 0's end (``ECHO_WAIT``)."""
        self.last_end = self.clock()
        end = event.end
        record.returncode, record.ended_at = end.returncode, time.time()
        record.reaped_at, record.clock, record.lost = end.reaped_at, end.clock, end.lost
        if end.pid is not None:
            record.pid = end.pid  # the controller's own, now final
        if end.resources is not None:
            record.resources = end.resources
        record.marks = end.marks
        if end.returncode == 0:
            record.verdict = Verdict.OK
            return False
        self.heard.append(event.rank)
        if running and (spares or end.lost or contract.exit_status(end.returncode) - 128 in contract.STOP_SIGNALS):
            self.held.append(event.rank)  # its verdict waits for a stop signal or process 0's end, or the wait
            until = self.clock() + (ECHO_WAIT if spares else HOLD_WAIT)
            self.hold_until = until if self.hold_until is None else max(self.hold_until, until)
            return False
        return True

    def release(self) -> list[int]:
        """The held ends, to be judged now."""
        held, self.held, self.hold_until = self.held, [], None
        return held


def outcome(slots: Slots, stop: StopSequence, ends: Ends, *, recoverable: bool, spared: list[int],
            stall: Stall | None, fault: ThreadDied | None) -> Outcome:
    """What the attempt came to.  ``spared``: a recoverable job's processes
    that failed and were not started again, in order."""
    reason, root = stop.reason, ends.root_cause
    ran_out = recoverable and reason is None  # every process ran to its end
    if ran_out and spared:  # and some of their last lives failed
        reason, root = StopReason.FAILURE, spared[0]
    records = slots.records()
    if reason is StopReason.FAILURE and root is not None:
        root = causes.settle({r.spec.rank: r for r in records}, ends.heard, root)
    status = None if root is None else slots[root].record.exit_status
    for rec in records:
        if rec.pid is None:
            rec.verdict = Verdict.NOT_STARTED
    problems = [loss.line(rec.spec.rank) for rec in records for life in rec.lives for loss in life.losses]
    signal_stop = reason is StopReason.SIGNAL and None not in (stop.began, ends.last_end)
    return Outcome(records, exit_code(reason, stop.signum, status), reason, stop.signum, root,
                   fault=f"thread {fault.name} died: {fault.error}" if fault else None, log_errors=problems,
                   lost=stop.lost, stop_seconds=max(0.0, ends.last_end - stop.began) if signal_stop else None,
                   stall=stall, ran_out=ran_out, recoverable=recoverable)
