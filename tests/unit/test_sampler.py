"""The main thread's one sampler (jaxrun.child.watch.sampler): the stall
watchdog and the time account are served by one thread, on one schedule."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

from jaxrun.child.watch import sampler


class Watchdog:
    def __init__(self, interval: float) -> None:
        self.interval, self.finished = interval, False
        self.begun, self.steps, self.threads = 0, [], set()

    def begin(self) -> None:
        self.begun += 1

    def step(self) -> None:
        self.steps.append(time.monotonic())
        self.threads.add(threading.get_ident())


class Account:
    def __init__(self, looks: int) -> None:
        self.left, self.ticks, self.threads = looks, 0, set()

    def tick(self) -> bool:
        self.ticks += 1
        self.threads.add(threading.get_ident())
        self.left -= 1
        return self.left > 0


def wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert condition()


def test_one_thread_serves_the_watchdog_at_its_interval_and_the_account_at_every_tick():
    one = sampler.MainSampler()
    watchdog = Watchdog(0.2)
    one.add_watchdog(watchdog)
    wait_for(lambda: len(watchdog.steps) >= 2)
    account = Account(looks=40)
    one.add_account(account)
    wait_for(lambda: account.ticks >= 40)
    steps_while_ticking = len(watchdog.steps)
    watchdog.finished = True
    one.thread.join(timeout=10)
    assert not one.thread.is_alive(), "the account over and the watchdog finished: the thread ends"
    assert watchdog.begun == 1
    assert watchdog.threads == account.threads == {one.thread.ident}
    assert one.thread.name.startswith("jaxrun-")  # the watchdog leaves jaxrun's own threads out
    # The watchdog kept its interval while the account ticked (40 ticks of 20 ms: 0.8 s at least).
    gaps = [b - a for a, b in zip(watchdog.steps, watchdog.steps[1:])]
    assert min(gaps) >= 0.2 - 0.02, gaps
    assert steps_while_ticking >= 3


def test_an_account_that_joins_wakes_a_sampler_parked_at_a_long_interval():
    one = sampler.MainSampler()
    watchdog = Watchdog(30.0)
    one.add_watchdog(watchdog)
    time.sleep(0.1)
    account = Account(looks=5)
    started = time.monotonic()
    one.add_account(account)
    wait_for(lambda: account.ticks >= 5, seconds=10)
    assert time.monotonic() - started < 10  # not after the watchdog's 30 s
    assert watchdog.steps == []
    watchdog.finished = True


PROCESS = textwrap.dedent("""
    import os, sys, threading, time
    from jaxrun import contract
    from jaxrun.child.watch import accounting, activity

    env = {contract.ACTIVITY_FILE: sys.argv[1], contract.STALL_TIMEOUT: "2"}
    activity.start(env)
    accounting.joined(env)
    time.sleep(0.5)
    print(sorted(t.name for t in threading.enumerate() if t.name.startswith("jaxrun-")))
    accounting.script_returned()
    activity.script_returned()
    print(open(sys.argv[1]).read().split()[0])
""")


def test_a_process_watched_and_accounted_runs_one_sampler_thread(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROCESS, str(tmp_path / "activity")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    threads, last = out.stdout.splitlines()
    assert threads == "['jaxrun-watch']"
    assert last == "finished"
