"""The run's goodput: where the whole run's wall time went, across attempts.

The run's wall time, from jaxrun's start to its end, splits into parts
that sum to it (``PARTS``; the report's ``goodput``, docs/contract.md):

- ``startup``: from each attempt's beginning (jaxrun's own start, for the
  first) to the moment its last process joined the job: placement,
  spawning, imports, whatever the script does before it touches JAX; and
  after the join, the runtime's start (JAX making its backends: about 10 s
  on a TPU host), the slowest process's (``child.watch.marks``);
- ``compile``, ``checkpoint``: from the join to the end of the work, what
  the processes' own events said (``child.watch.marks``: JAX's compile events,
  Orbax's save events, ``jaxrun.checkpointing()``).  The job is
  synchronous, so the slowest process's sum counts (Orbax reports a save
  from its primary host only; the others wait for it);
- ``waiting``: the processes' waiting for one another at collectives, the
  mean over processes of ``waiting_by_rank`` (0 where nothing says);
- ``input``: the host's own compute that the devices waited for, outside
  JAX (the script's input pipeline, its numpy, its Python), and ``idle``:
  the host parked outside JAX (a sleep, a queue's ``get``, a socket's
  read); the mean over processes of their time accounts' ``work`` and
  ``idle`` (``child.watch.accounting``), less the checkpoint saves, which
  are host time of their own.  A process's last record may be seconds
  older than the end of its work (a failure cuts it short): the time after
  it is carried on at the record's shares (``host_seconds``);
- ``stall``: spans in which no process moved for the stall timeout or
  more, that the watchdog judged a stall (``attempt.activity``); a wait it
  let run on (one long program, every process inside JAX at one line) is
  the program's time;
- ``lost``: in an attempt that failed and was restarted, the work done
  after its last checkpoint save, which the next attempt did again; with
  no save seen, all of its work (``unsaved`` names those attempts);
- ``work``: the rest of the time from the join to the end of the work:
  the devices running the steps' programs (what the host waits for inside
  JAX, alone in its job; with several processes a step's own clock also
  holds ``waiting``), docs/time.md;
- ``teardown``: from the end of the work (the first failure, or the
  scripts' return) to the attempt's end, and after the last attempt to
  jaxrun's end;
- ``restart``: between one attempt's end and the next one's beginning.

``account`` is pure: facts in (``AttemptFacts``, one per attempt, on the
launcher's wall clock), the account out, with the spans the timeline
draws.  ``attempt_facts`` reads those facts from an attempt's Outcome.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from jaxrun.core import causes
from jaxrun.core.outcome import Outcome, ProcessRecord

PARTS = ("startup", "compile", "work", "input", "idle", "waiting", "checkpoint", "stall", "restart", "lost",
         "teardown")
HOST = ("input", "idle")  # the host's own time outside JAX, which the devices waited for
# The parts that are the job's own progress; the rest is lost to it.
GOOD = frozenset({"work"})


@dataclasses.dataclass(frozen=True)
class AttemptFacts:
    """One attempt, on the launcher's wall clock.  ``joined_at``: its last
    process joined (None: not every one did); ``work_ended_at``: its first
    failure, or its scripts' return; ``saved_at``: its last checkpoint save
    ended (None: none seen), after which ``compile_after_save`` seconds
    went to compiles; ``failed``: it ended without finishing its work."""

    began_at: float
    joined_at: float | None
    work_ended_at: float
    ended_at: float
    failed: bool = False
    compile: float = 0.0
    checkpoint: float = 0.0
    waiting: float = 0.0
    saved_at: float | None = None
    compile_after_save: float = 0.0
    stills: tuple[tuple[float, float], ...] = ()
    attempt: int = 0  # its number in the run (0: the first), as the report lists it
    runtime_start: float = 0.0  # after the join: JAX making its backends, the slowest process's
    # The host's compute outside JAX, and its time parked outside JAX: the mean over processes
    # of their accounts', each carried on to the end of the work (host_seconds).
    input: float = 0.0
    idle: float = 0.0
    # Where the host spent most of each (``FILE:LINE in FUNCTION``, "" where unsaid), the processes' marks.
    input_at: str = ""
    idle_at: str = ""


@dataclasses.dataclass(frozen=True)
class Account:
    began_at: float  # jaxrun's start, by the wall clock
    wall: float
    parts: dict[str, float]
    spans: tuple[tuple[str, float, float, int], ...]  # (part, begin, end, attempt), for the timeline
    unsaved: tuple[int, ...] = ()  # failed, restarted attempts with no checkpoint seen: their work is lost
    host_at: tuple[str, str] = ("", "")  # where the host spent most of its input, and of its idle time

    @property
    def share(self) -> float:
        """The goodput: the share of the wall time that was the job's work."""
        return sum(self.parts[p] for p in GOOD) / self.wall if self.wall > 0 else 0.0

    def losses(self) -> list[tuple[str, float]]:
        """The parts other than work, largest first, those above zero."""
        return sorted(((p, s) for p, s in self.parts.items() if p not in GOOD and s > 0), key=lambda x: -x[1])

    def to_dict(self) -> dict:
        return {"began_at": self.began_at, "wall": round(self.wall, 3),
                "parts": {p: round(s, 3) for p, s in self.parts.items()}, "share": round(self.share, 4),
                "no_checkpoint": list(self.unsaved), "input_at": self.host_at[0] or None,
                "idle_at": self.host_at[1] or None}


def _overlap(spans: Sequence[tuple[float, float]], begin: float, end: float) -> float:
    """Seconds of ``[begin, end]`` that the spans cover (overlaps counted once)."""
    total, reached = 0.0, begin
    for a, b in sorted(spans):
        a, b = max(a, reached), min(b, end)
        if b > a:
            total += b - a
            reached = b
    return total


def account(run_began: float, run_ended: float, attempts: Sequence[AttemptFacts]) -> Account:
    """Split ``[run_began, run_ended]`` into ``PARTS``; each attempt's
    times are clamped into order first, so the parts always sum to the wall."""
    parts = dict.fromkeys(PARTS, 0.0)
    spans: list[tuple[str, float, float, int]] = []
    unsaved: list[int] = []

    def add(part: str, seconds: float, n: int, begin: float | None = None, end: float | None = None) -> None:
        parts[part] += seconds
        if begin is not None and end is not None and end > begin:
            spans.append((part, begin, end, n))

    reached = run_began
    for i, a in enumerate(attempts):
        n = a.attempt
        began = min(max(a.began_at, reached), run_ended) if i else reached  # jaxrun's own start-up is the first's
        add("restart", began - reached, n, reached, began)
        ended = min(max(a.ended_at, began), run_ended)
        work_end = min(max(a.work_ended_at, began), ended)
        join = work_end if a.joined_at is None else min(max(a.joined_at, began), work_end)
        # The runtime's start follows the join (the script's first JAX call makes the backend): start-up too.
        started = min(join + max(0.0, a.runtime_start), work_end)
        add("startup", started - began, n, began, started)
        join = started
        inside = work_end - join
        stills = [(max(b, join), min(e, work_end)) for b, e in a.stills if min(e, work_end) > max(b, join)]
        stalled = _overlap(stills, join, work_end)
        add("stall", stalled, n)
        spans.extend(("stall", b, e, n) for b, e in stills)
        left = inside - stalled
        compiled = min(max(0.0, a.compile), left)
        add("compile", compiled, n)
        left -= compiled
        # The host's own time.  A save is host time outside JAX too, which the account holds: said
        # once, as the save.
        spent = {"input": a.input, "idle": a.idle}
        idle = max(0.0, spent["idle"] - a.checkpoint)
        computed = max(0.0, spent["input"] - max(0.0, a.checkpoint - spent["idle"]))
        uncompiled = left
        for part, seconds in (("checkpoint", a.checkpoint), ("waiting", a.waiting)):
            taken = min(max(0.0, seconds), left)
            add(part, taken, n)
            left -= taken
        lost, lost_from = 0.0, work_end
        if a.failed and i + 1 < len(attempts) and left > 0:  # the next attempt did this work again
            if a.saved_at is None or not join <= a.saved_at <= work_end:
                unsaved.append(n)
                lost, lost_from = left, join
            else:
                window = work_end - a.saved_at
                waited = a.waiting * window / inside if inside > 0 else 0.0
                lost = window - a.compile_after_save - _overlap(stills, a.saved_at, work_end) - waited
                # Drawn as long as it counts, ending where the work ended: the
                # window's compile and waiting stay in the work's span, whose
                # arguments hold them, so the timeline's spans sum to the parts.
                lost = min(max(0.0, lost), left)
                lost_from = work_end - lost
        # The host's own time outside the work done again (which is lost, the host's with it).
        kept = max(0.0, 1.0 - lost / uncompiled) if uncompiled > 0 else 0.0
        for part, seconds in (("input", computed * kept), ("idle", idle * kept)):
            taken = min(max(0.0, seconds), left - lost)
            add(part, taken, n)
            left -= taken
        add("lost", lost, n, lost_from if lost > 0 else None, work_end)
        add("work", max(0.0, left - lost), n, join, lost_from if lost > 0 else work_end)
        add("teardown", ended - work_end, n, work_end, ended)
        reached = ended
    add("teardown", run_ended - reached, attempts[-1].attempt if attempts else 0, reached, run_ended)
    host_at = tuple(next((getattr(a, f"{p}_at") for a in reversed(attempts) if getattr(a, f"{p}_at")), "")
                    for p in HOST)
    return Account(run_began, max(0.0, run_ended - run_began), parts, tuple(sorted(spans, key=lambda s: (s[1], s[2]))),
                   tuple(unsaved), host_at)


def _launcher_time(at: float | None, marks_clock: str, record: ProcessRecord) -> float | None:
    """A process's wall-clock time on the launcher's clock: as it is where
    both are one machine's; else moved by the difference between the
    launcher's and the far end's sight of the process's end."""
    if at is None or not marks_clock or marks_clock == causes.clock_id():
        return at
    if record.reaped_at is not None and record.clock == marks_clock and record.ended_at is not None:
        return at + (record.ended_at - record.reaped_at)
    return at


def _joined_at(record: ProcessRecord, outcome: Outcome) -> float | None:
    """When a process joined: its account's start (``TimeSplit.began``, its
    join on its own clock, put on the launcher's as its marks say), not
    later than the launcher heard of it (which a loaded machine hears a
    poll or a message late), not before the attempt began."""
    heard = record.joined_at
    split = outcome.splits.get(record.spec.rank)
    clock = record.marks.clock if record.marks is not None else record.clock
    here = clock == causes.clock_id()
    placed = here or (record.reaped_at is not None and record.clock == clock and record.ended_at is not None)
    if heard is None or split is None or not clock or not placed:
        return heard  # no account, or a far clock that nothing puts on the launcher's
    own = _launcher_time(split.began, clock, record)
    return min(heard, max(own, outcome.began_at or own))


def attempt_facts(outcome: Outcome, waiting_by_rank: Mapping[int, float] | None = None) -> AttemptFacts | None:
    """An attempt's facts from its Outcome; None for one that never started
    its processes.  ``waiting_by_rank``: each process's seconds spent
    waiting for the others at collectives (0 where nothing says)."""
    records = [life for record in outcome.records for life in record.lives]
    if outcome.began_at is None or not records:
        return None
    ended = [r.ended_at for r in records if r.ended_at is not None]
    ended_at = max(ended) if ended else outcome.began_at
    joins = [_joined_at(r, outcome) for r in outcome.records]
    joined_at = max(joins) if joins and None not in joins else None
    failed = outcome.reason is not None and not outcome.work_finished
    root = next((r for r in outcome.records if r.spec.rank == outcome.root_cause), None)
    finished = [r.finished_at for r in outcome.records]
    if failed and root is not None and root.ended_at is not None:
        work_end = root.ended_at
    elif finished and None not in finished:
        work_end = max(finished)
    else:
        work_end = min(ended) if ended else ended_at
    saved = [(_launcher_time(r.marks.saved_at, r.marks.clock, r), r.marks.compile_after_save)
             for r in records if r.marks is not None and r.marks.saved_at is not None]
    saved_at, after = max(saved) if saved else (None, 0.0)
    marks = [r.marks for r in records if r.marks is not None]
    waiting = waiting_by_rank or {}
    splits = [outcome.splits[r.spec.rank] for r in outcome.records if r.spec.rank in outcome.splits]
    runtime = max((m.runtime_start for m in marks), default=0.0)
    untold = [max(0.0, work_end - joined_at - runtime - s.covered) if joined_at is not None else 0.0 for s in splits]
    told = max(splits, key=lambda s: s.covered - s.compile, default=None)  # the most told: its shares carry on
    host = {p: sum(host_seconds(s, f, after, told) for s, after in zip(splits, untold)) / len(outcome.records)
            for p, f in zip(HOST, ("work", "idle"))}
    at = {p: max(((getattr(m, f"{p}_at_s"), getattr(m, f"{p}_at")) for m in marks if getattr(m, f"{p}_at")),
                 default=(0.0, ""))[1] for p in HOST}
    return AttemptFacts(
        outcome.began_at, joined_at, work_end, ended_at, failed,
        compile=max((m.compile for m in marks), default=0.0), runtime_start=runtime,
        checkpoint=max((m.checkpoint for m in marks), default=0.0),
        waiting=sum(waiting.get(r.spec.rank, 0.0) for r in outcome.records) / len(outcome.records),
        saved_at=saved_at, compile_after_save=after, stills=outcome.stills,
        input=host["input"], idle=host["idle"], input_at=at["input"], idle_at=at["idle"])


def host_seconds(split, part: str, untold: float, told) -> float:
    """A process's seconds in one of its account's parts (``work``, ``idle``),
    and in the ``untold`` seconds after its last record (a process stopped
    between two records: the others' failure) the share of that part in the
    time less compiles of the attempt's most told account (``told``: the
    job is synchronous, its processes' steps alike)."""
    rest = told.covered - told.compile
    return getattr(split, part) + (getattr(told, part) / rest * untold if rest > 0 else 0.0)


def waiting_by_rank(outcome: Outcome) -> dict[int, float]:
    """Each process's seconds waiting for the others at collectives in this
    attempt, from its newest time account (``contract.TimeSplit``, the
    ``child.watch.accounting`` sampler's); none for a process that sent none
    (``--no-account``, or it never joined)."""
    return {rank: split.waiting for rank, split in outcome.splits.items()}


def of_run(run_began: float, run_ended: float, outcomes: Sequence[Outcome]) -> Account:
    """The account of a run's attempts so far."""
    facts = []
    for number, outcome in enumerate(outcomes):
        found = attempt_facts(outcome, waiting_by_rank(outcome))
        if found is not None:  # else it never started: its time is the restart's
            facts.append(dataclasses.replace(found, attempt=number))
    return account(run_began, run_ended, facts)


# When the summary shows the goodput line (docs/time.md, "When the summary
# shows it"): a run this long, whose fixed costs (start-up, the first
# compiles, the teardown) no longer rule its share ...
WORTH_A_LINE_AFTER = 60.0
# ... or a run of any length that lost time to trouble: a stall, a restart,
# work done again.
TROUBLE = ("stall", "restart", "lost")


def worth_a_line(found: Account) -> bool:
    """Whether the run's goodput tells something: a run of
    WORTH_A_LINE_AFTER seconds or more, or one that lost time to TROUBLE."""
    return found.wall >= WORTH_A_LINE_AFTER or bool(found.unsaved) or \
        any(found.parts[part] >= 0.05 for part in TROUBLE)


# The host's line (docs/time.md): said where the devices waited for the host
# this share of the steps' time or more, in its input or its idle time, and
# the steps took this long at least (a toy's few seconds, mostly its own
# Python around one step, say nothing of the job: issue 68's rule).
HOST_BOUND = 0.2
HOST_LINE_AFTER = 5.0


def host_line(found: Account) -> str | None:
    """One line where the host's own time held the devices back: its share
    of the steps' time (work, waiting, input, idle), the part that holds most
    of it, and the script's line where the host spent most of that."""
    steps = sum(found.parts[p] for p in ("work", "waiting", *HOST))
    part = max(HOST, key=lambda p: found.parts[p])
    if steps < HOST_LINE_AFTER or found.parts[part] < HOST_BOUND * steps:
        return None
    share = sum(found.parts[p] for p in HOST) / steps
    at = found.host_at[HOST.index(part)]
    what = ("input-bound: the script's own compute outside JAX" if part == "input" else
            "idle: the host parked outside JAX, in a sleep, a queue or a read")
    return (f"jaxrun: the devices waited for the host {share:.0%} of the steps' time"
            + (f", mostly at {at}" if at else "") + f" ({what})")


def summary_line(found: Account) -> str:
    """One line: the goodput share and the biggest losses."""
    shown = [(part, seconds) for part, seconds in found.losses() if seconds >= 0.05][:3]  # "0.0 s" says nothing
    losses = ", ".join(f"{part} {seconds:.1f} s" for part, seconds in shown)
    line = f"jaxrun: goodput {found.share:.0%} of {found.wall:.1f} s"
    if losses:
        line += f"; lost to {losses}"
    if found.unsaved:
        which = ", ".join(str(n) for n in found.unsaved)
        line += f" (no checkpoint seen in attempt {which}: its work counted as lost)"
    return line
