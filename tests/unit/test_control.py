"""The run's stop flag, signal handlers and watchdog, with real signals and
a real watchdog thread (short slack instead of the real one)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from jaxrun.core.deadline import Deadline
from jaxrun.core.events import SignalReceived, ThreadDied
from jaxrun.core.outcome import INTERNAL_ERROR
from jaxrun.launcher.control import RunControl

pytestmark = pytest.mark.timeout(30)


class Emergency:
    def __init__(self):
        self.calls: list[tuple[str, int, float]] = []
        self.done = threading.Event()

    def __call__(self, why: str, code: int) -> None:
        self.calls.append((why, code, time.monotonic()))
        self.done.set()


@pytest.fixture
def control():
    emergency = Emergency()
    ctl = RunControl(grace=0.2, emergency=emergency, slack=0.3)
    ctl.emergency_calls = emergency
    ctl.install()
    ctl.start_watchdog()
    yield ctl
    ctl.restore()
    ctl.close()


def test_sigterm_sets_the_flag_and_the_watchdog_fires_after_grace_and_slack(control):
    t0 = time.monotonic()
    os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in this (main) thread
    assert control.stopping() and control.signum == signal.SIGTERM
    assert control.events.get_nowait() == SignalReceived(signal.SIGTERM)
    assert control.emergency_calls.done.wait(5)
    why, code, at = control.emergency_calls.calls[0]
    assert code == 128 + signal.SIGTERM
    assert 0.5 - 0.05 <= at - t0 < 3, at - t0
    assert "still running" in why


def test_a_stop_that_ends_in_time_never_fires_it(control):
    control.arm(0.1)
    control.reset()
    time.sleep(1.0)
    assert not control.emergency_calls.calls
    assert not control.stopping()  # arming alone is not a stop


def test_a_dead_thread_stops_the_run_and_is_queued_before_the_flag(control):
    def die():
        raise RuntimeError("boom")

    from jaxrun.core.backend import start_thread

    start_thread("worker:3", die, hooks=control.hooks).join()
    assert control.stopping()
    assert control.events.get_nowait() == ThreadDied("worker:3", "RuntimeError: boom")
    assert control.emergency_calls.done.wait(5)
    assert control.emergency_calls.calls[0][1] == INTERNAL_ERROR


def test_deadline_stops_waits_without_a_signal():
    ctl = RunControl(grace=1)
    ctl.deadline = Deadline(0.5)
    assert not ctl.stopping() and ctl.exit_status() is None
    ctl.deadline = Deadline(-1)  # passed: the same object the supervisor reads
    assert ctl.stopping() and ctl.exit_status() == 124
    ctl.close()
