"""The straggler: the process the others wait for, window after window.

Every process's account (``child.watch.accounting``) comes home as a cumulative
``contract.TimeSplit`` a few times a minute.  Once every process has sent a
new one, the time since the last such moment is a *window*, and each
process's share of it spent waiting inside JAX for the others is compared:

- in a synchronous job, every process waits at each collective for the last
  one to arrive.  A process that arrives last step after step waits the
  least; the others wait for it, each about as long;
- a window *accuses* the process that waited least when every other waited
  ``GAP`` more of its time than it did.  With ordinary jitter each process
  is last now and then, so over a window of many steps they all wait about
  as much and no window accuses anyone;
- the straggler is named while the job runs once ``STREAK`` windows in a row
  accuse the same process (one line, once), and at the end when the whole
  account accuses it and so did at least ``MAJORITY`` of the windows, or it
  was named while the job ran: a summary never takes back a line the job
  printed while the whole account still says it (on a loaded machine the
  first windows, start-up and compiles slowed for every process, accuse
  nobody, and so may a job's last, stopping ones: 3 of 6 windows named a
  straggler live whose summary then said nothing).

``GAP`` comes from measurements (docs/time.md, ``bench/straggler.py``): a clean
4-process job whose every input varies +-10% a step, 10 runs, against the
host-shaped (one input 60% slower) and the throttled (a quarter of a core)
straggler.

The rule reads nothing but the splits, so it is a pure function of the
sequence heard (``tests/unit/test_straggler.py`` replays recorded ones).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

from jaxrun import contract
from jaxrun.core.outcome import Straggler

GAP = 0.10  # of each process's time: how much more every other process waited
STREAK = 2  # windows in a row that accuse one process, to say so while the job runs
MAJORITY = 0.6  # of the windows judged, to name it at the end
MIN_COVERED = 1.0  # seconds: a shorter window (a job's last, cut short by its end) is not judged


def waiting_share(split: contract.TimeSplit) -> float:
    """Its share of its time spent waiting, compiles left out (a first
    window's compile is no step's time)."""
    stepping = split.covered - split.compile
    return split.waiting / stepping if stepping > 0 else 0.0


def gap(window: Mapping[int, contract.TimeSplit]) -> tuple[int | None, float]:
    """(the process that waited least in this window, how much more of its
    time every other one waited: the least of their differences); (None,
    0.0) where fewer than two processes were judged."""
    shares = {rank: waiting_share(s) for rank, s in window.items() if s.covered - s.compile >= MIN_COVERED}
    if len(shares) < 2:
        return None, 0.0
    least = min(shares, key=lambda rank: (shares[rank], rank))
    return least, min(share for rank, share in shares.items() if rank != least) - shares[least]


def accused(window: Mapping[int, contract.TimeSplit]) -> int | None:
    """The process every other one waited ``GAP`` more of its time for, in
    this window; None where there is none."""
    least, by = gap(window)
    return least if least is not None and by >= GAP else None


class StragglerRule:
    """The windows heard so far, and what they say."""

    def __init__(self, hosts: Mapping[int, str], note: Callable[[str], None] = lambda line: None):
        self.names = dict(hosts)  # rank -> host name
        self.running = set(hosts)  # the processes a window waits for
        self.note = note
        self.latest: dict[int, contract.TimeSplit] = {}  # each process's newest split
        self.base: dict[int, contract.TimeSplit] = {}  # each one's split when the last window closed
        self.fresh: set[int] = set()  # processes heard since then
        self.verdicts: list[int | None] = []  # each window's accused
        self.windows: list[tuple[int | None, float]] = []  # each window's least waiting process, and its gap
        self.said: int | None = None  # the process named while the job ran
        # What `jaxrun top` reads from the channel's thread: replaced whole, never changed.
        self.now: tuple[dict[int, float], Straggler | None] = ({}, None)

    def heard(self, rank: int, split: contract.TimeSplit) -> None:
        if rank not in self.running:
            return
        self.latest[rank] = split
        self.fresh.add(rank)
        if self.fresh >= self.running:
            self._close_window()
        found = self.straggler(final=False)
        self.now = (self.shares(), found)
        self._say(found)

    def ended(self, rank: int) -> None:
        """A process ended: windows close without it."""
        self.running.discard(rank)
        if self.fresh and self.fresh >= self.running:
            self._close_window()
            self._say(self.straggler(final=False))

    def _close_window(self) -> None:
        window = {}
        for rank in self.fresh:
            split, base = self.latest[rank], self.base.get(rank)
            same_account = base is not None and base.began == split.began and base.covered <= split.covered
            window[rank] = split.minus(base) if same_account else split
        self.base.update(self.latest)
        self.fresh = set()
        least, by = gap(window)
        if least is None:
            return  # too short to judge
        self.windows.append((least, round(by, 4)))
        self.verdicts.append(least if by >= GAP else None)

    def _say(self, found: Straggler | None) -> None:
        """Say the straggler the job runs with, once: wherever the rule names
        one (`jaxrun top` shows it from ``now``), not only at a window's close.
        The whole account may come to accuse the process the last windows did
        between two closes, as one process's split comes in; top showed it
        then while the console said nothing (a test released its job on top's
        word and found no line)."""
        if found is not None and self.said is None:
            self.said = found.rank
            self.note(f"jaxrun: {found.line()}")

    def shares(self) -> dict[int, float]:
        """Each process's share of its accounted time spent waiting, so far."""
        return {rank: waiting_share(split) for rank, split in self.latest.items()}

    def straggler(self, final: bool = True) -> Straggler | None:
        """The straggler, where the rule names one: the whole account accuses
        it, and so did the last ``STREAK`` windows (while the job runs) or
        ``MAJORITY`` of them (at the end, where it was not named already)."""
        rank = accused(self.latest)
        if rank is None:
            return None
        windows, judged = self.verdicts.count(rank), len(self.verdicts)
        last = self.verdicts[-STREAK:]
        enough = (windows >= MAJORITY * judged or rank == self.said) if final else last == [rank] * STREAK
        if windows < STREAK or not enough:
            return None
        own, others = self.latest[rank], [s for r, s in self.latest.items() if r != rank]
        return Straggler(rank, self.names.get(rank, "?"), statistics.mean(waiting_share(s) for s in others),
                         own.work, own.programs, ratio(own.work, [s.work for s in others]),
                         ratio(own.programs, [s.programs for s in others]), windows, judged)


def ratio(value: float, others: list[float]) -> float:
    typical = statistics.median(others) if others else 0.0
    return value / typical if typical > 1e-6 else 0.0
