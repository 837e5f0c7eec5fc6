"""Start-up progress: how many processes have joined the job, while they do.

A process has *joined* when it arrives at the job's rendezvous: its shim is
about to make the real ``jax.distributed.initialize()`` call (see
``contract.JOINED_FILE``).  Arrival, not the call's return: the coordination
service lets every process's call return together, once the last one is in,
so counting returns would jump from 0 to N.

How the launcher hears of a join depends on the child (its ``reports_joins``):

- a local process (plain or forked by the preloading server) creates its
  joined file in the run's log folder, and :class:`Joins` looks for
  the files of those not yet in, a few times a second (one ``stat`` each);
- a remote process's agent does the looking on its host and tells the
  launcher, however its backend carries it; the child calls the spawn's
  ``on_join``, which reaches the supervisor as an event and ``joined(rank)``.

What the user sees:

- on a terminal (stderr is a tty), a live line redrawn in place,
  ``jaxrun: 6/8 processes joined``; once joining has taken longer than
  ``JOIN_NAMING_AFTER`` seconds it names those not yet in, and their hosts;
  when all are in, it is erased, and where joining took ``SAY_JOINED_AFTER``
  seconds or more it becomes ``jaxrun: 8/8 processes joined in 6.3 s``;
- off a terminal, only that last line, where joining took that long (a
  quick join is all being well: nothing to say; ``-q`` says it never);
- nothing for a one-process job (there is nobody to wait for; its join is
  still heard, for the run's goodput), and nothing
  more once a process has ended without joining (the job is failing, or the
  script never joins): a live line is then erased, never left half drawn.

Everything here is pure but for the ``stat`` calls; the clock and the display
(the console printer's ``status`` and ``note``) are passed in.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

from jaxrun import contract
from jaxrun.core.spec import LOCAL_HOST, ProcessSpec

JOIN_POLL = 0.25  # seconds between looks at the joined files of those not yet in
JOIN_NAMING_AFTER = 5.0  # after this long without everyone, name those not yet in
SAY_JOINED_AFTER = JOIN_NAMING_AFTER  # a join that took this long is worth its line: a slow start-up
MAX_NAMED = 8  # processes named on the live line; the rest are counted


def joined_path(log_dir: str, rank: int) -> str:
    """Where a local process marks its arrival: beside its logs, removed once seen."""
    return os.path.join(log_dir, f"process-{rank}.joined")


def waiting_text(waiting: Sequence[tuple[int, str | None]], limit: int = MAX_NAMED) -> str:
    """``process 3 (host-b), process 5 (host-c) and 4 more``; a host of None
    (this machine) is not named."""
    named = [f"process {rank}" + (f" ({host})" if host else "") for rank, host in waiting[:limit]]
    text = ", ".join(named)
    if len(waiting) > limit:
        text += f" and {len(waiting) - limit} more"
    return text


def live_line(joined: int, total: int, elapsed: float,
              waiting: Sequence[tuple[int, str | None]] = ()) -> str:
    """The line shown while processes join; ``waiting`` names those not yet
    in (empty until joining has taken a while)."""
    line = f"jaxrun: {joined}/{total} processes joined"
    if waiting:
        line += f"; waiting {int(elapsed)} s for {waiting_text(waiting)}"
    return line


def done_line(total: int, elapsed: float) -> str:
    return f"jaxrun: {total}/{total} processes joined in {elapsed:.1f} s"


class Joins:
    """Counts the processes that have joined, and keeps the display up to date.

    The supervisor's loop calls ``tick`` when it returns (a time, or None
    once there is nothing more to do), ``joined`` for a join an agent
    reported, ``ended`` when a process exits, and ``finish`` at the very end.
    """

    def __init__(self, specs: Sequence[ProcessSpec], status: Callable[[str | None], None],
                 note: Callable[[str], None], *, live: bool, clock: Callable[[], float],
                 poll: float = JOIN_POLL, naming_after: float = JOIN_NAMING_AFTER,
                 exists: Callable[[str], bool] = os.path.exists,
                 remove: Callable[[str], None] = None,
                 on_join: Callable[[int, bool], None] = lambda rank, recoverable: None,
                 say_after: float | None = SAY_JOINED_AFTER):
        self.total = len(specs)
        self.hosts = {s.rank: (None if s.host.name == LOCAL_HOST.name else s.host.name) for s in specs}
        self.status, self.note, self.live, self.clock = status, note, live, clock
        self.poll, self.naming_after = poll, naming_after
        self.exists = exists
        self.remove = remove if remove is not None else _unlink
        self.on_join = on_join  # each join as it is heard, and whether the process enabled recoverability
        self.waiting: dict[int, str | None] = {}  # not yet in: rank -> its joined file, if watched
        self.paths: list[str] = []  # every file watched, removed at the end
        self.started: float | None = None
        self.active = True  # False: nothing (more) to look for or show
        # One process has nobody to wait for: nothing is shown, but its join is
        # still heard (the run's goodput counts its start-up to it).
        self.quiet = self.total < 2
        self.shown: str | None = None  # the live line as last drawn
        self.say_after = say_after  # the done line, for a join at least this long (None: never)

    def begin(self, ranks: Iterable[int] | None = None) -> None:
        """The processes start now: the time to join is counted from here."""
        self.started = self.clock()
        self.waiting = {rank: None for rank in (self.hosts if ranks is None else ranks)}

    def watch(self, rank: int, path: str) -> None:
        """Look for ``path``: the process creates it when it joins (a process
        started again alone is not waited for; its file goes at the end)."""
        self.paths.append(path)
        if rank in self.waiting:
            self.waiting[rank] = path

    def joined(self, rank: int, recoverable: bool | None = None) -> None:
        """``recoverable``: as its agent reported it; None: its file says."""
        path = self.waiting.pop(rank, None)
        if recoverable is None:
            recoverable = path is not None and contract.joined_recoverable(path)
        if path is not None:
            self.remove(path)
        self.on_join(rank, recoverable)

    def ended(self, rank: int) -> None:
        """A process exited: if it never joined, not everyone will.  One that
        joined and ended between two looks left its file: it joined."""
        if rank in self.waiting and self.active:
            path = self.waiting[rank]
            if path is not None and self.exists(path):
                self.tick()
                return
            self.waiting.pop(rank)
            self._stop()

    def tick(self) -> float | None:
        """Look for new joins, redraw; when to be called again (None: never)."""
        if not self.active or self.started is None:
            return None
        for rank, path in list(self.waiting.items()):
            if path is not None and self.exists(path):
                self.joined(rank)
        now = self.clock()
        elapsed = now - self.started
        if not self.waiting:
            self.active = False
            line = done_line(self.total, elapsed)
            if self.live and self.shown is not None:
                self.shown = None
                self.status(None)
            if not self.quiet and self.say_after is not None and elapsed >= self.say_after:
                self.note(line)
            return None
        if self.live and not self.quiet:
            named = []
            if elapsed >= self.naming_after:
                named = [(rank, self.hosts.get(rank)) for rank in sorted(self.waiting)]
            line = live_line(self.total - len(self.waiting), self.total, elapsed, named)
            if line != self.shown:
                self.shown = line
                self.status(line)
        return now + self.poll

    def finish(self) -> None:
        """The run is over (every process gone): erase a live line, remove
        the joined files still there."""
        self._stop()
        for path in self.paths:
            self.remove(path)
        self.paths.clear()

    def _stop(self) -> None:
        self.active = False
        if self.shown is not None:
            self.shown = None
            self.status(None)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
