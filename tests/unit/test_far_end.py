"""The far-end runner (``backends.far_end``) driven directly, with real
controllers, through each agent's way home: the SSH one (signal lines on a
control fd) and the task agent's (messages on its control connection, plus
the scheduler's own signals).

The promise pinned here: once the controller has been reaped, no signal
goes to its group, from the launcher or the scheduler or as the final
SIGKILL at the launcher's loss; its id may be a stranger's by then.  A pid
cannot be made to be reused on demand, so the group is a recording one: it
notes every signal with whether the leader was still there to hold its id
(alive, or a zombie not yet reaped), and never sends one that would reach
a group whose leader is gone.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time

import psutil
import pytest

from jaxrun import contract
from jaxrun.backends import far_end
from jaxrun.backends.scheduler.task_agent import SchedulerSignals, TaskHome
from jaxrun.backends.ssh.session_agent import SshHome
from jaxrun.core import causes, reaper
from jaxrun.wire import encoding, ssh, tasks

pytestmark = pytest.mark.timeout(60)

# Leaves a grandchild in its group, says so, and ends with status 3 at SIGTERM.
CONTROLLER = """
import json, os, signal, subprocess, sys, time
with open(os.environ["JAXRUN_MARKS_FILE"], "w") as f:  # what the shim's marks would say (child.marks)
    json.dump({"compile": 1.5, "checkpoint": 0.5, "saves": 1, "saved_at": 5.0}, f)
grandchild = subprocess.Popen(["sleep", "60"])
def end(signum, frame):
    print(signal.Signals(signum).name, flush=True)
    sys.exit(3)
signal.signal(signal.SIGTERM, end)
print(grandchild.pid, flush=True)
while True:
    time.sleep(0.05)
"""


class RecordingGroup(reaper.ProcessGroup):
    """A real process group that notes each signal sent to it: (signal,
    whether the leader still held the id, whether the door let it through).
    A signal that would pass once the leader is gone is noted, never sent."""

    def __init__(self, pgid: int):
        super().__init__(pgid)
        self.born = psutil.Process(pgid).create_time()
        self.sent: list[tuple[str, bool, bool]] = []
        self.killed = threading.Event()

    def leader_holds_the_id(self) -> bool:
        try:
            return psutil.Process(self.pgid).create_time() == self.born  # alive, or a zombie
        except psutil.Error:
            return False

    def send(self, signum: int) -> bool:
        held, passes = self.leader_holds_the_id(), not self.is_reaped
        self.sent.append((signal.Signals(signum).name, held, passes))
        delivered = super().send(signum) if held else False
        if signum == signal.SIGKILL and not held:
            self.killed.set()
        return delivered

    def after_the_reap(self) -> list[tuple[str, bool]]:
        """(signal, let through) of each one sent once the leader was gone."""
        return [(name, passes) for name, held, passes in self.sent if not held]


class FakeChannel:
    """The launcher's end of a task agent's control connection: what the
    agent sends, and what the test has it read."""

    def __init__(self) -> None:
        self.incoming: queue.Queue = queue.Queue()
        self.sent: list[encoding.Message] = []
        self.on_send = lambda msg: None

    def read(self) -> encoding.Message | None:
        return self.incoming.get()

    def send(self, msg: encoding.Message) -> None:
        self.sent.append(msg)
        self.on_send(msg)


def run_in_thread(**kwargs) -> tuple[threading.Thread, list, list]:
    """far_end.run in a thread; its result and its group, once known."""
    result, groups = [], []

    def group(pid: int) -> RecordingGroup:
        groups.append(RecordingGroup(pid))
        return groups[-1]

    thread = threading.Thread(target=lambda: result.append(far_end.run(group=group, alone=False, **kwargs)))
    thread.start()
    return thread, result, groups


def gone_or_zombie(pid: int, within: float = 5.0) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            if reaper.ended(psutil.Process(pid)):
                return True
        except psutil.Error:
            return True
        time.sleep(0.02)
    return False


@pytest.fixture
def pipes():
    """The controller's stdout (read, write) and stderr (read, write)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    yield out_r, out_w, err_r, err_w
    encoding.close_all([out_r, out_w, err_r, err_w])


def read_line(fd: int) -> str:
    line = b""
    while not line.endswith(b"\n"):
        data = os.read(fd, 1)
        if not data:
            break
        line += data
    return line.decode().strip()


def test_ssh_far_end_sends_no_signal_to_a_reaped_group(pipes):
    out_r, out_w, err_r, err_w = pipes
    control_r, control_w = os.pipe()
    thread, result, groups = run_in_thread(command=[sys.executable, "-c", CONTROLLER], env=dict(os.environ),
                                           home=SshHome(control_r, err_w), fds=(out_w, err_w))
    try:
        grandchild = int(read_line(out_r))
        sent_at = time.time()
        os.write(control_w, ssh.Signal.of(signal.SIGTERM).line())
        assert read_line(out_r) == "SIGTERM"
        thread.join(20)
        assert result == [3]
        # The launcher's last words come late: a signal, then its loss.
        os.write(control_w, ssh.Signal.of(signal.SIGUSR2).line())
    finally:
        os.close(control_w)
    group = groups[0]
    assert group.killed.wait(20), group.sent
    # The SIGTERM while it ran; the sweep of its leftovers while the dead
    # leader still held the id (so the grandchild is gone too); nothing after.
    assert group.sent[:2] == [("SIGTERM", True, True), ("SIGKILL", True, True)], group.sent
    assert gone_or_zombie(grandchild)
    assert group.after_the_reap() == [("SIGUSR2", False), ("SIGKILL", False)]
    os.set_blocking(err_r, False)
    report = os.read(err_r, 1 << 16)
    home = ssh.parse_home_report(report[report.index(ssh.HOME_REPORT_MARK):])
    assert home is not None, report
    check_facts(home[2], group.pgid, sent_at)
    assert contract.Marks.from_dict(home[2]["marks"]) == contract.Marks(1.5, 0.5, 1, 5.0)  # the run's goodput
    os.close(control_r)


def check_facts(facts: dict, pid: int, signalled_at: float) -> None:
    """The end's facts came home: the controller's own pid, and the time its
    end was seen, by this machine's clock, which it names."""
    assert facts["pid"] == pid and facts["clock"] == causes.clock_id(), facts
    assert signalled_at < facts["reaped_at"] <= time.time(), (facts, signalled_at)


def test_task_far_end_sends_no_signal_to_a_reaped_group(pipes):
    out_r, out_w, _, err_w = pipes
    channel, scheduler = FakeChannel(), SchedulerSignals()

    def launcher_hears(msg: encoding.Message) -> None:
        if isinstance(msg, tasks.Exit):  # too late now: a scheduler's signal, the launcher's, its loss
            scheduler.handle(signal.SIGUSR1)
            channel.incoming.put(tasks.Signal.of(signal.SIGUSR2))
            channel.incoming.put(None)

    channel.on_send = launcher_hears
    home = TaskHome(channel, 0, os.dup(err_w), scheduler)
    thread, result, groups = run_in_thread(command=[sys.executable, "-c", CONTROLLER], env=dict(os.environ),
                                           home=home, fds=(os.dup(out_w), home.err), give_fds=True,
                                           on_start=scheduler.started)
    grandchild = int(read_line(out_r))
    sent_at = time.time()
    scheduler.handle(signal.SIGTERM)  # as the scheduler sends it to the task
    assert read_line(out_r) == "SIGTERM"
    thread.join(20)
    assert result == [3]
    group = groups[0]
    assert group.killed.wait(20), group.sent
    assert group.sent[:2] == [("SIGTERM", True, True), ("SIGKILL", True, True)], group.sent
    assert gone_or_zombie(grandchild)
    # The scheduler's SIGUSR1 is relayed from its own thread, which may come
    # to it after the launcher's loss has been heard.
    late = [("SIGKILL", False), ("SIGUSR1", False), ("SIGUSR2", False)]
    deadline = time.monotonic() + 20
    while len(group.after_the_reap()) < len(late) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sorted(group.after_the_reap()) == late
    assert [type(m) for m in channel.sent] == [tasks.Exit] and channel.sent[0].returncode == 3
    assert channel.sent[0].resources["cpu_seconds"] > 0
    end = channel.sent[0]
    check_facts({"pid": end.pid, "reaped_at": end.reaped_at, "clock": end.clock}, group.pgid, sent_at)
    assert contract.Marks.from_dict(end.marks) == contract.Marks(1.5, 0.5, 1, 5.0)  # the run's goodput


def test_a_controller_that_cannot_start_is_named_on_its_stderr(pipes):
    _, out_w, err_r, err_w = pipes
    missing = "/nonexistent/python"
    ssh = far_end.run([missing], {}, SshHome(-1, err_w), fds=(out_w, err_w), alone=False)
    channel = FakeChannel()
    home = TaskHome(channel, 5, os.dup(err_w), SchedulerSignals())
    task = far_end.run([missing], {}, home, fds=(os.dup(out_w), home.err), give_fds=True, alone=False)
    assert ssh == task == far_end.CANNOT_START
    os.set_blocking(err_r, False)
    said = os.read(err_r, 1 << 16).decode()
    assert said.startswith(f"jaxrun: cannot start {missing!r} on this host: No such file or directory\n"), said
    assert f"jaxrun task 5: cannot start {missing}: " in said
    assert channel.sent == [tasks.Exit(far_end.CANNOT_START)]
