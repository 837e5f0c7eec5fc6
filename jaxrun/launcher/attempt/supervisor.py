"""The loop that watches one attempt of a job until every process is gone.

Threads only produce typed events (see :mod:`jaxrun.core.events`): one waiter
per child, signal handlers, the children's ``News``, and the output pump
(which also draws the console view itself, and reports only the end of each
stream).  ``Supervisor.run`` is the single consumer.  It moves each
process's slot (``attempt.slots``) and hands the rest to its parts:

- ``attempt.start``: one life of one process (files, spawn, pumps, waiter);
- ``attempt.stop``: the stop sequence (dump or forward, one deadline, SIGKILL);
- ``attempt.ends``: each end into its record, the held ends, the outcome;
- ``attempt.joins`` and ``attempt.activity``: the start-up's joins and the
  stall watchdog;
- ``restarts.policy``: what a failed process means: stop the attempt, or,
  in a recoverable job, go on without it or start it again alone.

Nothing here waits without a bound.  Start-up waits poll the run's stop flag
(a signal, ``--timeout``, a dead launcher thread: ``core.backend.Interrupted``).
A launcher thread that dies is an event like any other: the job is stopped
and the summary names the thread.
"""

from __future__ import annotations

import os
import queue
import signal
import time
from collections.abc import Callable, Sequence

from jaxrun.core.backend import Backend, Interrupted, RunHooks
from jaxrun.core.deadline import NEVER, Deadline
from jaxrun.core.events import (
    Activity,
    Exited,
    Forward,
    Joined,
    LogWriteFailed,
    SignalReceived,
    StreamClosed,
    ThreadDied,
)
from jaxrun.core.logfiles import prepare_log_dir
from jaxrun.core.outcome import Outcome, Stall, StopReason, Verdict
from jaxrun.core.spec import ProcessSpec
from jaxrun.launcher.attempt import ends as ending
from jaxrun.launcher.attempt.activity import ActivityWatch
from jaxrun.launcher.attempt.joins import SAY_JOINED_AFTER, Joins
from jaxrun.launcher.attempt.profiling import Profiler
from jaxrun.launcher.attempt.slots import Slots
from jaxrun.launcher.attempt.start import Starter
from jaxrun.launcher.attempt.stop import DUMP_WAIT, TIMEOUT_DUMP_WAIT, StopSequence
from jaxrun.launcher.output.logwriter import LogWriter
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.launcher.output.pump import OutputPump
from jaxrun.launcher.output.timeline import Timeline
from jaxrun.launcher.restarts.policy import Answer, Engine, ProcessEnd, RestartPolicy
from jaxrun.reporting import diagnosis

# How long pumps may keep reading after every process is gone (grandchildren
# holding a pipe open are killed with their group before this).
DRAIN_WAIT = 5.0


class Supervisor:
    def __init__(self, specs: Sequence[ProcessSpec], backend: Backend, printer: ConsolePrinter, log_dir: str, *,
                 grace: float = 30.0, deadline: Deadline = NEVER, clock: Callable[[], float] = time.monotonic,
                 events: queue.SimpleQueue | None = None, hooks: RunHooks | None = None,
                 stall_timeout: float = 0.0, policy: RestartPolicy | None = None, timeline: Timeline | None = None,
                 profiler: Profiler | None = None):
        self.specs, self.backend, self.printer, self.log_dir = list(specs), backend, printer, log_dir
        self.grace = grace
        # --timeout, made by the run loop before the attempt was placed (on
        # this clock): the start-up waits and the loop give up at one moment.
        self.limit = deadline
        self.clock = clock
        self.events = events if events is not None else queue.SimpleQueue()
        # A thread that dies reports here; the run loop's hooks also let
        # start-up waits give up on a signal or --timeout.
        self.hooks = hooks or RunHooks(thread_died=lambda name, error: self.events.put(
            ThreadDied(name, f"{type(error).__name__}: {error}")))
        self.policy = policy or RestartPolicy(0, Engine(backend.name, False), recoverable=False)  # fail fast
        self.stall_timeout = stall_timeout
        self.profiler = profiler  # the run's traces (jaxrun profile, --profile), attached to this attempt
        self.slots = Slots(self.specs, log_dir, timeline)
        self.stop = StopSequence(self.slots, self.hooks, clock, printer.note)
        self.ends = ending.Ends(clock)
        self.fault: ThreadDied | None = None  # a dead launcher thread
        self.stall_found: Stall | None = None
        self.joins: Joins | None = None  # made when the run starts, as the activity watch is
        self.activity: ActivityWatch | None = None
        self.starter: Starter | None = None

    def joins_settled(self) -> bool:
        """The start-up's joins are over (their last line is out)."""
        return self.joins is not None and not self.joins.active

    # -- the loop -------------------------------------------------------------------
    def run(self) -> Outcome:
        """Start every process, watch them to the end; the backend's
        ``begin_attempt`` is part of the start, and ``end_attempt`` is the caller's."""
        self.pump = OutputPump(self.events, self.printer.write, self.printer.flush, hooks=self.hooks)
        self.writer = LogWriter(self.events, hooks=self.hooks, processes=len(self.specs))
        self.pump.yield_to = self.writer.busy
        self.joins = Joins(self.specs, self.printer.status, self.printer.note, live=self.printer.can_show_status(),
                           clock=self.clock, on_join=self._joined,
                           say_after=None if self.printer.quiet else SAY_JOINED_AFTER)
        self.activity = ActivityWatch(self.specs, self.stall_timeout, self.clock, self.printer.note,
                                      {slot.rank: slot.record.stderr_log for slot in self.slots},
                                      on_heard=lambda rank, state: self.slots[rank].activity(state))
        lifeline_r, lifeline_w = os.pipe()
        self.starter = Starter(self.backend, self.printer, self.pump, self.writer, self.log_dir, self.events,
                               self.hooks, self.joins, self.activity, lifeline_r, self.clock)
        if self.profiler is not None:
            self.profiler.attach(self.specs, self.log_dir, self.events, self.backend, self.hooks, self.printer.note)
        try:
            self._start()
            self._loop()
            self._drain()
        finally:
            if self.profiler is not None:
                self.profiler.detach()
            self.stop.sweep()  # grandchildren left in a group
            self.joins.finish()
            self.activity.finish()
            os.close(lifeline_r)
            os.close(lifeline_w)
            self.writer.stop()
            self.pump.stop()
        outcome = ending.outcome(self.slots, self.stop, self.ends, recoverable=self.policy.recoverable,
                                 spared=self.policy.failed, stall=self.stall_found, fault=self.fault)
        outcome.stills = tuple(self.activity.stills)  # the run's goodput: spans no process moved in
        outcome.straggler = self.activity.stragglers.straggler()  # the time account's rule, over the whole attempt
        outcome.splits, outcome.windows = self.activity.splits(), list(self.activity.stragglers.windows)
        return outcome

    def _joined(self, rank: int, recoverable: bool) -> None:
        """A join, heard from its file or its far end (``Joins``)."""
        self.slots[rank].joined()
        if self.profiler is not None:
            self.profiler.joined(rank)
        heard = self.policy.joined(rank, recoverable)
        self._say(heard.line)
        if heard.turned:
            self.backend.job_is_recoverable()  # a gang's task agents obey the policy's word

    def _say(self, line: str | None) -> None:
        if line:
            self.printer.note(line)

    def _start(self) -> None:
        self._say(self.policy.begin_attempt(len(self.specs)))
        try:
            self.backend.begin_attempt(self.specs, self.log_dir)  # bad input raises before any file is made
            prepare_log_dir(self.log_dir)
            self.joins.begin()
            show_at = self.clock()
            for slot in self.slots:
                if self.hooks.stopping():
                    raise Interrupted()
                if self.clock() >= show_at:  # a long start (many processes) shows its joins too
                    show_at = self.joins.tick() or float("inf")
                self.starter.start(slot)
        except Interrupted:
            # A signal, --timeout or a dead thread cut the start short: act on
            # it now (the loop below only runs while processes do).
            while True:
                try:
                    self._handle(self.events.get_nowait())
                except queue.Empty:
                    break
            if self.stop.reason is None:
                self._stop(StopReason.TIMEOUT, TIMEOUT_DUMP_WAIT, signal.SIGUSR1)

    def _loop(self) -> None:
        # The joins and the activity are looked at when they said to be, not
        # at every event: each look reads a file of every process, and a job
        # of N processes sends events in proportion to N.
        show_at: float | None = 0.0
        stall_at: float | None = 0.0
        while self.slots.any_running() or self.ends.held:
            now = self.clock()
            if show_at is not None and now >= show_at:
                show_at = self.joins.tick()
            if self.ends.hold_until is not None and now >= self.ends.hold_until:
                self._judge_held()
                continue  # the last held end may have been all that kept the loop going
            if self.stop.due(now):
                break
            deadline = self.limit.at if self.stop.reason is None else None
            if deadline is not None and now >= deadline:
                self._stop(StopReason.TIMEOUT, TIMEOUT_DUMP_WAIT, signal.SIGUSR1)
            if self.stop.reason is not None:
                stall_at = None
            elif stall_at is not None and now >= stall_at:
                stall_at = self._watch_activity()
            wake = [t for t in (self.stop.kill_at, deadline, show_at, self.ends.hold_until, stall_at)
                    if t is not None]
            try:
                event = self.events.get(timeout=max(0.0, min(wake) - now) if wake else None)
            except queue.Empty:
                continue
            self._handle(event)
            if isinstance(event, Joined) and show_at is not None:
                show_at = now  # the line says it at once

    def _handle(self, event) -> None:
        if isinstance(event, Exited):
            self._on_exit(event)
        elif isinstance(event, SignalReceived):
            self._on_signal(event.signum)
        elif isinstance(event, StreamClosed):
            self.starter.open_streams -= 1
        elif isinstance(event, Forward):
            if self.stop.reason is None:
                self.stop.send_all(event.signum)
        elif isinstance(event, Joined):
            self.joins.joined(event.rank, event.recoverable)
        elif isinstance(event, Activity):
            self.activity.heard(event.rank, event.state)  # and through it, the slot
        elif isinstance(event, ThreadDied):
            self._on_fault(event)
        elif isinstance(event, LogWriteFailed):
            self.printer.note(f"jaxrun: cannot write {event.path}: {event.error}; process {event.rank} goes on, "
                              "and what it writes there from now on is not kept (the summary says how much)")

    # -- ends and verdicts ------------------------------------------------------------
    def _on_exit(self, event: Exited) -> None:
        self.pump.wake()
        self.joins.ended(event.rank)
        self.activity.ended(event.rank)
        slot = self.slots[event.rank]
        judge = self.ends.record(slot.record, event, running=self.stop.reason is None,
                                 spares=self.policy.spares_others(event.rank))
        slot.ended()  # its end is in its record: the timeline's line holds it
        if judge:
            self._judge(event.rank)

    def _judge(self, rank: int) -> None:
        """The verdict on a failure, by what the attempt was doing when it was heard."""
        record = self.slots[rank].record
        if self.stop.reason is None:
            answer = self._decide(rank)
            if answer is Answer.STOP:  # the first failure, or process 0's after a recoverable job's first
                first = self.policy.failed[0] if self.policy.failed else rank
                record.verdict = Verdict.ROOT_CAUSE if first == rank else Verdict.CONSEQUENCE
                self.ends.root_cause = first
                self._stop(StopReason.FAILURE, DUMP_WAIT, signal.SIGUSR1)
            elif answer is Answer.GO_ON:
                record.verdict = Verdict.ROOT_CAUSE if self.policy.failed[0] == rank else Verdict.FAILED_ALONE
        elif self.stop.reason is StopReason.FAILURE and not self.stop.kill_sent:
            record.verdict = Verdict.CONSEQUENCE
        else:
            record.verdict = Verdict.STOPPED

    def _decide(self, rank: int) -> Answer:
        """Ask the restart policy about a failed process, and act on its answer."""
        record = self.slots[rank].record
        end = ProcessEnd(rank)
        if self.policy.spares_others(rank):  # only then do its logs matter now
            fingerprint, failure = diagnosis.run_failure(record)
            end = ProcessEnd(rank, fingerprint, failure, diagnosis.where(record), diagnosis.describe_exit(record))
        decision = self.policy.decide(end)
        if decision.why:
            self.printer.note(f"jaxrun: {decision.why}")
        if decision.answer is not Answer.START_ALONE:
            return decision.answer
        slot = self.slots[rank]
        again = slot.next_life(self.log_dir)
        self.activity.again(rank, again.stderr_log)
        try:
            self.starter.start(slot)
            return Answer.START_ALONE
        except Exception as error:  # noqa: BLE001 -- a spawn's failure (a host gone) ends its lives
            slot.back_to(record)
            self.activity.ended(rank)
            self.printer.note(f"jaxrun: {self.policy.cannot_start(rank, f'{type(error).__name__}: {error}')}")
            record.verdict = Verdict.ROOT_CAUSE if self.policy.failed[0] == rank else Verdict.FAILED_ALONE
            return Answer.START_ALONE

    def _judge_held(self) -> None:
        for rank in self.ends.release():
            self._judge(rank)

    # -- stops ----------------------------------------------------------------------------
    def _stop(self, reason: StopReason, wait: float, signum: int | None) -> None:
        self.stop.begin(reason, wait, signum)
        # The ends held meanwhile are part of this stop: a stop signal's, or a
        # failure's consequences (the others that process 0's end aborted).
        self._judge_held()

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGUSR1:
            self.stop.send_all(signal.SIGUSR1)
        elif self.stop.reason is StopReason.SIGNAL and signum == signal.SIGINT:
            self.stop.kill_survivors()  # a second Ctrl-C: no more grace
        elif self.stop.reason is None:
            self.stop.on_signal(signum, self.grace)
            self._judge_held()

    def _on_fault(self, event: ThreadDied) -> None:
        """A launcher thread died: nothing it was doing can be trusted to
        finish (an exit never reported, a pipe never read), so the job stops."""
        if self.fault is None:
            self.fault = event
            self.printer.note(f"jaxrun: internal error: thread {event.name} died: {event.error}")
        self.stop.fault()

    def _watch_activity(self) -> float | None:
        """The stall watchdog's turn: a probe (every stack dumped), or the
        stall itself, which stops the job; when to look again."""
        wake, action = self.activity.tick()
        if action == "probe":
            self.stop.send_all(signal.SIGUSR1)
        elif isinstance(action, Stall):  # the probe's dumps are in the logs: no second one, no wait for one
            self.stall_found = action
            self._stop(StopReason.STALL, 0.0, None)
        return wake

    def _drain(self) -> None:
        """Print what the pumps still hold; pipes close once the groups are dead."""
        self.stop.sweep()
        self.pump.finish()  # no pause holds back the last bytes
        end = time.monotonic() + DRAIN_WAIT  # real time: the pump runs in real time
        # After a launcher thread died, the streams still close if the two
        # threads that close them live: their last bytes are the user's.  If
        # one of those died, its streams never close, so nobody waits for them.
        carriers = (self.pump.thread, self.writer.thread)
        while self.starter.open_streams > 0 and all(thread.is_alive() for thread in carriers):
            try:
                event = self.events.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            self._handle(event)
