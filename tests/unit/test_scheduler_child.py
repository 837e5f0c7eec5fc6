"""A scheduler rank's Child keeps the declared contract, driven over a
socketpair that plays its task's connections: joins come through
``on_join``, the exit and its resources through ``wait``, the error record
into the launcher's error file, and no signal leaves after the exit was heard.
The real srun/mpirun runs are in tests/e2e/test_slurm.py and test_mpirun.py."""

import signal
import socket
import threading

import pytest

from jaxrun import contract
from jaxrun.backends.scheduler.child import RankChild
from jaxrun.core.backend import ChildExit, News, RunHooks
from jaxrun.core.events import Stream
from jaxrun.wire import encoding, tasks

pytestmark = pytest.mark.timeout(30)


class FakeStep:
    """The step's side, recorded instead of acted on."""

    pid = 4242

    def __init__(self, reached: bool = True):
        self.reached = reached
        self.kills = 0
        self.connected: list[RankChild] = []
        self.coordinators: list[str] = []

    def kill(self) -> None:
        self.kills += 1

    def control_connected(self, child: RankChild) -> None:
        self.connected.append(child)

    def set_coordinator(self, address: str) -> None:
        self.coordinators.append(address)


class Task:
    """The task agent's end of the control connection."""

    def __init__(self, child: RankChild):
        self.sock, theirs = socket.socketpair()
        self.died: list[BaseException] = []
        hooks = RunHooks(thread_died=lambda name, error: self.died.append(error))
        self.sock.settimeout(5)
        self.lines = self.sock.makefile("rb")
        child.attach(tasks.CONTROL, theirs, hooks)

    def say(self, msg: encoding.Message) -> None:
        self.sock.sendall(msg.line())

    def hear(self) -> encoding.Message:
        return encoding.decode(self.lines.readline())

    def hang_up(self) -> None:
        self.lines.close()  # the file holds the socket open too
        self.sock.close()


@pytest.fixture
def rank():
    step = FakeStep()
    child = RankChild(3, step)
    yield child, step
    child.finish(-signal.SIGKILL)
    child.stdout.close()
    child.stderr.close()


def test_it_declares_what_the_supervisor_may_rely_on(rank):
    child, _ = rank
    assert child.reports_joins is True
    assert child.pid == FakeStep.pid
    assert child.stream_filter(Stream.STDOUT) is None and child.stream_filter(Stream.STDERR) is None


def test_joined_calls_on_join_and_exit_is_what_wait_returns(rank, tmp_path):
    child, step = rank
    joins = threading.Event()
    states, flags = [], []
    child.news = News(lambda recoverable: (flags.append(recoverable), joins.set()), states.append)
    child.error_file = str(tmp_path / "process-3.error")
    task = Task(child)
    task.say(tasks.Coordinator("node:1234"))
    task.say(tasks.TaskJoined(True))
    task.say(tasks.TaskActivity(contract.IDLE))
    assert joins.wait(5)
    record = contract.ErrorRecord("ValueError", "bad shard", "Traceback ...", 1.5)
    task.say(tasks.Error(record.to_json()))
    used = contract.Resources(123456, 2.5)
    task.say(tasks.Exit(7, used.to_dict()))
    assert task.hear() == tasks.Ack()
    assert states == [contract.IDLE] and flags == [True]  # the recoverable flag came with the join
    assert child.wait() == ChildExit(7, used)
    assert contract.ErrorRecord.load(child.error_file) == record
    assert step.coordinators == ["node:1234"] and step.connected == [child]
    assert not task.died


def test_an_exit_without_resources_has_none(rank):
    child, _ = rank
    task = Task(child)
    task.say(tasks.Exit(127))
    assert task.hear() == tasks.Ack()
    assert child.wait() == ChildExit(127, None)


def test_no_signal_follows_the_exit_it_crossed(rank):
    child, _ = rank
    task = Task(child)
    child.send(signal.SIGUSR1)
    assert task.hear() == tasks.Signal.of(signal.SIGUSR1)
    task.say(tasks.Exit(0))
    assert task.hear() == tasks.Ack()
    child.send(signal.SIGKILL)
    task.sock.settimeout(0.2)
    with pytest.raises(TimeoutError):
        task.lines.readline()


def test_signals_before_the_task_connected_wait_for_it(rank):
    child, step = rank
    child.send(signal.SIGUSR1)
    task = Task(child)
    assert task.hear() == tasks.Signal.of(signal.SIGUSR1)
    assert step.kills == 0


def test_an_ending_signal_ends_a_step_no_task_has_reached():
    step = FakeStep(reached=False)
    child = RankChild(0, step)
    child.send(signal.SIGTERM)
    assert step.kills == 1
    child.finish(-signal.SIGKILL)
    child.send(signal.SIGKILL)  # given up already: nothing more
    assert step.kills == 1


def test_a_lost_connection_ends_the_rank_killed_and_the_note_lands_in_stderr():
    child = RankChild(1, FakeStep())
    Task(child).hang_up()
    assert child.wait() == ChildExit(-signal.SIGKILL, None, lost="its task agent")
    other = RankChild(2, FakeStep())
    other.finish(1, "jaxrun: srun exited with code 1 before this task reported back (see engine.log)\n")
    assert other.stderr.read().endswith(b"(see engine.log)\n")
    assert other.stdout.read() == b""
    assert other.wait() == ChildExit(1, None, lost="the scheduler step")


def test_the_end_facts_of_an_exit_reach_the_child_exit(rank):
    child, _ = rank
    task = Task(child)
    task.say(tasks.Exit(7, None, 1796161488.25, "node-3", 4242))
    assert task.hear() == tasks.Ack()
    assert child.wait() == ChildExit(7, None, 1796161488.25, "node-3", 4242)
