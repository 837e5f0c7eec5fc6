"""The supervisor's decisions, replayed with fake children (no real processes).

Each fake child has real pipes (the output pump needs file descriptors) but
its exit is scripted by the test, and every signal it is sent is recorded.
"""

import os
import signal
import threading

import pytest

from jaxrun.backends.base import Backend
from jaxrun.launcher.console import ConsolePrinter
from jaxrun.reporting import summary as reporting_summary
from jaxrun.launcher.plan import LOCAL_HOST, ProcessSpec
from jaxrun.launcher.outcome import StopReason, Verdict
from jaxrun.launcher.supervisor import Supervisor

pytestmark = pytest.mark.timeout(30)


class FakeChild:
    def __init__(self, rank, ignores=()):
        self.rank, self.ignores = rank, set(ignores)
        self.pid = 100000 + rank
        out_r, self.out_w = os.pipe()
        err_r, self.err_w = os.pipe()
        self.stdout, self.stderr = os.fdopen(out_r, "rb", 0), os.fdopen(err_r, "rb", 0)
        self.signals = []
        self.code = None
        self.done = threading.Event()

    def send(self, signum):
        self.signals.append(signum)
        if signum in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT) and signum not in self.ignores:
            self.exit(-signum)

    def exit(self, code):
        if not self.done.is_set():
            self.code = code
            os.close(self.out_w)
            os.close(self.err_w)
            self.done.set()

    def wait(self):
        self.done.wait()
        return self.code


class FakeSpawner(Backend):
    def __init__(self, ignores=()):
        self.children = {}
        self.ignores = ignores
        self.started = threading.Event()

    def choose_coordinator(self, fixed):
        return "127.0.0.1:1", None

    def spawn(self, spec, lifeline_fd, extra_env, log_fds):
        child = FakeChild(spec.rank, self.ignores)
        self.children[spec.rank] = child
        if len(self.children) == 4:
            self.started.set()
        return child


def specs(n=4):
    return [ProcessSpec(r, r, LOCAL_HOST, "python", (), {}) for r in range(n)]


def supervise(tmp_path, spawner, **kw):
    printer = ConsolePrinter(mode="grouped")  # prints nothing live
    sup = Supervisor(specs(), spawner, printer, str(tmp_path), **kw)
    result = {}
    # A daemon: a test that fails with the supervisor still running must not hang pytest at exit.
    thread = threading.Thread(target=lambda: result.setdefault("outcome", sup.run()), daemon=True)
    thread.start()
    assert spawner.started.wait(10)
    return sup, thread, result


def test_first_failure_is_the_root_cause_and_the_rest_are_stopped(tmp_path):
    spawner = FakeSpawner(ignores={signal.SIGTERM})
    sup, thread, result = supervise(tmp_path, spawner)
    spawner.children[2].exit(7)
    thread.join(10)
    outcome = result["outcome"]
    assert outcome.exit_code == 7 and outcome.root_cause == 2 and outcome.reason is StopReason.FAILURE
    assert [r.verdict for r in outcome.records] == [Verdict.STOPPED, Verdict.STOPPED, Verdict.ROOT_CAUSE, Verdict.STOPPED]
    for rank in (0, 1, 3):  # a stack dump first, then the kill
        assert spawner.children[rank].signals[:2] == [signal.SIGUSR1, signal.SIGKILL]
    summary = reporting_summary.summary_lines(outcome, str(tmp_path))
    assert "jaxrun: process 2 failed first: exit code 7 (pid 100002)" in summary
    assert "jaxrun: processes 0, 1, 3 stopped by jaxrun" in summary


def test_a_failure_after_the_root_cause_is_a_consequence(tmp_path):
    spawner = FakeSpawner()
    sup, thread, result = supervise(tmp_path, spawner)
    spawner.children[0].exit(1)
    while sup.records[0].returncode is None:  # seen first, as a real root cause would be
        threading.Event().wait(0.01)
    spawner.children[3].exit(134)  # its own abort, before jaxrun's SIGKILL
    thread.join(10)
    verdicts = [r.verdict for r in result["outcome"].records]
    assert verdicts[0] is Verdict.ROOT_CAUSE and verdicts[3] is Verdict.CONSEQUENCE
    assert result["outcome"].exit_code == 1
    summary = reporting_summary.summary_lines(result["outcome"], str(tmp_path))
    assert "jaxrun: process 3 failed after the root cause" in summary


def test_clean_exits_are_ok_and_exit_zero(tmp_path):
    spawner = FakeSpawner()
    sup, thread, result = supervise(tmp_path, spawner)
    for child in spawner.children.values():
        child.exit(0)
    thread.join(10)
    assert result["outcome"].exit_code == 0
    assert all(r.verdict is Verdict.OK for r in result["outcome"].records)
    assert all(c.signals.count(signal.SIGUSR1) == 0 for c in spawner.children.values())


def test_signal_is_forwarded_then_killed_after_grace(tmp_path):
    spawner = FakeSpawner(ignores={signal.SIGTERM})
    sup, thread, result = supervise(tmp_path, spawner, grace=0.3)
    sup.post_signal(signal.SIGTERM)
    thread.join(10)
    outcome = result["outcome"]
    assert outcome.exit_code == 143 and outcome.reason is StopReason.SIGNAL
    for child in spawner.children.values():
        assert child.signals[:2] == [signal.SIGTERM, signal.SIGKILL]
        assert set(child.signals[2:]) <= {signal.SIGKILL}  # the end-of-run sweep of each group
    assert all(r.verdict is Verdict.STOPPED for r in outcome.records)


def test_second_sigint_kills_without_waiting_for_grace(tmp_path):
    spawner = FakeSpawner(ignores={signal.SIGINT})
    sup, thread, result = supervise(tmp_path, spawner, grace=60)
    sup.post_signal(signal.SIGINT)
    sup.post_signal(signal.SIGINT)
    thread.join(10)
    assert not thread.is_alive()
    assert result["outcome"].exit_code == 130


def test_timeout_asks_for_stacks_then_stops_with_124(tmp_path):
    spawner = FakeSpawner()
    sup, thread, result = supervise(tmp_path, spawner, timeout=0.2)
    thread.join(10)
    assert result["outcome"].exit_code == 124
    assert all(c.signals[:2] == [signal.SIGUSR1, signal.SIGKILL] for c in spawner.children.values())


def test_sigusr1_to_the_launcher_only_dumps(tmp_path):
    spawner = FakeSpawner()
    sup, thread, result = supervise(tmp_path, spawner)
    sup.post_signal(signal.SIGUSR1)
    deadline = threading.Event()
    while not all(c.signals for c in spawner.children.values()) and not deadline.wait(0.02):
        pass
    for child in spawner.children.values():
        child.exit(0)
    thread.join(10)
    assert result["outcome"].exit_code == 0
    for child in spawner.children.values():
        # A dump request only; the SIGKILLs are the end-of-run sweep for grandchildren.
        assert child.signals[0] == signal.SIGUSR1 and set(child.signals[1:]) <= {signal.SIGKILL}
    assert all(r.verdict is Verdict.OK for r in result["outcome"].records)


def test_sighup_is_forwarded_and_gives_129(tmp_path):
    spawner = FakeSpawner()
    sup, thread, result = supervise(tmp_path, spawner, grace=5)
    sup.post_signal(signal.SIGHUP)
    for child in spawner.children.values():  # well-behaved children leave on the signal
        child.exit(-signal.SIGHUP)
    thread.join(10)
    assert result["outcome"].exit_code == 129
    assert all(c.signals[0] == signal.SIGHUP for c in spawner.children.values())
