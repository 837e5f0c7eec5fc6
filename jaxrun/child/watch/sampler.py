"""One sampler of the main thread, for the stall watchdog and the time account.

One thread of the shim's (``jaxrun-watch``) serves both, on one schedule:
while the account runs (from the join on, unless ``--no-account``) it wakes
every ``TICK`` and the account gives the time since its last look to a part
(``child.watch.accounting``); once the watchdog's interval has passed since
its last judgement, the watchdog judges on the same wake
(``child.watch.activity``).  Without the account the thread wakes at the
watchdog's interval alone.  Both read where the main thread stands through
``child.watch.place``, with one list of JAX's files and waits.

The thread is jaxrun's own (its name says so): its CPU and its reads of
``/proc`` are neither the script's work nor a spin, and the process's CPU
the watchdog and the account read leaves this thread's out.

Nothing here knows what a look finds.  A watch is anything with
``begin()``, ``step()``, ``interval`` and ``finished`` (the watchdog); an
account anything with ``tick() -> bool`` (False: it is over).
"""

from __future__ import annotations

import threading
import time

TICK = 0.02  # seconds between the account's looks
NAME = "jaxrun-watch"


class MainSampler:
    """The thread, and what it serves."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.watchdog = None
        self.account = None
        self.accounted = False  # an account was added: once it is over and no watchdog runs, the thread ends
        self.woken = threading.Event()  # a new account: the schedule changes now, not at the next judgement
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def add_watchdog(self, watchdog) -> None:
        """From the script's first line on (before any account)."""
        with self.lock:
            self.watchdog = watchdog
            self._run()

    def add_account(self, account) -> None:
        """From the join on."""
        with self.lock:
            self.account, self.accounted = account, True
            self.woken.set()
            self._run()

    def _run(self) -> None:
        if self.thread is None:
            self.thread = threading.Thread(target=self.run, name=NAME, daemon=True)
            self.thread.start()

    def run(self) -> None:
        watchdog = self.watchdog
        if watchdog is not None:
            watchdog.begin()
        next_judgement = self.clock() + watchdog.interval if watchdog is not None else None
        while True:
            account = self.account
            if watchdog is None and self.watchdog is not None:  # added after the account (a test's order)
                watchdog = self.watchdog
                watchdog.begin()
                next_judgement = self.clock() + watchdog.interval
            if watchdog is not None and watchdog.finished:
                watchdog = next_judgement = None
            if account is None and watchdog is None:
                if self.accounted:
                    return  # both over: nothing more comes
                self.woken.wait()  # the account comes at the join
                self.woken.clear()
                continue
            # The account's pause: TICK, longer while the main thread stands parked at one place.
            wait = getattr(account, "pause", TICK) if account is not None else \
                max(0.0, next_judgement - self.clock())
            if self.woken.wait(wait):
                self.woken.clear()
            if account is not None and not account.tick():
                self.account = None
            if watchdog is not None and self.clock() >= next_judgement:
                watchdog.step()
                next_judgement = self.clock() + watchdog.interval


shared = MainSampler()  # this process's: the shim's watchdog and the join's account both add to it
