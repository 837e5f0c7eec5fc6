"""The run's event log (``timeline.jsonl`` in the run's log folder), written
as the run goes: attempts, each process's state changes, joins, the
signals jaxrun sends, ends and restarts.  The format and its picture are
``reporting.timeline``'s; ``jaxrun logs --trace`` draws it.

The hooks sit where the facts are made, once: each process's slot tells
``moved`` when its state changes (never per activity sample, only when
busy turns idle or back), the stop sequence tells ``signalled``, and the
run loop tells the attempts' beginnings, ends and restarts.

A line is a few hundred bytes, appended with one ``write`` at each change
(the same local folder the supervisor already makes files in): nothing
waits on a reader.  Lines made before the run's folder exists are kept
until it does.  A write that fails is said in one line, and the run goes
on without its timeline; nothing the processes print is touched.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable

from jaxrun import contract
from jaxrun.core.config import LaunchError
from jaxrun.core.logfiles import create_private
from jaxrun.core.outcome import Outcome, ProcessRecord
from jaxrun.reporting import timeline as words
from jaxrun.reporting.goodput import Account


def warn_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Timeline:
    """The run's event log, one per run (its attempts, in its log folder), used as a context manager."""

    def __init__(self, log_dir: str, warn: Callable[[str], None] = warn_line, clock: Callable[[], float] = time.time):
        self.path = os.path.join(log_dir, words.FILE)
        self.warn, self.clock = warn, clock
        self.attempt = 0
        self.waiting: list[bytes] = []  # lines not yet written: the folder is not there yet
        self.fd: int | None = None
        self.broken = False
        self.joins_heard: set[tuple[int, int, int]] = set()
        self.lock = threading.Lock()  # an interactive run's attempts run in a thread of their own

    def __enter__(self) -> Timeline:
        return self

    def __exit__(self, kind, error, trace) -> None:
        if kind is None:  # a run that raised (bad input) ran nothing to draw
            with self.lock:
                self.write()
        self.close()

    # -- what the run loop tells ---------------------------------------------------------
    def attempt_began(self, attempt: int, log_dir: str, at: float) -> None:
        self.attempt = attempt
        # Written with the attempt's first change: an attempt that cannot
        # start (bad input, say) leaves no file behind in a folder it never made.
        self.add(words.ATTEMPT, at=at, now=False, log_dir=log_dir)

    def attempt_ended(self, outcome: Outcome) -> None:
        lives = [{"rank": life.spec.rank, "life": life.life, "verdict": life.verdict.value if life.verdict else None,
                  "exit": life.exit_status} for record in outcome.records for life in record.lives]
        self.add(words.ATTEMPT_END, exit_code=outcome.exit_code,
                 reason=outcome.reason.value if outcome.reason else None, processes=lives)

    def restart(self, why: str, elastic: bool) -> None:
        self.add(words.RESTART, why=why, elastic=elastic)

    def goodput(self, account: Account) -> None:
        """The run's goodput, at its end: its parts and the spans they lie in."""
        self.add(words.GOODPUT, **account.to_dict(),
                 spans=[[part, round(begin, 6), round(end, 6), attempt] for part, begin, end, attempt in account.spans])

    # -- what the slots and the stop sequence tell ---------------------------------------------
    def moved(self, state: str, record: ProcessRecord) -> None:
        """A process's slot changed state (``attempt.slots``' words)."""
        facts: dict = {"host": record.spec.host.name}
        if state == words.STARTED:
            facts["pid"] = record.pid
        elif state == words.ENDED:
            facts["exit"] = record.exit_status
        self.add(words.STATE, rank=record.spec.rank, life=record.life, state=state, **facts)

    def joined(self, record: ProcessRecord) -> None:
        key = (self.attempt, record.spec.rank, record.life)
        if key not in self.joins_heard:  # once a life, however many times it is heard
            self.joins_heard.add(key)
            self.add(words.JOIN, rank=record.spec.rank, life=record.life)

    def signalled(self, signum: int, ranks: list[int]) -> None:
        if ranks:
            self.add(words.SIGNAL, signal=contract.signal_name(signum), ranks=ranks)

    # -- the file ---------------------------------------------------------------------------
    def add(self, word: str, at: float | None = None, now: bool = True, **facts) -> None:
        if self.broken:
            return
        event = {"t": round(self.clock() if at is None else at, 6), "event": word, "attempt": self.attempt, **facts}
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self.lock:
            self.waiting.append(line)
            if now:
                self.write()

    def write(self) -> None:
        if not self.waiting:
            return
        try:
            if self.fd is None:
                if not os.path.isdir(os.path.dirname(self.path)):
                    return  # the run's folder is made as its first attempt starts
                self.fd = create_private(self.path, os.O_WRONLY | os.O_APPEND)
            data = b"".join(self.waiting)
            self.waiting.clear()
            while data:
                data = data[os.write(self.fd, data):]
        except (OSError, LaunchError) as error:
            why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            self.warn(f"jaxrun: cannot write the run's timeline {self.path} ({why}); the run goes on without it")
            self.broken = True
            self.waiting.clear()
            self.shut()

    def close(self) -> None:
        with self.lock:
            self.shut()

    def shut(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
