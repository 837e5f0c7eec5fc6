"""The event loop that watches one attempt of a job until every process is gone.

Threads only produce typed events (see :mod:`jaxrun.core.events`): one waiter
per child, signal handlers, the children's ``News``, and the output pump
(which also draws the console view itself, and reports only the end of each
stream).  The loop in ``Supervisor.run`` is the single consumer and the only
place that decides anything.

Every child keeps the Child contract (:mod:`jaxrun.core.backend`), and the
supervisor asks it nothing else: its exit and resources come from ``wait``,
its join and its changes between busy and idle as ``Joined`` and
``Progress`` events (or, for a child that does not report them, from the
joined and activity files it watches), its error record in the error file it
named; what a backend sends in-band on a pipe, the child's own
``stream_filter`` takes out on the pump's thread.

Stopping is the same in every case (a failure, a signal, ``--timeout``, a stall
that the loop's ``launcher.attempt.activity`` watch found): ask
the survivors for a stack dump or forward the signal, wait out a deadline
shared by all of them, then SIGKILL their process groups.  JAX catches SIGTERM
as a preemption notice and a process blocked in a collective ignores it, so
the SIGKILL is what actually ends a stuck job.

Nothing here waits without a bound.  Start-up waits poll the run's stop flag
(a signal, ``--timeout``, a dead launcher thread: ``core.backend.Interrupted``).
After SIGKILL, a process whose end is not confirmed within
``KILL_CONFIRM_WAIT`` (its waiter thread died, a remote host vanished) is
given up on.  A launcher thread that dies is an event like any other: the job
is stopped and the summary names the thread.

The root cause is settled at the end, from evidence (``core.causes.settle``).
An end that may be part of a stop jaxrun is about to hear of (a helper's, or a
death by SIGTERM, SIGINT or SIGHUP) is held for ``HOLD_WAIT`` before it counts
as a failure: a signal to the whole process tree reaches the helpers too.

In a recoverable job (``launcher.restarts.recovery``) a failed process other than 0
stops nothing: the others go on, and it may start again alone.
"""

from __future__ import annotations

import errno
import os
import queue
import signal
import time
from collections.abc import Callable, Sequence

from jaxrun import contract
from jaxrun.core import causes, events as ev
from jaxrun.core.backend import Backend, Child, Interrupted, News, RunHooks, StreamFilter, start_thread
from jaxrun.core.deadline import NEVER, Deadline
from jaxrun.core.events import Exited, Forward, Joined, LogWriteFailed, SignalReceived, Stream, StreamClosed, ThreadDied
from jaxrun.core.logfiles import folder_is_full, log_paths, open_log, open_pumped_log, prepare_log_dir
from jaxrun.core.outcome import Outcome, ProcessRecord, Stall, StopReason, Verdict, exit_code
from jaxrun.core.spec import ProcessSpec
from jaxrun.launcher.attempt.activity import ActivityWatch, activity_path
from jaxrun.launcher.attempt.joins import Joins, joined_path
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.launcher.output.pump import OutputPump, enlarge_pipe
from jaxrun.launcher.restarts.recovery import Recovery, next_life
from jaxrun.reporting import diagnosis

# After a failure or a timeout, how long survivors get to write their stack dumps.
DUMP_WAIT = 0.5
TIMEOUT_DUMP_WAIT = 1.5
# How long pumps may keep reading after every process is gone (grandchildren
# holding a pipe open are killed with their group before this).
DRAIN_WAIT = 5.0
# After SIGKILL, how long a process's end may take to be confirmed before it
# is given up on (a local one ends at once; a remote one's host may be gone).
KILL_CONFIRM_WAIT = 5.0
# How long an end that may belong to a stop (see above) waits for the stop
# signal before it is taken for a failure.
HOLD_WAIT = 0.3


class Supervisor:
    def __init__(
        self,
        specs: Sequence[ProcessSpec],
        backend: Backend,
        printer: ConsolePrinter,
        log_dir: str,
        *,
        grace: float = 30.0,
        deadline: Deadline = NEVER,
        clock: Callable[[], float] = time.monotonic,
        events: queue.SimpleQueue | None = None,
        hooks: RunHooks | None = None,
        stall_timeout: float = 0.0,
        recovery: Recovery | None = None,
    ):
        self.specs, self.backend, self.printer, self.log_dir, self.grace = list(specs), backend, printer, log_dir, grace
        # --timeout, made by the run loop before the attempt was placed (on
        # this clock): the start-up waits and the loop give up at one moment.
        self.limit = deadline
        self.clock = clock
        self.events = events if events is not None else queue.SimpleQueue()
        # A thread that dies reports here; the run loop's hooks also let
        # start-up waits give up on a signal or --timeout.
        self.hooks = hooks or RunHooks(thread_died=lambda name, error: self.events.put(
            ThreadDied(name, f"{type(error).__name__}: {error}")))
        self.fault, self.log_errors = None, []  # a dead launcher thread (ThreadDied); LogWriteFailed events
        self.lost: list[int] = []  # ranks given up on after SIGKILL
        self.children: dict[int, Child] = {}
        self.records: dict[int, ProcessRecord] = {}
        self.reason: StopReason | None = None
        self.signum: int | None = None  # the stop's signal
        self.root_cause: int | None = None  # rank
        self.kill_at: float | None = None
        self.kill_sent = False  # SIGKILL went out: later exits are ours, not failures
        self.deadline: float | None = None  # the supervisor's clock reads it: see _start
        self.open_streams = 0  # pumped or followed streams not yet at their end
        self.heard: list[int] = []  # ranks that ended with a failure, in the order heard
        self.held: list[int] = []  # failures waiting out HOLD_WAIT for a stop signal (until hold_until)
        self.hold_until: float | None = None
        self.stop_began: float | None = None  # when a stop on a signal began (self.clock)
        self.last_end: float | None = None  # when the last exit was heard (self.clock)
        self.joins: Joins | None = None  # made when the run starts, as the stall watch is
        self.stall_timeout, self.stall_found = stall_timeout, None  # the watchdog's, and the Stall it found
        self.stall: ActivityWatch | None = None
        self.full = False  # the log folder was full at the end
        self.recovery = recovery or Recovery(False, 0, False, backend.name, len(self.specs))  # default: fail fast

    def joins_settled(self) -> bool:
        """The start-up progress is over (its last line is out)."""
        return self.joins is not None and not self.joins.active

    # -- signals -----------------------------------------------------------
    def post_signal(self, signum: int) -> None:
        """Safe to call from a signal handler: it only enqueues."""
        self.events.put(SignalReceived(signum))

    # -- main loop ---------------------------------------------------------
    def run(self) -> Outcome:
        """Start every process, watch them to the end; the backend's ``begin``
        is part of the start, and ``end`` is the caller's."""
        self.pump = OutputPump(self.events, self.printer.write, self.printer.flush, hooks=self.hooks)
        self.joins = Joins(self.specs, self.printer.status, self.printer.note,
                                     live=self.printer.can_show_status(), clock=self.clock,
                                     on_join=self.recovery.joined)
        lifeline_r, lifeline_w = os.pipe()
        self.lifeline_r = lifeline_r  # kept open to the end: a process started again alone gets it too
        self.records = {spec.rank: ProcessRecord(spec, *log_paths(self.log_dir, spec.rank)) for spec in self.specs}
        self.stall = ActivityWatch(self.specs, self.stall_timeout, self.clock, self.printer.note,
                                {rank: rec.stderr_log for rank, rec in self.records.items()})
        try:
            self._start(lifeline_r)
            self._loop()
            self._drain()
        finally:
            for child in self.children.values():
                child.send(signal.SIGKILL)  # grandchildren left in a group
            self.full = folder_is_full(self.log_dir)  # before the files below free their blocks
            self.joins.finish()
            self.stall.finish()
            os.close(lifeline_r)
            os.close(lifeline_w)
            self.pump.stop()
        return self._outcome()

    def _start(self, lifeline_r: int) -> None:
        self.deadline = self.limit.at
        self.recovery.begin()
        try:
            self.backend.begin_attempt(self.specs, self.log_dir)  # bad input raises before any file is made
            prepare_log_dir(self.log_dir)
            self._start_all(lifeline_r)
        except Interrupted:
            # A signal, --timeout or a dead thread cut the start short: act on
            # it now (the loop below only runs while processes do).
            while True:
                try:
                    self._handle(self.events.get_nowait())
                except queue.Empty:
                    break
            if self.reason is None:
                self._begin_stop(StopReason.TIMEOUT, TIMEOUT_DUMP_WAIT, signal.SIGUSR1)

    def _start_all(self, lifeline_r: int) -> None:
        self.joins.begin()
        show_at = self.clock()
        for spec in self.specs:
            if self.hooks.stopping():
                raise Interrupted()
            if self.clock() >= show_at:  # a long start (many processes) shows its progress too
                show_at = self.joins.tick() or float("inf")
            self._start_one(spec, lifeline_r)

    def _start_one(self, spec: ProcessSpec, lifeline_r: int) -> None:
        """Start one process of the attempt (again, for one that restarts alone)."""
        # Local backends let each child write its own log files: no byte of a
        # flood passes through jaxrun unless the console shows it.
        direct = self.backend.writes_log_files
        record = self.records[spec.rank]
        out, err, error_file = record.stdout_log, record.stderr_log, record.error_file
        joined_file = joined_path(self.log_dir, spec.rank)
        activity_file = activity_path(self.log_dir, spec.rank)
        for stale in (error_file, joined_file, activity_file):
            if os.path.lexists(stale):
                os.unlink(stale)
        env = {contract.ERROR_FILE: error_file, contract.JOINED_FILE: joined_file}
        if self.stall.active:
            env[contract.ACTIVITY_FILE] = activity_file
        news = News(lambda recoverable=False, rank=spec.rank: self.events.put(Joined(rank, recoverable)),
                    lambda state, rank=spec.rank: self.events.put(ev.Activity(rank, state)))
        if direct:
            fds = (open_log(out), open_log(err))
            try:
                child = self.backend.spawn(spec, lifeline_r, env, fds, news)
            finally:
                for fd in fds:
                    os.close(fd)
            if self.printer.shows(spec.rank):  # else nobody needs the bytes until the end
                for path, stream in ((out, Stream.STDOUT), (err, Stream.STDERR)):
                    self.open_streams += 1
                    self.pump.follow(path, spec.rank, stream)
        else:
            child = self.backend.spawn(spec, lifeline_r, env, None, news)
            for pipe, path, stream in ((child.stdout, out, Stream.STDOUT), (child.stderr, err, Stream.STDERR)):
                self._start_pump(pipe, path, spec.rank, stream, child.stream_filter(stream))
        record.pid, record.started_at = child.pid, time.time()
        self.children[spec.rank] = child
        if not child.reports_joins:  # else it tells its News: Joined and Progress events
            self.joins.watch(spec.rank, joined_file)
            self.stall.watch(spec.rank, activity_file)
        start_thread(f"process-waiter:{spec.rank}", self._wait, spec.rank, child, hooks=self.hooks)

    def _start_pump(self, pipe, path: str, rank: int, stream: Stream, stream_filter: StreamFilter | None) -> None:
        log = open_pumped_log(path)
        enlarge_pipe(pipe.fileno())

        def close() -> None:
            log.close()
            pipe.close()

        self.open_streams += 1
        self.pump.add(pipe.fileno(), log, rank, stream, close, show=self.printer.shows(rank), path=path,
                      stream_filter=stream_filter)

    def _wait(self, rank: int, child: Child) -> None:
        end = child.wait()
        self.events.put(Exited(rank, end, self.clock()))

    def _running(self) -> list[int]:
        return [r for r, rec in self.records.items() if rec.returncode is None and rec.pid is not None]

    def _loop(self) -> None:
        while self._running() or self.held:
            show_at = self.joins.tick()
            now = self.clock()
            if self.hold_until is not None and now >= self.hold_until:
                self._release_held()
            if self.kill_at is not None and now >= self.kill_at:
                if self.kill_sent:
                    self._give_up()
                    break
                self._kill_survivors()
            if self.deadline is not None and now >= self.deadline and self.reason is None:
                self._begin_stop(StopReason.TIMEOUT, TIMEOUT_DUMP_WAIT, signal.SIGUSR1)
            stall_at = self._watch_stall() if self.reason is None else None
            wake = [t for t in (self.kill_at, self.deadline if self.reason is None else None, show_at,
                                self.hold_until, stall_at) if t is not None]
            wait = max(0.0, min(wake) - now) if wake else None
            try:
                event = self.events.get(timeout=wait)
            except queue.Empty:
                continue
            self._handle(event)

    def _handle(self, event) -> None:
        if isinstance(event, Exited):
            self._on_exit(event)
        elif isinstance(event, SignalReceived):
            self._on_signal(event.signum)
        elif isinstance(event, StreamClosed):
            self.open_streams -= 1
        elif isinstance(event, Forward):
            if self.reason is None:
                self._send_all(event.signum)
        elif isinstance(event, Joined):
            self.joins.joined(event.rank, event.recoverable)
        elif isinstance(event, ev.Activity):
            self.stall.heard(event.rank, event.state)
        elif isinstance(event, ThreadDied):
            self._on_fault(event)
        elif isinstance(event, LogWriteFailed):
            self.log_errors.append(event)
            self.printer.note(f"jaxrun: cannot write {event.path}: {event.error}; "
                              f"process {event.rank}'s later output there is lost")

    def _on_exit(self, event: Exited) -> None:
        self.pump.wake()
        self.joins.ended(event.rank)
        self.stall.ended(event.rank)
        self.last_end = self.clock()
        record, end = self.records[event.rank], event.end
        record.returncode, record.ended_at = end.returncode, time.time()
        record.reaped_at, record.clock, record.lost = end.reaped_at, end.clock, end.lost
        if end.pid is not None:
            record.pid = end.pid  # the controller's own, now final
        if end.resources is not None:
            record.resources = end.resources
        if end.returncode == 0:
            record.verdict = Verdict.OK
            return
        self.heard.append(event.rank)
        if self.reason is None and (end.lost or contract.exit_status(end.returncode) - 128 in contract.STOP_SIGNALS):
            self.held.append(event.rank)  # its verdict waits for a stop signal, or HOLD_WAIT
            if self.hold_until is None:
                self.hold_until = self.clock() + HOLD_WAIT
        else:
            self._judge(event.rank)

    def _judge(self, rank: int) -> None:
        """The verdict on a failure, by what the run was doing when it was heard."""
        record = self.records[rank]
        if self.reason is None and self.recovery.spares_others(rank):
            self._recover(rank)
        elif self.reason is None:  # the first failure, or process 0's after a recoverable job's first
            first = self.recovery.failed[0] if self.recovery.failed else rank
            record.verdict = Verdict.ROOT_CAUSE if first == rank else Verdict.CONSEQUENCE
            self.root_cause = first
            self._begin_stop(StopReason.FAILURE, DUMP_WAIT, signal.SIGUSR1)
        elif self.reason is StopReason.FAILURE and not self.kill_sent:
            record.verdict = Verdict.CONSEQUENCE
        else:
            record.verdict = Verdict.STOPPED

    def _recover(self, rank: int) -> None:
        """A recoverable job's process other than 0 failed: the others go on;
        it may start again alone (``launcher.restarts.recovery``)."""
        record = self.records[rank]
        fingerprint, failure = diagnosis.run_failure(record)
        if self.recovery.after_failure(rank, diagnosis.where(record), diagnosis.describe_exit(record),
                                       fingerprint, failure):
            self.records[rank] = again = next_life(record, self.log_dir)
            self.stall.again(rank, again.stderr_log)
            try:
                return self._start_one(again.spec, self.lifeline_r)
            except Exception as error:  # noqa: BLE001 -- a spawn's failure (a host gone) ends its runs
                self.records[rank], record.earlier = record, again.earlier[:-1]
                self.stall.ended(rank)
                self.recovery.cannot_restart(rank, f"{type(error).__name__}: {error}")
        record.verdict = Verdict.ROOT_CAUSE if self.recovery.failed[0] == rank else Verdict.FAILED_ALONE

    def _release_held(self) -> None:
        held, self.held, self.hold_until = self.held, [], None
        for rank in held:
            self._judge(rank)

    def _on_signal(self, signum: int) -> None:
        if signum == signal.SIGUSR1:
            self._send_all(signal.SIGUSR1)
        elif self.reason is StopReason.SIGNAL and signum == signal.SIGINT:
            self._kill_survivors()  # a second Ctrl-C: no more grace
        elif self.reason is None:
            self.signum = signum
            self.stop_began = self.clock()
            self._begin_stop(StopReason.SIGNAL, self.grace, signum)

    def _on_fault(self, event: ThreadDied) -> None:
        """A launcher thread died: nothing it was doing can be trusted to
        finish (an exit never reported, a pipe never read), so the job stops."""
        if self.fault is None:
            self.fault = event
            self.printer.note(f"jaxrun: internal error: thread {event.name} died: {event.error}")
        if self.reason is None or self.reason is StopReason.FAILURE:
            self.reason = StopReason.INTERNAL
            self.hooks.stop_begun(DUMP_WAIT)
            self._send_all(signal.SIGUSR1)
            self.kill_at = min(self.kill_at or float("inf"), self.clock() + DUMP_WAIT)

    def _watch_stall(self) -> float | None:
        """The stall watch's turn: a probe (every stack dumped), or the stall
        itself, which stops the job; when to look again."""
        wake, action = self.stall.tick()
        if action == "probe":
            self._send_all(signal.SIGUSR1)
        elif isinstance(action, Stall):  # the probe's dumps are in the logs: no second one
            self.stall_found = action
            self._begin_stop(StopReason.STALL, DUMP_WAIT, None)
        return wake

    def _begin_stop(self, reason: StopReason, wait: float, signum: int | None) -> None:
        self.reason = reason
        self.hooks.stop_begun(wait)
        if signum is not None:
            self._send_all(signum)
        self.kill_at = self.clock() + wait
        if reason is not StopReason.FAILURE:
            self._release_held()  # the ends held for a stop signal were part of this stop

    def _send_all(self, signum: int) -> None:
        for rank in self._running():
            self.children[rank].send(signum)

    def _kill_survivors(self) -> None:
        self.kill_sent = True
        self._send_all(signal.SIGKILL)
        self.kill_at = self.clock() + KILL_CONFIRM_WAIT

    def _give_up(self) -> None:
        """SIGKILL went out long ago and these never confirmed their end."""
        self.lost = self._running()
        for record in (self.records[rank] for rank in self.lost):
            record.returncode, record.ended_at, record.verdict = -signal.SIGKILL, time.time(), Verdict.STOPPED
        self.printer.note(f"jaxrun: gave up waiting for process {','.join(map(str, self.lost))} "
                          f"{KILL_CONFIRM_WAIT:g} s after SIGKILL")

    def _drain(self) -> None:
        """Print what the pumps still hold; pipes close once the groups are dead."""
        for child in self.children.values():
            child.send(signal.SIGKILL)
        self.pump.finish()  # nobody is left to write the followed files
        end = time.monotonic() + DRAIN_WAIT  # real time: the pump runs in real time
        while self.open_streams > 0 and not self.fault:
            try:
                event = self.events.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                break
            self._handle(event)

    def _settle_root_cause(self) -> None:
        """The root cause from evidence, not arrival order (``core.causes``)."""
        if self.reason is StopReason.FAILURE and self.root_cause is not None:
            self.root_cause = causes.settle(self.records, self.heard, self.root_cause)

    def _outcome(self) -> Outcome:
        recovered = self.recovery.on
        ran_out = recovered and self.reason is None  # every process ran to its end
        if ran_out and self.recovery.failed:  # and some of their last runs failed
            self.reason, self.root_cause = StopReason.FAILURE, self.recovery.failed[0]
        self._settle_root_cause()
        records = [self.records[s.rank] for s in self.specs]
        root = None if self.root_cause is None else self.records[self.root_cause].exit_status
        code = exit_code(self.reason, self.signum, root)
        for rec in records:
            if rec.pid is None:
                rec.verdict = Verdict.NOT_STARTED
        fault = f"thread {self.fault.name} died: {self.fault.error}" if self.fault else None
        problems = [f"{e.path}: {e.error}" for e in self.log_errors]
        if self.full:  # a local process's own writes failed there
            problems.append(f"the log folder {self.log_dir} is full ({os.strerror(errno.ENOSPC)})")
        signal_stop = self.reason is StopReason.SIGNAL and None not in (self.stop_began, self.last_end)
        took = max(0.0, self.last_end - self.stop_began) if signal_stop else None
        return Outcome(records, code, self.reason, self.signum, self.root_cause, fault=fault,
                       log_errors=problems, lost=self.lost, stop_seconds=took, stall=self.stall_found,
                       whole_restart=not ran_out or self.recovery.restarts_whole, recoverable=recovered)
