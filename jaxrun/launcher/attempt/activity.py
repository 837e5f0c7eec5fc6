"""The stall watchdog (``--stall-timeout``): the launcher's half.

Each process's sampler (``child.watch.activity``) says when the process changes
between busy, idle and spin (its own threads burn CPU while its Python has
not moved: a hang as NCCL's show); a local one writes it to its activity
file, which this watch reads when its ``stat`` changes, and a remote one's
agent sends it home (the SSH stream's marker, the task channel's message),
which the supervisor passes to ``heard``.  No thread: the supervisor's loop
calls ``tick``.  Idle and spin are both "has not moved"; a process's
spinning (how many threads, their CPU) is kept until it moves, for the
stall's record (``Stall.spinning``).

When no running process has moved for the timeout, the watch asks
for stack dumps (``probe``: the supervisor sends SIGUSR1), waits for them
to land in the logs (until every process's dump is whole, looking every
``DUMP_LOOK``; ``PROBE_WAIT`` at most), and reads where each process
waits (the dump's innermost line of the user's code, or JAX's shutdown):

- every process at one place, each parked (``contract.PARKED``: no CPU, no
  I/O, its main thread in a wait of Python's own outside JAX, no thread of
  the script's inside JAX) for the whole timeout, and the dumps say the
  same (the place outside JAX): stuck, however many processes stand there
  (a save does I/O, a working pipeline uses CPU, a long program waits
  inside JAX).  The job has stalled, all of it one group at that place;
- every process at one place otherwise: one long program on an
  accelerator (the CPU idle while the device computes), a collective all
  of them wait in, or a wait this cannot see into; not a stall.  One line
  names the place, at most once per timeout, and the watch waits on;
- a process whose place cannot be read (no dump in its log): the same, a
  line that says so;
- otherwise the job has stalled (:class:`~jaxrun.core.outcome.Stall`):
  the place most processes wait at, and those that stand out; with no
  place holding more processes than every other, every group stands out.

A process that has not said anything yet (its sampler did not start: a
process still being started, a script not run through the shim) keeps the
job from stalling.  So does any process that is busy.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence

from jaxrun import contract
from jaxrun.core.outcome import Place, Stall, StallGroup
from jaxrun.core.spec import ProcessSpec
from jaxrun.launcher.attempt.straggler import StragglerRule
from jaxrun.reporting.stacks import DUMP_TAIL, dump_complete, dumped_state, user_frame, waits_inside_jax

ACCOUNT_POLL = 1.0  # seconds between reads of the local files for the time account alone (no watchdog)
# At most, for the dumps to be written (and, from a far end, to arrive).  The
# wait ends as soon as every dump is whole, so only a dump that never comes
# costs all of it; one that comes after it is not read, and the job is taken
# for one that waits (a second look, a timeout later).  It was 1.5 s: in CI,
# on a loaded machine, a spin job's stall took 7.2 s to end with a 2 s
# timeout, which that second look explains (the dumps' own times were not
# recorded).
PROBE_WAIT = 3.0
DUMP_LOOK = 0.05  # how often the logs are read for whole dumps meanwhile


def activity_path(log_dir: str, rank: int) -> str:
    """Where a local process's sampler writes its state: beside its logs."""
    return os.path.join(log_dir, f"process-{rank}.activity")


def read_after(path: str, offset: int, limit: int = DUMP_TAIL) -> str:
    """A log's text from ``offset`` on (at most its last ``limit`` bytes)."""
    f = contract.open_regular(path)
    if f is None:
        return ""
    with f:
        try:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(offset, size - limit))
            return f.read(limit).decode("utf-8", "replace")
        except OSError:
            return ""


def log_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def place_in(text: str) -> Place:
    """Where the last stack dump in ``text`` found the main thread."""
    state = dumped_state(text)
    frame = user_frame(text)
    if frame is None:
        return Place(None, None, state=state)
    file, line, func, source = frame
    return Place(file, line, func, source, state, inside_jax=waits_inside_jax(text))


INSIDE_JAX = ("inside JAX",)  # the key of the processes that wait inside JAX, beside one that does not


def classify(places: dict[int, Place], seconds: float) -> Stall | None:
    """The stall among these places, or None where they are all one place
    (or one of them is unknown).  Where a process stands still in its own
    code (outside JAX), the processes that wait inside JAX (a collective, a
    result) wait for it, whichever line of theirs reached the wait: they
    are one group, never standing out for their lines."""
    def outside(p: Place) -> bool:
        return p.file is not None and not p.inside_jax and p.state != contract.IN_SHUTDOWN

    merge = any(outside(p) for p in places.values())
    groups: dict[tuple, list[int]] = {}
    for rank in sorted(places):
        place = places[rank]
        key = INSIDE_JAX if merge and place.inside_jax and place.state != contract.IN_SHUTDOWN else place.key
        groups.setdefault(key, []).append(rank)
    if len(groups) < 2 or any(places[ranks[0]].file is None and places[ranks[0]].state != contract.IN_SHUTDOWN
                              for ranks in groups.values()):
        return None
    made = sorted((StallGroup(tuple(ranks), _group_place([places[r] for r in ranks]))
                   for ranks in groups.values()), key=lambda g: (-len(g.ranks), g.ranks))
    if len(made[0].ranks) > 1 and len(made[0].ranks) > len(made[1].ranks):
        return Stall(seconds, made[0], tuple(sorted(made[1:], key=lambda g: (len(g.ranks), g.ranks))))
    return Stall(seconds, None, tuple(sorted(made, key=lambda g: g.ranks)))


def _group_place(places: list[Place]) -> Place:
    """One group's place: its first process's, naming the other lines that
    reached the same wait inside JAX."""
    first = places[0]
    others = tuple(dict.fromkeys(p.at for p in places if p.key != first.key and p.at is not None))
    return dataclasses.replace(first, also=others) if others else first


def parked_stall(places: dict[int, Place], seconds: float) -> Stall | None:
    """Every process at one place of the script's, outside JAX (the dumps'
    word, beside the samplers' ``PARKED``): the stall of all of them, one
    group that stands out; None for any other places."""
    keys = {p.key for p in places.values()}
    first = places[min(places)] if places else None
    if len(keys) != 1 or first.file is None or first.state == contract.IN_SHUTDOWN:
        return None
    if any(p.inside_jax for p in places.values()):
        return None
    return Stall(seconds, None, (StallGroup(tuple(sorted(places)), first),))


def waiting_line(places: dict[int, Place], seconds: float) -> str:
    """The warning when nobody moved but the job has not stalled."""
    unknown = sorted(r for r, p in places.items() if p.file is None and p.state != contract.IN_SHUTDOWN)
    head = f"jaxrun: no process has made progress for {seconds:g} s"
    if unknown:
        who = ("process " if len(unknown) == 1 else "processes ") + ", ".join(map(str, unknown))
        return f"{head}; cannot tell where {who} waits (no stack dump in its log): not taken for a stall"
    place = next(iter(places.values()))
    return (f"{head}; every process waits at {place.text()}: not taken for a stall, as one long program looks "
            f"the same and none of them is known to be parked outside JAX, so the job runs on.")


class ActivityWatch:
    """The busy and idle states of an attempt's processes, and when they stall."""

    def __init__(self, specs: Sequence[ProcessSpec], timeout: float, clock: Callable[[], float],
                 note: Callable[[str], None], stderr_logs: dict[int, str], poll: float | None = None,
                 on_heard: Callable[[int, str], None] = lambda rank, state: None,
                 wall: Callable[[], float] = time.time):
        self.timeout, self.clock, self.note, self.wall = timeout, clock, note, wall
        self.on_heard = on_heard  # every state heard, as said (the attempt's slots follow it)
        self.active = timeout > 0 and len(specs) > 0
        self.running = {s.rank for s in specs}
        self.stderr_logs = stderr_logs
        self.state: dict[int, str] = {}  # rank -> BUSY, IDLE or SPIN, once heard
        self.spinning: dict[int, contract.Spinning] = {}  # its spin since it last moved
        self.idle_since: dict[int, float] = {}
        self.parked_since: dict[int, float] = {}  # since it said PARKED, while it says so
        self.paths: dict[int, str] = {}  # local activity files
        self.seen: dict[int, tuple] = {}
        self.poll = poll if poll is not None else min(1.0, max(0.05, timeout / 20))
        self.quiet_until = 0.0  # after a warning: no new probe before this
        self.probe_at: float | None = None  # the dumps were asked for; read them then
        self.offsets: dict[int, int] = {}  # each stderr log's size when they were
        # Processes whose flight recorder writes its block after each dump: their dump is whole with it.
        self.flight = {s.rank for s in specs if s.env.get(contract.FLIGHT_RECORDER)}
        # The run's goodput: each span, by the wall clock, in which no process moved
        # for at least the timeout (the watchdog's own "no progress") and that ended
        # still (a stall's stop, the attempt's end), and the one open now.  A span a
        # process ended by moving was no stall, whatever its length: one long program
        # that ended before the watchdog's verdict on it (the TPU host read 3.7 s of
        # stall for a 30 s program at --stall-timeout 8).
        self.stills: list[tuple[float, float]] = []
        self.still_from: float | None = None
        # The open still span, once the watchdog let it run (every process at one
        # place, none known to be parked: one long program, a wait it cannot see
        # into): its time is the account's (programs, idle), not a stall's; and
        # whether that was said.
        self.span_let_run = False
        self.span_noted = False
        self.noted: set[str] = set()  # the lines said of spans let run, each said once
        # The time account (child.accounting): each process's newest split, and the straggler rule over them.
        self.accounting = any(s.env.get(contract.ACCOUNT) != contract.ACCOUNT_OFF for s in specs)
        self.latest: dict[int, contract.TimeSplit] = {}
        self.stragglers = StragglerRule({s.rank: s.host.name for s in specs}, note)
        self.told: dict[tuple[int, bool], str] = {}  # (rank, a TIME line) -> the line read last from its file

    def splits(self) -> dict[int, contract.TimeSplit]:
        """Each process's newest cumulative ``contract.TimeSplit`` (its work,
        programs, waiting and compile seconds since its join), by rank."""
        return dict(self.latest)

    def watch(self, rank: int, path: str) -> None:
        self.paths[rank] = path

    def heard(self, rank: int, said: str) -> None:
        """``said``: an activity line (``contract.activity_word``'s, a SPIN line with its details)."""
        split = contract.TimeSplit.of(said)
        if split is not None:
            if rank in self.running:
                self.latest[rank] = split
                self.stragglers.heard(rank, split)
            return
        state = contract.activity_word(said)
        if rank not in self.running or state is None:
            return
        self.on_heard(rank, state)
        if state == contract.FINISHED:  # past its script, in JAX's shutdown: as idle as a wait
            state = contract.IDLE
        if state != contract.BUSY and self.state.get(rank, contract.BUSY) == contract.BUSY:
            self.idle_since[rank] = self.clock()
        if state != contract.PARKED:
            self.parked_since.pop(rank, None)
        elif self.state.get(rank) != contract.PARKED:
            self.parked_since[rank] = self.clock()
        self.state[rank] = state
        self._still_or_moved()
        if state == contract.SPIN:
            self.spinning[rank] = contract.Spinning.of(said)
        if state == contract.BUSY:
            self.spinning.pop(rank, None)
            self.probe_at = None  # someone moved: whatever was asked is moot

    def ended(self, rank: int) -> None:
        """Its end was heard: its file's last word first (a script that returned just before)."""
        if rank in self.paths and rank in self.running:
            self._read_file(rank, self.paths[rank])
        self.running.discard(rank)
        self.stragglers.ended(rank)

    def again(self, rank: int, stderr_log: str) -> None:
        """A process starts again alone (a recoverable job's): watched anew."""
        self.running.add(rank)
        self.stragglers.running.add(rank)
        self.stderr_logs[rank] = stderr_log
        for known in (self.state, self.idle_since, self.parked_since, self.seen, self.offsets, self.spinning):
            known.pop(rank, None)
        self.told = {key: said for key, said in self.told.items() if key[0] != rank}

    def _read_files(self) -> None:
        for rank, path in self.paths.items():
            if rank in self.running:
                self._read_file(rank, path)

    def _read_file(self, rank: int, path: str) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            return
        seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        if seen != self.seen.get(rank):
            self.seen[rank] = seen
            for said in contract.read_activity_file(path):  # its state, its TIME line: each when it changed
                key = (rank, contract.TimeSplit.of(said) is not None)
                if self.told.get(key) != said:
                    self.told[key] = said
                    self.heard(rank, said)

    def _all_idle_since(self) -> float | None:
        if not self.running or any(self.state.get(r, contract.BUSY) == contract.BUSY for r in self.running):
            return None
        return max(self.idle_since[r] for r in self.running)

    def tick(self) -> tuple[float | None, str | Stall | None]:
        """(when to be called again, what to do now): ``"probe"`` (ask every
        process for a stack dump), a :class:`Stall`, or None."""
        if not self.active:
            if not self.accounting:
                return None, None
            self._read_files()
            return self.clock() + ACCOUNT_POLL, None
        self._read_files()
        now = self.clock()
        since = self._all_idle_since()
        if since is None:
            self.probe_at = None
            return now + self.poll, None
        if self.probe_at is not None:
            if now < self.probe_at and not self._dumps_whole():
                return min(self.probe_at, now + DUMP_LOOK), None
            self.probe_at = None
            return self._decide(now)
        due = max(since + self.timeout, self.quiet_until)
        if now < due:
            return min(due, now + self.poll), None
        self.offsets = {r: log_size(self.stderr_logs[r]) for r in self.running}
        self.probe_at = now + PROBE_WAIT
        return now + DUMP_LOOK, "probe"  # looked for whole dumps from then on

    def _dumps_whole(self) -> bool:
        """Every running process's dump, asked for by the probe, is whole in its
        log, with the flight recorder's block after it where that is on."""
        for rank in self.running:
            text = read_after(self.stderr_logs[rank], self.offsets.get(rank, 0))
            if not dump_complete(text):
                return False
            if rank in self.flight and f"\n{contract.flight_end(rank)}\n" not in text:
                return False  # the text is what came after the probe: its block follows the dump
        return True

    def _still_or_moved(self) -> None:
        """Open a still span when every running process stands still, close it when one moves."""
        if not self.active:
            return
        still = self._all_idle_since() is not None
        if still and self.still_from is None:
            self.still_from = self.wall()
        elif not still:
            self._close_still(moved=True)

    def _close_still(self, moved: bool = False) -> None:
        now = self.wall()
        if (self.still_from is not None and now - self.still_from >= self.timeout and not self.span_let_run
                and not moved):
            self.stills.append((self.still_from, now))
        self.still_from = None
        self.span_let_run = self.span_noted = False

    def _decide(self, now: float) -> tuple[float | None, str | Stall | None]:
        places = {r: place_in(read_after(self.stderr_logs[r], self.offsets.get(r, 0))) for r in sorted(self.running)}
        stall = classify(places, self.timeout)
        if stall is None and self._parked_throughout(now):
            stall = parked_stall(places, self.timeout)
        if stall is not None:
            self._close_still()  # the stop that follows is the attempt's teardown
            self.active = False
            spinning = tuple((r, self.spinning[r]) for r in sorted(self.running) if r in self.spinning)
            return None, dataclasses.replace(stall, spinning=spinning)
        # Not a stall: one long program (an accelerator's, or a host callback's on a CPU,
        # its main thread in a jitted call with no frame of JAX's), or a wait nobody can
        # see into.  Its time is what the account says it is; said once while nothing moves.
        self.span_let_run = True
        if not self.span_noted:
            line = waiting_line(places, self.timeout)
            if line not in self.noted:  # the same long program again, or one a blip of CPU cut in two
                self.noted.add(line)
                self.note(line)
            self.span_noted = True
        self.quiet_until = now + self.timeout
        return now + self.poll, None

    def _parked_throughout(self, now: float) -> bool:
        """Every running process has said PARKED, and nothing else, for the
        timeout: no CPU, no I/O, no program of JAX's."""
        return all(r in self.parked_since and now - self.parked_since[r] >= self.timeout for r in self.running)

    def finish(self) -> None:
        """Remove the activity files, and the new copy a sampler had not yet
        renamed over one when its process ended (``contract.write_private``)."""
        self._close_still()
        contract.remove_private(*self.paths.values())  # their folder listed once, not once a process
