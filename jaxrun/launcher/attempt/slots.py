"""One slot per process of an attempt, and the state it is in.

A slot lives from the attempt's plan to its end.  Its state moves one way
through a life, and a process started again alone begins a new life in the
same slot:

    PENDING -> STARTED -> JOINED -> WORKING <-> WAITING -> FINISHED -> ENDED
                  \\__________\\___________\\_________\\____________/

- PENDING: planned, not yet spawned;
- STARTED: spawned, not yet at the job's rendezvous;
- JOINED: at the rendezvous, its activity not yet heard;
- WORKING / WAITING: busy, or idle or spinning (its threads busy, its
  Python still), as its activity sampler says;
- FINISHED: its script returned, and it is in JAX's shutdown;
- ENDED: its end was heard (or given up on); its record holds the verdict.

The supervisor moves slots on the events it hears; whoever reads the
attempt (the run loop, an interactive frontend) reads the states here.
Every change goes through ``Slot.move``, where the run's timeline hears it
once (``launcher.output.timeline``).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Iterator, Sequence

from jaxrun import contract
from jaxrun.core.backend import Child
from jaxrun.core.logfiles import log_paths
from jaxrun.core.outcome import ProcessRecord, Verdict
from jaxrun.core.spec import ProcessSpec
from jaxrun.launcher.output.timeline import Timeline


class State(enum.Enum):
    PENDING = "pending"
    STARTED = "started"
    JOINED = "joined"
    WORKING = "working"
    WAITING = "waiting"
    FINISHED = "finished"
    ENDED = "ended"


LIVE = frozenset({State.STARTED, State.JOINED, State.WORKING, State.WAITING, State.FINISHED})
# What a process's activity sampler says, as the slot's state.
BY_ACTIVITY = {contract.BUSY: State.WORKING, contract.IDLE: State.WAITING, contract.SPIN: State.WAITING,
               contract.PARKED: State.WAITING, contract.FINISHED: State.FINISHED}


@dataclasses.dataclass
class Slot:
    rank: int
    record: ProcessRecord  # its current life's
    state: State = State.PENDING
    child: Child | None = None  # its current life's
    timeline: Timeline | None = dataclasses.field(default=None, repr=False, compare=False)

    def move(self, state: State) -> None:
        """The one place a slot's state changes: the run's timeline hears each change once."""
        if state is not self.state:
            self.state = state
            if self.timeline is not None:
                self.timeline.moved(state.value, self.record)

    def started(self, child: Child) -> None:
        self.child = child
        self.record.pid = child.pid
        self.move(State.STARTED)

    def joined(self) -> None:
        """Its life reached the job's rendezvous: once a life, however many ways it is heard."""
        if self.record.joined_at is not None:
            return
        self.record.joined_at = time.time()
        if self.state is State.STARTED:
            self.move(State.JOINED)
        if self.timeline is not None:
            self.timeline.joined(self.record)

    def activity(self, said: str) -> None:
        state = BY_ACTIVITY.get(said)
        if state is not None and self.state in LIVE and self.state is not State.FINISHED:
            self.move(state)
            if state is State.FINISHED:
                self.record.finished_at = time.time()

    def ended(self) -> None:
        self.move(State.ENDED)

    def next_life(self, log_dir: str) -> ProcessRecord:
        """A new life for a failed process, alone: the same id, coordinator
        and environment, its own restart count and log files; the failed
        life becomes one of its earlier lives.  The slot is PENDING again."""
        record = self.record
        life = record.life + 1
        attempt = int(record.spec.env.get(contract.RESTART_COUNT, "0")) - record.life  # the attempt's own count
        env = {**record.spec.env, contract.PROCESS_RESTARTS: str(life), contract.RESTART_COUNT: str(attempt + life)}
        spec = dataclasses.replace(record.spec, env=env)
        record.verdict = Verdict.RESTARTED
        self.record = ProcessRecord(spec, *log_paths(log_dir, spec.rank, life), life=life, earlier=record.lives)
        record.earlier = []
        self.child = None
        self.move(State.PENDING)
        return self.record

    def back_to(self, record: ProcessRecord) -> None:
        """A new life that could not start: the failed one is the last again."""
        record.earlier, self.record = self.record.earlier[:-1], record
        self.move(State.ENDED)


class Slots:
    """The attempt's slots, by rank, in the plan's order."""

    def __init__(self, specs: Sequence[ProcessSpec], log_dir: str, timeline: Timeline | None = None):
        self.timeline = timeline  # the run's, which hears every slot's changes, and the signals sent
        self.by_rank = {spec.rank: Slot(spec.rank, ProcessRecord(spec, *log_paths(log_dir, spec.rank)),
                                        timeline=timeline) for spec in specs}
        self._list = list(self.by_rank.values())
        self._cursor = 0  # where ``any_running`` last found a running process

    def __getitem__(self, rank: int) -> Slot:
        return self.by_rank[rank]

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.by_rank.values())

    def running(self) -> list[int]:
        return [slot.rank for slot in self if slot.state in LIVE]

    def any_running(self) -> bool:
        """Whether some process runs: asked at every event, so the search
        starts where the last one found a running process."""
        slots = self._list
        for k in range(len(slots)):
            i = (self._cursor + k) % len(slots)
            if slots[i].state in LIVE:
                self._cursor = i
                return True
        return False

    def children(self) -> list[Child]:
        """Every life's child that was started, the ended ones too (their groups may hold grandchildren)."""
        return [slot.child for slot in self if slot.child is not None]

    def records(self) -> list[ProcessRecord]:
        return [slot.record for slot in self]

    def states(self) -> dict[int, State]:
        return {slot.rank: slot.state for slot in self}
