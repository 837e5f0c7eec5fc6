"""The supervisor's decisions, replayed on a fake clock with scripted events.

No real process starts and no real deadline is waited out.  The supervisor
runs in the test's own thread with a ``FakeClock`` and a ``ScriptedEvents``
queue.  A test writes a timeline ("at t=1 process 2 exits with 7", "at t=2
the launcher gets SIGTERM"); whenever the supervisor would sleep, the queue
plays the next scripted step due before its deadline, or else moves the
clock straight to the deadline.  So grace periods and dump waits take no real
time, and the test can assert the fake time at which every signal went out.

The supervisor's own threads still run for real: each fake child's exit
reaches the loop through the supervisor's waiter thread, and pipe ends through
the output pump.  The queue knows how many of those events a fake child owes
it, and waits for them in real time instead of moving the clock past them, so
the order of events never depends on thread scheduling.
"""

from __future__ import annotations

import collections
import functools
import heapq
import io
import itertools
import os
import queue
import signal
import threading
import time

import pytest

from jaxrun import contract
from jaxrun.core.backend import Backend, ChildExit
from jaxrun.core.deadline import Deadline
from jaxrun.core.events import Exited, SignalReceived, Stream, StreamClosed
from jaxrun.core.outcome import INTERNAL_ERROR, StopReason, Verdict
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec
from jaxrun.launcher.attempt.ends import ECHO_WAIT, HOLD_WAIT
from jaxrun.launcher.attempt.stop import DUMP_WAIT, KILL_CONFIRM_WAIT, TIMEOUT_DUMP_WAIT
from jaxrun.launcher.attempt.supervisor import DRAIN_WAIT, Supervisor
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.reporting.summary import summary_lines

pytestmark = pytest.mark.timeout(30)

# Not zero: a supervisor that mixed up absolute and relative times would
# still pass with a clock starting at zero.
START = 1000.0
# Fake time no test needs; a supervisor still waiting by then would never end.
HORIZON = 24 * 3600.0
# Real seconds a supervisor thread may take to pass on an event it owes
# (a waiter thread's hop, the pump reading an EOF): far more than needed.
OWED_WITHIN = 5.0


class FakeClock:
    def __init__(self, now: float = START):
        self.now = now

    def __call__(self) -> float:
        return self.now


class ScriptedEvents:
    """The supervisor's event queue, with a timeline of scripted steps."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.cond = threading.Condition()
        self.items: collections.deque = collections.deque()
        self.owed = 0  # events a fake child's end will make a supervisor thread put
        self.script: list = []  # heap of (fake time, order written, step)
        self.order = itertools.count()

    def at(self, t: float, step, *args, **kwargs) -> None:
        """Play ``step(*args, **kwargs)`` at START + t, when the supervisor waits past it."""
        heapq.heappush(self.script, (START + t, next(self.order), functools.partial(step, *args, **kwargs)))

    def owe(self, n: int) -> None:
        with self.cond:
            self.owed += n

    def put(self, event) -> None:
        with self.cond:
            if isinstance(event, (Exited, StreamClosed)):
                self.owed -= 1
            self.items.append(event)
            self.cond.notify_all()

    def get(self, timeout: float | None = None):
        while True:
            with self.cond:
                if self.items:
                    return self.items.popleft()
                if self.owed > 0:
                    # Moving the clock now would let a deadline pass before
                    # the supervisor hears of an exit that came first.
                    if not self.cond.wait_for(lambda: self.items, OWED_WITHIN):
                        raise AssertionError(f"{self.owed} owed event(s) never reached the supervisor")
                    continue
                if self.script and (timeout is None or self.script[0][0] <= self.clock.now + timeout):
                    due, _, step = heapq.heappop(self.script)
                    self.clock.now = max(self.clock.now, due)
                else:
                    step = None
            if step is not None:
                step()  # outside the lock: a step makes other threads put events
                continue
            if timeout is None:
                # A real supervisor would block forever here: fail instead of hanging.
                raise AssertionError("the supervisor waits with no deadline, and nothing more is scripted")
            if self.clock.now + timeout > START + HORIZON:
                # Else a loop that keeps renewing its deadline spins until pytest's timeout.
                raise AssertionError("a day of fake time passed and the job has not ended")
            self.clock.now += timeout
            raise queue.Empty


class FakeChild:
    """A controller whose end is scripted; it records every signal it is sent.

    It dies of SIGKILL and of the signals in ``dies_on``; every other signal
    is only recorded, like a JAX process that treats SIGTERM as a preemption
    notice, or one blocked in a collective.  With ``grandchild``, its pipes
    stay open after it exits, held by a grandchild that writes one last line
    when the group's SIGKILL reaches it.  A test may set ``reports_joins``,
    ``filters`` (a StreamFilter per stream) and ``resources`` before the run;
    ``exit`` may say what its reaper saw (``reaped_at``, ``clock``), the
    controller's own ``pid``, or that a helper's end stood in for it (``lost``).
    """

    reports_joins = False

    def __init__(self, rank: int, events: ScriptedEvents, clock: FakeClock, dies_on, pipes: bool,
                 grandchild: bool = False):
        self.rank, self.events, self.clock = rank, events, clock
        self.dies_on = set(dies_on) | {signal.SIGKILL}
        self.pid = 40000 + rank
        self.signals: list[tuple[float, int, bool]] = []  # (fake time, signum, still running)
        self.returncode: int | None = None
        self.done = threading.Event()
        self.pipes = pipes
        self.grandchild = grandchild and pipes
        if pipes:
            out_r, self.out_w = os.pipe()
            err_r, self.err_w = os.pipe()
            self.stdout, self.stderr = os.fdopen(out_r, "rb", 0), os.fdopen(err_r, "rb", 0)
        else:
            self.stdout = self.stderr = None
        self.spawned_with: tuple | None = None  # (extra_env, log_fds)
        self.holds_log_pipes = False  # it holds the log writer's pipes (log_fds) until its end
        self.news = None
        self.filters: dict = {}
        self.resources: contract.Resources | None = None
        self.end = ChildExit(0)

    @property
    def live_signals(self) -> list[tuple[float, int]]:
        """What it was sent while running (the rest is the sweep of its dead group)."""
        return [(t, s) for t, s, running in self.signals if running]

    def send(self, signum: int) -> None:
        running = self.returncode is None
        self.signals.append((self.clock.now, signum, running))
        if running and signum in self.dies_on:
            self.exit(-signum)
        if self.grandchild and signum == signal.SIGKILL:  # sent to the whole group
            self.grandchild = False
            os.write(self.err_w, b"grandchild's last line\n")
            self.events.owe(2)
            os.close(self.out_w)
            os.close(self.err_w)

    def write_stderr(self, data: bytes) -> None:
        os.write(self.err_w, data)

    def exit(self, returncode: int, **facts) -> None:
        assert self.returncode is None, f"process {self.rank} scripted to end twice"
        self.end = ChildExit(returncode, self.resources, **facts)
        # Owed before the end is visible, so that no thread can put it first.
        closes = (self.pipes or self.holds_log_pipes) and not self.grandchild
        self.holds_log_pipes = False
        self.events.owe(3 if closes else 1)  # Exited, and each pipe's StreamClosed
        self.returncode = returncode
        if closes:
            os.close(self.out_w)
            os.close(self.err_w)
        self.done.set()

    def wait(self) -> ChildExit:
        self.done.wait()
        return self.end

    def stream_filter(self, stream):
        return self.filters.get(stream)


class FakeBackend(Backend):
    name = "fake"

    def __init__(self, n: int, events: ScriptedEvents, clock: FakeClock, dies_on, pipes: bool, grandchildren=()):
        self.writes_log_files = not pipes
        # Built before the run, so that a test can script them by rank.
        self.children = {r: FakeChild(r, events, clock, dies_on, pipes, r in grandchildren) for r in range(n)}

    def choose_coordinator(self, fixed):
        return fixed or "127.0.0.1:1", None

    def spawn(self, spec, lifeline_fd, extra_env, log_fds, news):
        child = self.children[spec.rank]
        assert (log_fds is not None) == self.writes_log_files
        child.spawned_with = (dict(extra_env), log_fds)
        child.news = news
        if log_fds is not None:  # as a local child would, into the log writer's pipes, held to its end
            child.out_w, child.err_w = os.dup(log_fds[0]), os.dup(log_fds[1])
            child.holds_log_pipes = True
            os.write(child.out_w, b"out %d\n" % spec.rank)
            os.write(child.err_w, b"err %d\n" % spec.rank)
        return child


class Harness:
    def __init__(self, tmp_path, n: int = 4, dies_on=(), pipes: bool = False, grandchildren=(), **options):
        self.clock = FakeClock()
        self.events = ScriptedEvents(self.clock)
        self.backend = FakeBackend(n, self.events, self.clock, dies_on, pipes, grandchildren)
        self.kids = self.backend.children
        self.log_dir = str(tmp_path / "logs")
        # Grouped: nothing is followed live, so only the children's ends make events.
        printer = ConsolePrinter(mode="grouped", stdout=io.BytesIO(), stderr=io.BytesIO())
        specs = [ProcessSpec(r, r, LOCAL_HOST, "python", (), {}) for r in range(n)]
        if "timeout" in options:  # --timeout: the run loop's one deadline, on this clock
            options["deadline"] = Deadline(options.pop("timeout"), self.clock)
        self.sup = Supervisor(specs, self.backend, printer, self.log_dir,
                              clock=self.clock, events=self.events, **options)

    def at(self, t: float, step, *args, **kwargs) -> None:
        self.events.at(t, step, *args, **kwargs)

    def signal_at(self, t: float, signum: int) -> None:
        self.at(t, self.events.put, SignalReceived(signum))

    def run(self):
        outcome = self.sup.run()
        # A step left over means the scenario the test describes never happened.
        assert not self.events.script, "the run ended before every scripted step"
        # Returning with an event unheard of means returning with, say, a log
        # whose last bytes are still in a pipe.
        assert self.events.owed == 0 and not self.events.items, "run() returned before handling every event"
        return outcome


def verdicts(outcome):
    return [r.verdict for r in outcome.records]


# -- failures -----------------------------------------------------------------

def test_first_failure_is_the_root_cause_and_the_rest_dump_then_die(tmp_path):
    h = Harness(tmp_path)
    h.at(1, h.kids[2].exit, 7)
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.root_cause) == (7, StopReason.FAILURE, 2)
    assert verdicts(outcome) == [Verdict.STOPPED, Verdict.STOPPED, Verdict.ROOT_CAUSE, Verdict.STOPPED]
    for rank in (0, 1, 3):
        assert h.kids[rank].live_signals == [
            (START + 1, signal.SIGUSR1),  # a stack dump, at once
            (START + 1 + DUMP_WAIT, signal.SIGKILL),  # after the dump wait, not before
        ]
    assert h.kids[2].live_signals == []
    summary = summary_lines(outcome, h.log_dir)
    assert "jaxrun: process 2 failed first: exit code 7 (pid 40002)" in summary
    assert "jaxrun: processes 0, 1, 3 stopped by jaxrun" in summary


def test_a_failure_after_the_root_cause_is_a_consequence(tmp_path):
    h = Harness(tmp_path)
    h.at(1, h.kids[0].exit, 1)
    h.at(1 + DUMP_WAIT / 4, h.kids[1].exit, 0)
    h.at(1 + DUMP_WAIT / 2, h.kids[3].exit, 134)  # its own abort, before jaxrun's SIGKILL
    outcome = h.run()
    assert verdicts(outcome) == [Verdict.ROOT_CAUSE, Verdict.OK, Verdict.STOPPED, Verdict.CONSEQUENCE]
    assert outcome.exit_code == 1 and outcome.root_cause == 0  # the root cause's code, not the last one's
    assert h.kids[2].live_signals == [(START + 1, signal.SIGUSR1), (START + 1 + DUMP_WAIT, signal.SIGKILL)]
    assert "jaxrun: process 3 failed after the root cause" in summary_lines(outcome, h.log_dir)


def record_at(h: Harness, rank: int, at: float, headline: str = "Boom: it broke") -> None:
    kind, _, message = headline.partition(": ")
    contract.ErrorRecord(kind, message, "", at).dump(h.sup.slots[rank].record.error_file)


def log(h: Harness, rank: int, text: str) -> None:
    with open(h.sup.slots[rank].record.stderr_log, "a") as f:
        f.write(text)


GLOO = ("JaxRuntimeError: INTERNAL: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:534] "
        "Connection closed by peer [127.0.0.1]:40123")
HEARTBEAT_ABORT = ("F1201 21:50:14.879987 3399 client.h:80] Terminating process because the JAX distributed service "
                   "detected fatal errors. This most likely indicates that another task died\n"
                   "*** Check failure stack trace: ***\n")


def test_exits_heard_together_are_put_in_the_order_their_errors_were_recorded(tmp_path):
    """A fork server reaps the exits of one moment in rank order: process 2
    stopped the job, its peers failed when it left, and rank 0's exit arrives
    first.  The records' times, on one machine's clock, put process 2 first;
    a process whose time is unknown is never moved."""
    h = Harness(tmp_path)
    h.at(0.5, record_at, h, 2, 100.0)
    h.at(0.5, record_at, h, 0, 100.2)
    h.at(0.5, record_at, h, 3, 100.1)
    h.at(1, h.kids[0].exit, 1, clock="here")
    h.at(1, h.kids[2].exit, 3, clock="here")
    h.at(1, h.kids[3].exit, 1, clock="here")
    outcome = h.run()
    assert outcome.root_cause == 2 and outcome.exit_code == 3
    assert verdicts(outcome) == [Verdict.CONSEQUENCE, Verdict.STOPPED, Verdict.ROOT_CAUSE, Verdict.CONSEQUENCE]

    h = Harness(tmp_path / "no-record")
    h.at(0.5, record_at, h, 2, 100.0)
    h.at(1, h.kids[0].exit, 1, clock="here")  # no record, no reap time: nothing to compare
    h.at(1, h.kids[2].exit, 3, clock="here")
    outcome = h.run()
    assert outcome.root_cause == 0 and outcome.exit_code == 1


def test_a_peer_that_failed_because_another_left_is_not_the_root_cause(tmp_path):
    """The issue's case: process 3 os._exit(7)s at T; process 2's collective
    fails (Gloo: "Connection closed by peer") and records it at T+0.025; the
    fork server reaps both in one pass, in rank order, so process 2 is heard
    first, and was even reaped a moment earlier.  Process 3 left no record:
    it failed on its own, and 7 is jaxrun's status."""
    h = Harness(tmp_path)
    h.at(0.5, record_at, h, 2, 100.025, GLOO)
    h.at(1, h.kids[2].exit, 1, reaped_at=100.0301, clock="here")
    h.at(1, h.kids[3].exit, 7, reaped_at=100.0302, clock="here")
    outcome = h.run()
    assert (outcome.root_cause, outcome.exit_code, outcome.reason) == (3, 7, StopReason.FAILURE)
    assert verdicts(outcome) == [Verdict.STOPPED, Verdict.STOPPED, Verdict.CONSEQUENCE, Verdict.ROOT_CAUSE]
    assert outcome.records[3].reaped_at == 100.0302
    summary = summary_lines(outcome, h.log_dir)
    assert "jaxrun: process 3 failed first: exit code 7 (pid 40003)" in summary
    assert "jaxrun: process 2 failed after the root cause" in summary


def test_a_signal_death_comes_before_an_abort_for_a_lost_peer(tmp_path):
    """Neither left a record: the end of each one's stderr is the evidence.
    Process 0 aborted when the coordination service reported a dead task;
    process 1 died of SIGSEGV, and that is what jaxrun exits with."""
    h = Harness(tmp_path)
    h.at(0.5, log, h, 0, HEARTBEAT_ABORT)
    h.at(0.5, log, h, 1, "Fatal Python error: Segmentation fault\n")
    h.at(1, h.kids[0].exit, -signal.SIGABRT, reaped_at=50.0, clock="here")
    h.at(1, h.kids[1].exit, -signal.SIGSEGV, reaped_at=50.1, clock="here")
    outcome = h.run()
    assert (outcome.root_cause, outcome.exit_code) == (1, 139)
    assert verdicts(outcome)[:2] == [Verdict.CONSEQUENCE, Verdict.ROOT_CAUSE]


def test_a_crash_heard_after_the_kill_comes_before_a_lost_peer_heard_first(tmp_path):
    """Under Ray on a loaded machine: process 1 died of SIGSEGV, process 0's
    collective then failed (Gloo: "Connection closed by peer") and its end
    came home first; process 1's death was heard only after jaxrun's
    SIGKILL went out (the actor's news, 32 s joins under four suite workers).
    jaxrun never sends a SIGSEGV: process 1 failed first, and its status is
    jaxrun's.  A death by jaxrun's own SIGKILL heard as late changes nothing."""
    h = Harness(tmp_path)
    h.kids[1].dies_on.discard(signal.SIGKILL)  # dead already: the kill finds nothing, its news is on its way
    h.at(0.5, record_at, h, 0, 100.0, GLOO)
    h.at(1, h.kids[0].exit, 1, reaped_at=100.01, clock="here")
    h.at(1 + DUMP_WAIT + 0.5, h.kids[1].exit, -signal.SIGSEGV, reaped_at=99.9, clock="there")
    outcome = h.run()
    assert (outcome.root_cause, outcome.exit_code) == (1, 139)
    assert verdicts(outcome) == [Verdict.CONSEQUENCE, Verdict.ROOT_CAUSE, Verdict.STOPPED, Verdict.STOPPED]
    assert "jaxrun: process 1 failed first: killed by SIGSEGV (pid 40001)" in summary_lines(outcome, h.log_dir)

    for rank, late in ((1, -signal.SIGKILL), (2, 1)):  # jaxrun's own kill; an exit code, whatever its cause
        h = Harness(tmp_path / f"late-{rank}")
        h.kids[rank].dies_on.discard(signal.SIGKILL)
        h.at(0.5, record_at, h, 0, 100.0, GLOO)
        h.at(1, h.kids[0].exit, 1, reaped_at=100.01, clock="here")
        h.at(1 + DUMP_WAIT + 0.5, h.kids[rank].exit, late)
        outcome = h.run()
        assert (outcome.root_cause, outcome.exit_code) == (0, 1)


@pytest.mark.parametrize("clocks, first, status", [(("a", "a"), 1, 5), (("a", "b"), 0, 1)],
                         ids=["one-host", "two-hosts"])
def test_two_failures_of_their_own_go_by_reap_time_on_one_clock_only(tmp_path, clocks, first, status):
    """On one machine, the one reaped earlier failed first, whatever the
    order heard; on two, their clocks are not compared: the first heard."""
    h = Harness(tmp_path)
    h.at(1, h.kids[0].exit, 1, reaped_at=50.2, clock=clocks[0])
    h.at(1, h.kids[1].exit, 5, reaped_at=50.1, clock=clocks[1])
    outcome = h.run()
    assert (outcome.root_cause, outcome.exit_code) == (first, status)


def test_consequences_alone_keep_the_first_heard(tmp_path):
    h = Harness(tmp_path)
    h.at(0.5, record_at, h, 1, 9.0, GLOO)
    h.at(0.5, record_at, h, 0, 8.0, GLOO)
    h.at(1, h.kids[1].exit, 1, reaped_at=9.1, clock="here")
    h.at(1, h.kids[0].exit, 1, reaped_at=8.1, clock="here")
    outcome = h.run()
    assert outcome.root_cause == 1


def test_a_helper_end_then_jaxrun_own_sigterm_is_a_stop_not_a_failure(tmp_path):
    """A SIGTERM to the whole tree ends a local ssh client first, and its end
    is heard before jaxrun's own handler has run: held for HOLD_WAIT, it is
    part of the stop."""
    h = Harness(tmp_path, grace=5)
    h.at(1, h.kids[0].exit, 255, lost="the ssh client")
    h.signal_at(1 + HOLD_WAIT / 3, signal.SIGTERM)
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.root_cause) == (143, StopReason.SIGNAL, None)
    assert all(v is Verdict.STOPPED for v in verdicts(outcome))
    assert outcome.records[0].lost == "the ssh client"
    for kid in list(h.kids.values())[1:]:
        assert kid.live_signals == [(START + 1 + HOLD_WAIT / 3, signal.SIGTERM), (START + 1 + HOLD_WAIT / 3 + 5,
                                                                              signal.SIGKILL)]


@pytest.mark.parametrize("returncode, facts", [(255, {"lost": "the connection to hostB"}), (-signal.SIGTERM, {})],
                         ids=["helper", "sigterm"])
def test_an_end_held_for_a_stop_that_never_comes_is_a_failure(tmp_path, returncode, facts):
    h = Harness(tmp_path)
    h.at(1, h.kids[2].exit, returncode, **facts)
    outcome = h.run()
    assert (outcome.reason, outcome.root_cause) == (StopReason.FAILURE, 2)
    assert outcome.exit_code == contract.exit_status(returncode)
    for rank in (0, 1, 3):  # the dump and the kill, HOLD_WAIT late
        assert h.kids[rank].live_signals == [(START + 1 + HOLD_WAIT, signal.SIGUSR1),
                                             (START + 1 + HOLD_WAIT + DUMP_WAIT, signal.SIGKILL)]


def test_a_failure_of_its_own_outranks_a_helper_lost_earlier(tmp_path):
    h = Harness(tmp_path)
    h.at(1, h.kids[0].exit, 255, lost="the ssh client")
    h.at(1 + HOLD_WAIT / 2, h.kids[1].exit, 3)
    outcome = h.run()
    assert (outcome.root_cause, outcome.exit_code) == (1, 3)
    assert verdicts(outcome)[:2] == [Verdict.CONSEQUENCE, Verdict.ROOT_CAUSE]


@pytest.mark.parametrize("returncode, status", [(-signal.SIGKILL, 137), (-signal.SIGSEGV, 139)],
                         ids=["SIGKILL", "SIGSEGV"])
def test_a_child_killed_from_outside_exits_with_128_plus_the_signal(tmp_path, returncode, status):
    h = Harness(tmp_path)
    h.at(1, h.kids[1].exit, returncode)
    outcome = h.run()
    assert outcome.exit_code == status and outcome.root_cause == 1
    assert outcome.records[1].exit_status == status and outcome.records[1].verdict is Verdict.ROOT_CAUSE


# -- clean runs ---------------------------------------------------------------

def test_clean_exits_are_ok_exit_zero_and_nothing_is_signalled(tmp_path):
    h = Harness(tmp_path)
    for rank, kid in h.kids.items():
        h.at(1 + rank, kid.exit, 0)
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.root_cause) == (0, None, None)
    assert all(v is Verdict.OK for v in verdicts(outcome))
    for kid in h.kids.values():
        assert kid.live_signals == []
        # Once it is gone its group is still swept: grandchildren must not outlive the job.
        assert kid.signals and {s for _, s, _ in kid.signals} == {signal.SIGKILL}


def test_each_child_gets_its_own_log_files_and_error_file(tmp_path):
    h = Harness(tmp_path, n=2)
    os.makedirs(h.log_dir)
    stale = os.path.join(h.log_dir, "process-1.error.json")
    with open(stale, "w") as f:
        f.write("{}")  # from an earlier attempt: must not be blamed on this one
    for kid in h.kids.values():
        h.at(1, kid.exit, 0)
    outcome = h.run()
    assert not os.path.exists(stale)
    for record, kid in zip(outcome.records, h.kids.values()):
        env, _ = kid.spawned_with
        assert env[contract.ERROR_FILE] == record.error_file
        assert record.pid == kid.pid
        with open(record.stdout_log, "rb") as out, open(record.stderr_log, "rb") as err:
            assert (out.read(), err.read()) == (b"out %d\n" % kid.rank, b"err %d\n" % kid.rank)


def test_piped_output_is_drained_into_the_log_before_the_run_ends(tmp_path):
    h = Harness(tmp_path, pipes=True)

    def last_words_then_fail():
        h.kids[2].write_stderr(b"Traceback: boom\n")
        h.kids[2].exit(3)

    h.at(1, last_words_then_fail)
    outcome = h.run()
    assert outcome.exit_code == 3 and outcome.root_cause == 2
    with open(outcome.records[2].stderr_log, "rb") as f:
        assert f.read() == b"Traceback: boom\n"


def test_a_grandchild_holding_the_pipes_is_killed_and_its_output_kept(tmp_path):
    h = Harness(tmp_path, n=2, pipes=True, grandchildren={0})
    for kid in h.kids.values():
        h.at(1, kid.exit, 0)
    outcome = h.run()
    assert outcome.exit_code == 0
    assert h.kids[0].grandchild is False, "the group of a child that exited was never killed"
    with open(outcome.records[0].stderr_log, "rb") as f:
        assert f.read() == b"grandchild's last line\n"


# -- signals to the launcher --------------------------------------------------

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_is_forwarded_then_killed_exactly_after_grace(tmp_path, signum):
    grace = 7.5  # not the default: the supervisor must use the one it was given
    h = Harness(tmp_path, grace=grace)  # the children ignore it, as JAX does SIGTERM
    h.signal_at(2, signum)
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.signum) == (128 + signum, StopReason.SIGNAL, signum)
    assert all(v is Verdict.STOPPED for v in verdicts(outcome))
    for kid in h.kids.values():
        assert kid.live_signals == [(START + 2, signum), (START + 2 + grace, signal.SIGKILL)]


def test_sighup_gives_129_and_children_that_obey_are_not_killed(tmp_path):
    h = Harness(tmp_path, dies_on={signal.SIGHUP}, grace=5)
    h.signal_at(2, signal.SIGHUP)
    outcome = h.run()
    assert outcome.exit_code == 129 and outcome.root_cause is None
    # Ending on the launcher's own signal is being stopped, not failing.
    assert all(v is Verdict.STOPPED for v in verdicts(outcome))
    for kid in h.kids.values():
        assert kid.live_signals == [(START + 2, signal.SIGHUP)]


def test_a_clean_stop_says_every_process_exited_0_and_when(tmp_path):
    """Each process saved its work on the forwarded SIGTERM and exited 0: the
    summary says so, with the time from the signal to the last exit, and the
    status stays 143 (the job was interrupted)."""
    h = Harness(tmp_path, grace=30)
    h.signal_at(2, signal.SIGTERM)
    for rank, after in enumerate((0.5, 0.8, 1.1, 1.1)):
        h.at(2 + after, h.kids[rank].exit, 0)
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason) == (143, StopReason.SIGNAL)
    assert all(v is Verdict.OK for v in verdicts(outcome))
    assert outcome.stop_seconds == pytest.approx(1.1)
    summary = summary_lines(outcome, h.log_dir)
    assert summary[0] == "jaxrun: stopped on SIGTERM; every process exited 0 within 1.1 s"

    h = Harness(tmp_path / "one-killed", grace=3)
    h.signal_at(2, signal.SIGTERM)
    for rank in range(3):
        h.at(2.5, h.kids[rank].exit, 0)  # process 3 ignores it and is killed after the grace
    outcome = h.run()
    assert summary_lines(outcome, h.log_dir)[0] == "jaxrun: received SIGTERM; stopped every process"


def test_the_controller_own_pid_that_comes_with_the_exit_is_the_record(tmp_path):
    h = Harness(tmp_path, n=2)
    h.at(1, h.kids[1].exit, 3, pid=777)
    outcome = h.run()
    assert [r.pid for r in outcome.records] == [40000, 777]
    assert "jaxrun: process 1 failed first: exit code 3 (pid 777)" in summary_lines(outcome, h.log_dir)


def test_a_second_sigint_kills_at_once(tmp_path):
    h = Harness(tmp_path, grace=60)
    h.signal_at(2, signal.SIGINT)
    h.signal_at(3, signal.SIGINT)
    outcome = h.run()
    assert outcome.exit_code == 130
    for kid in h.kids.values():
        assert kid.live_signals == [(START + 2, signal.SIGINT), (START + 3, signal.SIGKILL)]


def test_sigusr1_to_the_launcher_only_asks_for_stacks(tmp_path):
    h = Harness(tmp_path, grace=1)
    h.signal_at(1, signal.SIGUSR1)
    for rank, kid in h.kids.items():
        h.at(10 + rank, kid.exit, 0)  # long after any grace or dump wait would have ended
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason) == (0, None)
    assert all(v is Verdict.OK for v in verdicts(outcome))
    for kid in h.kids.values():
        assert kid.live_signals == [(START + 1, signal.SIGUSR1)]


# -- --timeout ----------------------------------------------------------------

def test_timeout_asks_for_stacks_then_kills_with_124(tmp_path):
    h = Harness(tmp_path, timeout=100)
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.root_cause) == (124, StopReason.TIMEOUT, None)
    assert all(v is Verdict.STOPPED for v in verdicts(outcome))
    for kid in h.kids.values():
        assert kid.live_signals == [(START + 100, signal.SIGUSR1), (START + 100 + TIMEOUT_DUMP_WAIT, signal.SIGKILL)]


def test_a_job_that_ends_before_its_timeout_is_untouched(tmp_path):
    h = Harness(tmp_path, timeout=100)
    for kid in h.kids.values():
        h.at(50, kid.exit, 0)
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason) == (0, None)
    assert all(kid.live_signals == [] for kid in h.kids.values())


# -- nothing waits without a bound ---------------------------------------------

def test_a_process_whose_end_is_never_confirmed_is_given_up_on(tmp_path):
    """Its waiter thread died, or its host vanished: after SIGKILL the run
    waits KILL_CONFIRM_WAIT for it, then ends anyway, once the pipes it
    still holds had DRAIN_WAIT to bring its last bytes."""
    h = Harness(tmp_path, n=2)
    h.kids[1].dies_on.discard(signal.SIGKILL)
    h.at(1, h.kids[0].exit, 3)
    outcome = h.run()
    assert outcome.lost == [1] and outcome.exit_code == 3
    assert outcome.records[1].verdict is Verdict.STOPPED and outcome.records[1].returncode == -signal.SIGKILL
    assert h.clock.now == pytest.approx(START + 1 + DUMP_WAIT + KILL_CONFIRM_WAIT + DRAIN_WAIT, abs=0.1)
    h.kids[1].exit(-signal.SIGKILL)  # let its waiter thread go


def test_a_dead_launcher_thread_stops_the_job_and_is_named(tmp_path):
    h = Harness(tmp_path, n=2)
    h.at(1, h.sup.hooks.thread_died, "jaxrun-output", OSError(28, "No space left on device"))
    outcome = h.run()
    assert (outcome.reason, outcome.exit_code) == (StopReason.INTERNAL, INTERNAL_ERROR)
    assert outcome.fault == "thread jaxrun-output died: OSError: [Errno 28] No space left on device"
    for kid in h.kids.values():
        assert kid.live_signals == [(START + 1, signal.SIGUSR1), (START + 1 + DUMP_WAIT, signal.SIGKILL)]
    summary = summary_lines(outcome, h.log_dir)
    assert summary[0] == f"jaxrun: internal error: {outcome.fault}; stopped every process"
    assert "please report it" in summary[1]


def test_the_streams_of_a_dead_log_writer_are_not_waited_for(tmp_path):
    """The log writer's thread itself died: the streams it carried never
    close, so the run ends without spending DRAIN_WAIT on them (real time:
    the drain waits on the clock the pump runs on)."""
    h = Harness(tmp_path, n=2)

    def writer_dies():
        writer = h.sup.writer
        writer.stopped = True
        os.write(writer.wake_w, b"x")
        writer.thread.join(5)
        h.sup.hooks.thread_died("jaxrun-logs", RuntimeError("gone"))

    h.at(1, writer_dies)
    began = time.monotonic()
    outcome = h.sup.run()  # not Harness.run: the dead writer's StreamClosed are never heard, rightly
    took = time.monotonic() - began
    assert (outcome.reason, outcome.exit_code) == (StopReason.INTERNAL, INTERNAL_ERROR)
    assert not h.sup.writer.thread.is_alive()
    assert took < DRAIN_WAIT / 2, took  # about 0.1 s here; waiting for those streams would be DRAIN_WAIT


# -- the Child contract ----------------------------------------------------------------

class Shouting:
    """A stream filter that keeps nothing back and changes every byte, and
    says whether it was closed."""

    def __init__(self):
        self.closed = False

    def feed(self, data: bytes) -> bytes:
        return data.upper()

    def close(self) -> bytes:
        self.closed = True
        return b"<end>"


def test_the_pump_passes_each_pipe_through_its_child_stream_filter(tmp_path):
    h = Harness(tmp_path, n=1, pipes=True)
    shouting = h.kids[0].filters[Stream.STDERR] = Shouting()

    def write_then_exit():
        h.kids[0].write_stderr(b"quiet words\n")
        h.kids[0].exit(0)

    h.at(1, write_then_exit)
    outcome = h.run()
    assert shouting.closed
    with open(outcome.records[0].stderr_log, "rb") as f:
        assert f.read() == b"QUIET WORDS\n<end>"
    with open(outcome.records[0].stdout_log, "rb") as f:
        assert f.read() == b""  # no filter for stdout: nothing was asked of it


def test_the_resources_a_child_exit_brings_reach_the_record(tmp_path):
    h = Harness(tmp_path, n=2)
    h.kids[1].resources = contract.Resources(1 << 30, 2.5, None)
    for kid in h.kids.values():
        h.at(1, kid.exit, 0)
    outcome = h.run()
    assert [r.resources for r in outcome.records] == [None, contract.Resources(1 << 30, 2.5, None)]


@pytest.mark.parametrize("reports_joins, how, counted", [
    (True, "on_join", True),
    (False, "file", True),
    (True, "file", False),  # a child that reports joins itself: its joined file is not watched
], ids=["on_join", "joined-file", "file-not-watched"])
def test_joins_are_heard_the_way_each_child_reports_them(tmp_path, reports_joins, how, counted):
    h = Harness(tmp_path, n=2)
    for kid in h.kids.values():
        kid.reports_joins = reports_joins

    def join(kid):
        if how == "on_join":
            kid.news.joined()
        else:
            env, _ = kid.spawned_with
            open(env[contract.JOINED_FILE], "w").close()

    for kid in h.kids.values():
        h.at(6, join, kid)  # a slow join (SAY_JOINED_AFTER): its line is said
        h.at(8, kid.exit, 0)
    outcome = h.run()
    assert outcome.exit_code == 0
    # A joined file is seen at the next look (JOIN_POLL), a reported join at once.
    done = b"jaxrun: 2/2 processes joined in " + (b"6.0 s" if how == "on_join" else b"6.2 s")
    assert (done in h.sup.printer.err.getvalue()) == counted


def test_each_slot_moves_through_its_states_as_its_process_reports(tmp_path):
    """pending, started, joined, working, waiting, finished, ended: what the
    supervisor heard of each process, read mid-run and at the end."""
    from jaxrun.launcher.attempt.slots import State

    h = Harness(tmp_path, n=3)
    for kid in h.kids.values():
        kid.reports_joins = True
    seen = {}

    def look(t):
        seen[t] = h.sup.slots.states()

    for rank in (0, 1):
        h.at(1, lambda rank=rank: h.kids[rank].news.joined())
    h.at(1.5, look, 1.5)
    h.at(2, lambda: h.kids[0].news.activity(contract.BUSY))
    h.at(2, lambda: h.kids[1].news.activity(contract.IDLE))
    h.at(2.5, look, 2.5)
    h.at(3, lambda: h.kids[0].news.activity(contract.FINISHED))
    h.at(3, lambda: h.kids[0].news.activity(contract.IDLE))  # FINISHED is the last word
    h.at(3.5, look, 3.5)
    for rank in range(3):
        h.at(4, h.kids[rank].exit, 0)
    h.run()
    assert seen[1.5] == {0: State.JOINED, 1: State.JOINED, 2: State.STARTED}
    assert seen[2.5] == {0: State.WORKING, 1: State.WAITING, 2: State.STARTED}
    assert seen[3.5] == {0: State.FINISHED, 1: State.WAITING, 2: State.STARTED}
    finished = [slot.record.finished_at for slot in h.sup.slots]
    assert finished[0] is not None and finished[1:] == [None, None]  # the report's finished_at
    assert h.sup.slots.states() == dict.fromkeys(range(3), State.ENDED)


def test_a_slot_is_pending_until_its_spawn_and_a_new_life_is_pending_again(tmp_path):
    from jaxrun.core.outcome import ProcessRecord
    from jaxrun.launcher.attempt.slots import Slot, State

    spec = ProcessSpec(2, 2, LOCAL_HOST, "python", (), {contract.RESTART_COUNT: "0"})
    slot = Slot(2, ProcessRecord(spec, "o", "e", "j"))
    assert slot.state is State.PENDING
    slot.activity(contract.BUSY)  # nothing to move before its start
    assert slot.state is State.PENDING
    slot.started(FakeChild(2, None, FakeClock(), (), False))
    slot.joined()
    slot.activity(contract.BUSY)
    slot.ended()
    assert slot.state is State.ENDED and slot.record.pid == 40002
    slot.next_life(str(tmp_path))
    assert slot.state is State.PENDING and slot.record.life == 1 and slot.child is None


# -- a recoverable job (launcher.restarts.policy) -------------------------------------------

class RespawningBackend(FakeBackend):
    """Starts one process again alone: its second spawn is a new fake child."""

    starts_one_again = True

    def __init__(self, n: int, events: ScriptedEvents, clock: FakeClock):
        super().__init__(n, events, clock, (), False)
        self.events, self.clock = events, clock
        self.again: list[ProcessSpec] = []  # the specs started again alone
        self.again_at: list[float] = []  # when, on the fake clock
        for child in self.children.values():
            child.reports_joins = True

    def spawn(self, spec, lifeline_fd, extra_env, log_fds, news):
        if self.children[spec.rank].returncode is not None:
            self.again.append(spec)
            self.again_at.append(self.clock())
            self.children[spec.rank] = FakeChild(spec.rank, self.events, self.clock, (), False)
            self.children[spec.rank].reports_joins = True
        return super().spawn(spec, lifeline_fd, extra_env, log_fds, news)


def recoverable_harness(tmp_path, restarts: int, announced=(True, True, True, True), mode=None):
    from jaxrun.launcher.restarts.policy import Engine, RestartPolicy

    h = Harness(tmp_path, policy=RestartPolicy(restarts, Engine("fake", starts_one_again=True), mode))
    h.backend = RespawningBackend(4, h.events, h.clock)
    notes: list[str] = []
    h.sup.backend = h.backend
    h.sup.printer.note = notes.append
    for rank, flag in enumerate(announced):
        h.at(0.5, lambda rank=rank, flag=flag: h.backend.children[rank].news.joined(flag))
    return h, notes


def kid(h, rank):
    return h.backend.children[rank]  # the newest child of that rank


BAD = contract.ErrorRecord("ValueError", "bad shard", 'Traceback (most recent call last):\n'
                           '  File "/work/train.py", line 12, in <module>\n    raise ValueError("bad shard")\n'
                           'ValueError: bad shard\n', 1.0)


def test_a_recoverable_failure_restarts_that_process_alone(tmp_path):
    h, notes = recoverable_harness(tmp_path, restarts=1)
    h.at(1, lambda: kid(h, 2).exit(-signal.SIGKILL))
    h.at(1 + ECHO_WAIT + 0.5, lambda: kid(h, 2).exit(0))  # the new run, started once process 0 was heard alive
    for rank in (0, 1, 3):
        h.at(3, lambda rank=rank: kid(h, rank).exit(0))
    survivors = [h.backend.children[r] for r in (0, 1, 3)]
    outcome = h.run()
    assert h.backend.again_at == [START + 1 + ECHO_WAIT]  # no sign of process 0's end meanwhile
    assert (outcome.exit_code, outcome.reason, outcome.recoverable) == (0, None, True)
    assert all(child.live_signals == [] for child in survivors)  # nobody was stopped
    (again,) = h.backend.again
    assert again.env[contract.PROCESS_RESTARTS] == "1" and again.env[contract.RESTART_COUNT] == "1"
    record = outcome.records[2]
    assert [r.verdict for r in record.lives] == [Verdict.RESTARTED, Verdict.OK]
    assert record.lives[0].stdout_log.endswith("process-2.stdout")
    assert record.stdout_log.endswith("process-2.life-1.stdout")
    assert [n for n in notes if "failed" in n] == [
        "jaxrun: process 2 failed (killed by SIGKILL); the others go on (the job is recoverable: every process "
        "enabled jax_enable_recoverability); starting process 2 again alone (restart 1 of 1)"]


def test_without_restarts_the_others_finish_and_the_status_names_it(tmp_path):
    h, notes = recoverable_harness(tmp_path, restarts=0)
    h.at(1, lambda: kid(h, 2).exit(7))
    for rank in (0, 1, 3):
        h.at(3, lambda rank=rank: kid(h, rank).exit(0))
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.root_cause, outcome.ran_out) == \
        (7, StopReason.FAILURE, 2, True)
    assert verdicts(outcome) == [Verdict.OK, Verdict.OK, Verdict.ROOT_CAUSE, Verdict.OK]
    assert not h.backend.again
    assert "jaxrun: process 2 failed first: exit code 7 (pid 40002)" in summary_lines(outcome, h.log_dir)


def test_a_spared_failure_held_past_the_others_end_still_ends_the_run(tmp_path):
    """Process 2 fails; the others finish while its end waits ECHO_WAIT for
    process 0's: the run ends once it is judged, with process 2's status."""
    h, notes = recoverable_harness(tmp_path, restarts=0)
    h.at(1, lambda: kid(h, 2).exit(7))
    for rank in (0, 1, 3):
        h.at(1 + ECHO_WAIT / 2, lambda rank=rank: kid(h, rank).exit(0))
    outcome = h.run()
    assert (outcome.exit_code, outcome.root_cause, outcome.ran_out) == (7, 2, True)
    assert h.clock() == START + 1 + ECHO_WAIT
    assert verdicts(outcome) == [Verdict.OK, Verdict.OK, Verdict.ROOT_CAUSE, Verdict.OK]


def test_the_same_failure_twice_stops_that_process_restarts(tmp_path):
    h, notes = recoverable_harness(tmp_path, restarts=3)

    def fail():
        BAD.dump(kid(h, 2).spawned_with[0][contract.ERROR_FILE])
        kid(h, 2).exit(1)

    h.at(1, fail)
    h.at(1 + ECHO_WAIT + 0.5, fail)
    for rank in (0, 1, 3):
        h.at(1 + 2 * ECHO_WAIT + 1, lambda rank=rank: kid(h, rank).exit(0))
    outcome = h.run()
    assert len(h.backend.again) == 1 and outcome.exit_code == 1
    assert notes[-1].endswith("; not starting it again: the same failure as its life 1 "
                              "(ValueError: bad shard at /work/train.py:12)"), notes


def test_process_0s_death_still_ends_every_process(tmp_path):
    h, notes = recoverable_harness(tmp_path, restarts=1)
    h.at(1, lambda: kid(h, 0).exit(1))
    outcome = h.run()
    assert (outcome.exit_code, outcome.root_cause, outcome.ran_out) == (1, 0, False)
    assert verdicts(outcome)[1:] == [Verdict.STOPPED] * 3 and not h.backend.again


@pytest.mark.parametrize("announced, mode", [((True, True, False, True), None), ((True,) * 4, False)],
                         ids=["one-process-did-not-enable-it", "no-recoverable"])
def test_a_job_that_is_not_recoverable_fails_fast(tmp_path, announced, mode):
    h, notes = recoverable_harness(tmp_path, restarts=1, announced=announced, mode=mode)
    h.at(1, lambda: kid(h, 2).exit(7))
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.recoverable) == (7, StopReason.FAILURE, False)
    assert verdicts(outcome) == [Verdict.STOPPED, Verdict.STOPPED, Verdict.ROOT_CAUSE, Verdict.STOPPED]
    assert not h.backend.again and not [n for n in notes if "failed" in n or "recoverable" in n]


@pytest.mark.parametrize("restarts", [0, 1])
@pytest.mark.parametrize("late", [0.2, 0.8], ids=["kill-before-the-wait-ends", "kill-after-it"])
def test_others_aborted_by_process_0s_end_and_heard_first_are_its_consequences(tmp_path, restarts, late):
    """Process 0 is SIGKILLed; the coordination service goes with it, and the
    others abort.  Over another host's channel, an abort may be heard first:
    it waits ECHO_WAIT for process 0's end, and nobody goes on or starts again.
    ``late``: process 0's end comes that part of ECHO_WAIT after the abort;
    at 0.2 the stop's kill comes before the wait would have ended."""
    h, notes = recoverable_harness(tmp_path, restarts=restarts)
    h.at(0.9, log, h, 2, HEARTBEAT_ABORT)
    h.at(1, lambda: kid(h, 2).exit(-signal.SIGABRT))
    h.at(1 + ECHO_WAIT * late, lambda: kid(h, 0).exit(-signal.SIGKILL))
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.root_cause) == (137, StopReason.FAILURE, 0)
    assert verdicts(outcome) == [Verdict.ROOT_CAUSE, Verdict.STOPPED, Verdict.CONSEQUENCE, Verdict.STOPPED]
    assert not h.backend.again and not outcome.ran_out
    assert not [n for n in notes if "go on" in n], notes
    for rank in (1, 3):  # stopped as at any failure: stacks, then the kill
        assert kid(h, rank).live_signals == [(START + 1 + ECHO_WAIT * late, signal.SIGUSR1),
                                             (START + 1 + ECHO_WAIT * late + DUMP_WAIT, signal.SIGKILL)]


def test_process_0s_death_after_a_spared_failure_names_the_first_failure(tmp_path):
    h, notes = recoverable_harness(tmp_path, restarts=0)
    h.at(1, lambda: kid(h, 2).exit(7))
    h.at(1 + ECHO_WAIT + 1, lambda: kid(h, 0).exit(1))  # then everyone is stopped
    outcome = h.run()
    assert (outcome.exit_code, outcome.reason, outcome.root_cause) == (7, StopReason.FAILURE, 2)
    assert verdicts(outcome) == [Verdict.CONSEQUENCE, Verdict.STOPPED, Verdict.ROOT_CAUSE, Verdict.STOPPED]
    assert not outcome.ran_out  # process 0's death stopped the job: a whole-job restart may follow
