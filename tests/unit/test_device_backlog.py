"""A loop that waits for its devices every N steps, or never (issue 76): the
account asks its device's probe (``child.watch.backlog``) at looks outside
JAX, and the time outside JAX under a busy device is the devices' time."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from jaxrun.child.watch import accounting, backlog

SCRIPT = ("/work/train.py", "next_batch")
STEP = ("/site-packages/jax/_src/array.py", "block_until_ready")


class Frames:
    """The main thread's stack as the accountant's walk sees it."""

    def __init__(self):
        self.frame = None

    def set(self, filename: str, name: str) -> None:
        code = compile(f"def {name}(): pass", filename, "exec").co_consts[0]
        self.frame = type("Frame", (), {"f_code": code, "f_back": None, "f_lasti": 0, "f_lineno": 1})()

    def __call__(self):
        return {1: self.frame}


class Device:
    """A device whose busy spans are known: it answers, at the verdict after
    an ask, whether it was busy at the asked instant (as the probe does)."""

    def __init__(self, clock, busy):
        self.clock, self.busy, self.asked, self.answer, self.asks = clock, busy, None, None, 0

    def ask(self, code=None) -> None:
        self.answer, self.asks, self.code = self.busy(self.clock[0]), self.asks + 1, code

    def verdict(self):
        answer, self.answer = self.answer, None
        return answer


def run_loop(stage: float, device_step: float, waits_every_step: bool, seconds: float = 60.0, tick: float = 0.0201):
    """The account over a loop of ``stage`` s of the host's compute and a step
    of ``device_step`` s on the device: one that waits for the step (the host
    inside JAX while the device runs it), or one that never waits (the device
    runs it under the next stage)."""
    clock, used = [0.0], [0.0]
    frames = Frames()
    cycle = stage + device_step if waits_every_step else stage

    def busy(t: float) -> bool:
        phase = t % cycle
        return phase >= stage if waits_every_step else phase < device_step

    device = Device(clock, busy)
    account = accounting.Accountant(lambda line: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: used[0], delay=lambda: 0.0, frames=frames, alone=True,
                                    host=lambda: used[0], running=lambda: True, device=device)
    while clock[0] < seconds:
        clock[0] += tick
        used[0] += tick
        inside = waits_every_step and busy(clock[0])
        frames.set(*(STEP if inside else SCRIPT))
        account.look()
    return account.split(), device


def test_a_loop_that_never_waits_gives_the_devices_time_under_the_hosts_stage_to_the_devices():
    """20 ms of the host's compute a step, 8.5 ms of the device's under it (the
    TPU's figures): the devices computed 8.5/20 of the time, and the host's
    own time is the rest.  Without the probe, all of it was the host's."""
    split, device = run_loop(0.0203, 0.0085, waits_every_step=False)  # a cycle the looks' period does not divide
    share = 0.0085 / 0.0203
    assert device.asks > 0.6 * 60 / backlog.PERIOD  # about one ask every PERIOD of the host's time
    # An estimate from about 1200 random instants: its standard error is 1.4% of the time (3 of it, a margin).
    assert split.programs / split.covered == pytest.approx(share, abs=0.045)
    assert split.work / split.covered == pytest.approx(1 - share, abs=0.045)
    assert split.work + split.programs == pytest.approx(split.covered, abs=0.05)  # the last answer's time unasked


def test_a_loop_that_waits_every_step_keeps_its_hosts_time_the_hosts():
    """The device is idle whenever the host is outside JAX: nothing moves,
    and the step's wait is the devices' time as before."""
    split, _ = run_loop(0.020, 0.0085, waits_every_step=True)
    share = 0.0085 / 0.0285
    assert split.programs / split.covered == pytest.approx(share, abs=0.03)  # 20 ms ticks over a 28.5 ms cycle
    assert split.work / split.covered == pytest.approx(1 - share, abs=0.03)


def test_an_account_without_a_probe_reads_as_before():
    clock, used, frames = [0.0], [0.0], Frames()
    frames.set(*SCRIPT)
    account = accounting.Accountant(lambda line: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: used[0], delay=lambda: 0.0, frames=frames, alone=True,
                                    host=lambda: used[0], running=lambda: True)
    for _ in range(100):
        clock[0] += 0.02
        used[0] += 0.02
        account.look()
    assert account.split().work == pytest.approx(2.0) and account.split().programs == 0.0


class Output:
    """A probe's output, done at ``done`` by ``clock``."""

    def __init__(self, clock, done: float):
        self.clock, self.done = clock, done

    def is_ready(self) -> bool:
        return self.clock() >= self.done


def test_the_probe_says_busy_while_it_waits_behind_the_devices_programs_and_idle_after():
    backlog_until = [time.perf_counter() + 0.3]  # programs queued before the probe: 0.3 s of them
    probe = backlog.Backlog(ready=lambda: True)
    made = threading.Event()
    probe.prepare = lambda: made.set() or ((lambda one: Output(time.perf_counter,
                                                              max(backlog_until[0], time.perf_counter()))), None)
    probe.start()
    try:
        probe.ask()  # the first ask makes the probe
        assert made.wait(5)
        time.sleep(0.01)
        backlog_until[0] = time.perf_counter() + 0.3
        probe.ask()
        deadline = time.monotonic() + 5
        while probe.probes < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert probe.verdict() is True  # in flight, behind the backlog: busy now
        assert probe.thread.is_alive() and probe.thread.name.startswith("jaxrun-")
        while probe.flight is not None and time.monotonic() < deadline:
            time.sleep(0.005)
        assert probe.verdict() is True  # the answer for the asked instant, taken once ...
        assert probe.verdict() is None  # ... then nothing new
        probe.ask()
        while probe.probes < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.01)
        assert probe.verdict() is False  # the backlog drained: the device idle at this ask
    finally:
        stopping = time.monotonic()
        probe.stop()
        stopped = time.monotonic() - stopping
    assert not probe.thread.is_alive()  # out of JAX before the script's return goes on to JAX's shutdown
    assert stopped < backlog.STOP_WAIT


def test_no_probe_on_a_cpu_and_none_before_the_scripts_backend_or_its_first_ask():
    ready = threading.Event()
    probe = backlog.Backlog(ready=ready.is_set)
    prepared = []
    probe.prepare = lambda: prepared.append(1) or (None, None)  # a CPU: nothing to probe
    probe.ask()
    assert probe.thread is None  # the script has not made JAX's backend: no thread, and nothing made
    ready.set()
    probe.start()
    time.sleep(0.1)
    assert prepared == []  # not asked yet: nothing made beside the script's first compiles
    ready.clear()
    probe.ask()
    time.sleep(0.1)
    assert prepared == []  # the backend went (or is not yet): this thread never makes it
    ready.set()
    probe.ask()
    probe.thread.join(5)
    assert prepared == [1] and not probe.thread.is_alive()
    probe.ask()
    assert probe.verdict() is None


def test_the_scripts_return_while_the_probes_thread_is_starting_waits_for_it_and_never_fails(monkeypatch):
    """The account's thread starts the probe's at its first ask; the script's
    return stops it from the main thread.  A return that comes while the
    thread is being started waits until it has started and joins it (it once
    found the thread made and not started: ``cannot join thread before it is
    started``, in the script's return, across two network namespaces); a
    return that comes first leaves no thread to start."""
    probe = backlog.Backlog(ready=lambda: True)
    probe.prepare = lambda: (None, None)  # nothing to probe: the thread ends once stopped
    starting, real_start = threading.Event(), threading.Thread.start

    def slow_start(thread):
        if thread.name == backlog.THREAD:
            starting.set()
            time.sleep(0.3)  # the account's thread, descheduled between making the thread and starting it
        real_start(thread)

    monkeypatch.setattr(threading.Thread, "start", slow_start)
    asker = threading.Thread(target=probe.ask)  # the account's thread
    asker.start()
    assert starting.wait(5)
    probe.stop()  # the script returned: no RuntimeError
    asker.join(5)
    assert probe.thread is not None and not probe.thread.is_alive()
    late = backlog.Backlog(ready=lambda: True)
    late.stop()
    late.ask()
    assert late.thread is None


def test_a_parked_main_thread_over_an_idle_device_stops_asking():
    """A job parked outside JAX (a stall) dispatches nothing: once the device was
    seen idle and the main thread parked a second, the probe is asked no more."""
    clock, used, frames = [0.0], [0.0], Frames()
    frames.set("/work/train.py", "wait_forever")
    device = Device(clock, lambda t: False)
    account = accounting.Accountant(lambda line: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: used[0], delay=lambda: 0.0, frames=frames, alone=True,
                                    host=lambda: used[0], running=lambda: False, device=device)
    for _ in range(500):  # 10 s parked
        clock[0] += 0.02
        account.look()
    assert account.split().idle == pytest.approx(10.0)
    assert 0 < device.asks <= 1.5 * accounting.PARKED_QUIET / (0.5 * backlog.PERIOD)


def test_a_probe_is_sent_only_while_the_main_thread_still_runs_the_code_it_was_asked_at():
    """Between the ask (at a look outside JAX) and the probe's dispatch lie a
    wake-up and the GIL: a main thread gone into JAX by then dispatched a
    program the probe would wait behind, though the host's time before it was
    the host's.  So no probe then, and no answer."""
    sent, made = [], threading.Event()
    probe = backlog.Backlog(ready=lambda: True)
    probe.prepare = lambda: made.set() or ((lambda one: sent.append(1) or Output(time.perf_counter, 0.0)), None)
    here = sys._getframe().f_code  # what this (the main) thread runs while it waits below
    probe.start()
    try:
        probe.ask(here)  # the first ask makes the probe
        assert made.wait(5)
        time.sleep(0.01)
        deadline = time.monotonic() + 5
        elsewhere = compile("pass", "/work/train.py", "exec")  # a code the main thread is not in
        probe.ask(elsewhere)
        while probe.moved < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert probe.moved == 1 and sent == [] and probe.verdict() is None
        probe.ask(here)
        while probe.probes < 1 and time.monotonic() < deadline:
            time.sleep(0.005)
        time.sleep(0.01)
        assert sent == [1] and probe.verdict() is False  # still here: sent, and the idle device answers
    finally:
        probe.stop()


def test_the_account_asks_only_from_a_stage_of_the_hosts_not_between_two_calls_into_jax():
    """A main thread that comes out of JAX for one look at a time (a script's
    start, compiling one small program after another) is never asked about;
    one that stays out two looks in a row is, with the code it runs."""
    clock, used, frames = [0.0], [0.0], Frames()
    device = Device(clock, lambda t: False)
    account = accounting.Accountant(lambda line: None, main=1, clock=lambda: clock[0], wall=lambda: 100.0,
                                    cpu=lambda: used[0], delay=lambda: 0.0, frames=frames, alone=True,
                                    host=lambda: used[0], running=lambda: True, device=device)
    for i in range(200):
        clock[0] += 0.02
        used[0] += 0.02
        frames.set(*(SCRIPT if i % 2 else STEP))
        account.look()
    assert device.asks == 0
    frames.set(*SCRIPT)  # one stage: the same code at every look
    for _ in range(50):
        clock[0] += 0.02
        used[0] += 0.02
        account.look()
    assert device.asks > 5 and device.code is frames.frame.f_code
