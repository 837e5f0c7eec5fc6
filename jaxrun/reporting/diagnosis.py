"""How one attempt ended, read from its files once: the console summary, the
JSON report, JUnit and the GitHub annotation only format it (as torch's
``ChildFailedError`` carries its failures).

``diagnose`` reads each log at most once, and only through the contract's
guarded reader (a regular file, never a link, never more than a bound): every
process's stderr log when the attempt stopped (the stack dumps and flight
records there say where each one was), the root cause's error record, and its
stdout log where its stderr is empty, and the engine's log after an engine
failure.  The run loop keeps the result on the outcome (``attach``), so the
JSON report, rewritten after every attempt, reads no earlier attempt again.
"""

from __future__ import annotations

import dataclasses
import enum

from jaxrun import contract
from jaxrun.contract import ErrorRecord, FlightLog, signal_name
from jaxrun.core import causes
from jaxrun.core.outcome import Outcome, ProcessRecord, Stall, StallGroup, StopReason, Verdict
from jaxrun.core.ranks import format_ranks
from jaxrun.reporting.stacks import DUMP_TAIL, Frame, dumped_state, last_place, raised_at

TAIL_LINES = 15  # the lines of a log the reports quote
# JUnit's system-out and system-err: it leaves JAX's noise lines out of these,
# then keeps TAIL_LINES.
OUTPUT_LINES = 4 * TAIL_LINES
# How many of a log's last lines may hold the coordination service's error,
# with the fatal check's stack and a stack dump after it.
DUMP_LINES = 200
# How much of the end of a log those lines come from: logs may be many gigabytes.
LOG_TAIL = 64 * 1024
ENDED_BY_OTHERS = (Verdict.STOPPED, Verdict.CONSEQUENCE, Verdict.NOT_STARTED)
# The signals a process raises on itself when it crashes: the same one at the
# same line twice is the same bug (SIGKILL or SIGTERM come from outside).
CRASH_SIGNALS = frozenset({"SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT"})


class Kind(enum.Enum):
    """How the attempt ended, as the reports name it first."""

    SUCCESS = "success"
    START_ERROR = "start error"  # it never started its processes
    ENGINE_FAILURE = "engine failure"  # the scheduler step failed under its tasks
    PROCESS_FAILURE = "process failure"  # a process failed first: the root cause
    FAILURE = "failure"  # a failure that names no process
    TIMEOUT = "timeout"
    STALL = "stall"  # the stall watchdog stopped it: the root cause is the process that stands out
    # A task registered a second time with the coordination service (from
    # outside the job, or a process joining twice): no process is to blame.
    SECOND_REGISTRATION = "second registration"
    SIGNAL = "signal"
    INTERNAL = "internal error"


@dataclasses.dataclass(frozen=True)
class EngineFailure:
    """A scheduler step that failed under its tasks, and every process it ended."""

    note: contract.EngineNote
    ranks: tuple[int, ...]
    log_tail: tuple[str, ...] = ()  # the end of the engine's own output

    @property
    def headline(self) -> str:
        who = ("process " if len(self.ranks) == 1 else "processes ") + format_ranks(self.ranks)
        if self.note.started:
            what = f"before {who} reported back"
        else:
            what = f"before any task started; {who} never ran"
        return f"{self.note.engine} failed first: it {self.note.how} {what}"


@dataclasses.dataclass(frozen=True)
class RootCause:
    """The process that failed first, and what it left."""

    rank: int
    host: str
    where: str  # "process 2 on hostB"
    pid: int | None
    exit: str  # describe_exit
    error: ErrorRecord | None  # its error record, if it left one
    oom: str | None
    stderr_tail: tuple[str, ...]  # its stderr log's last TAIL_LINES lines
    output_path: str  # its stderr log, or its stdout log where stderr is empty
    output: tuple[str, ...]  # that log's last TAIL_LINES lines
    # What makes it the same failure as another attempt's (``attempt_fingerprint``):
    # ("exception", type, message, file, line) or ("signal", name, file, line),
    # at the innermost line of the user's code; a crash signal with no line
    # dumped: ("crash", name, process id, phase); None where nothing pins it
    # (a lost host, an exit code alone, a SIGKILL or SIGTERM from outside).
    fingerprint: tuple | None = None
    place: str | None = None  # a stall's: FILE:LINE where it stood out
    error_path: str = ""  # where its error record is

    @property
    def at(self) -> str | None:
        """The line of the user's where it failed (or stood out), FILE:LINE."""
        if self.place is not None or self.fingerprint is None or self.fingerprint[0] in ("stall", "crash"):
            return self.place
        return f"{self.fingerprint[-2]}:{self.fingerprint[-1]}"

    @property
    def failure(self) -> str:
        """The failure in a few words: "ValueError: bad batch at train.py:12"."""
        if self.place is not None:  # a stall: its exit says where already
            return self.exit
        if self.error is None:
            what = self.exit
        else:
            what = f"{self.error.type}: {self.error.message}" if self.error.message else self.error.type
        return what if self.at is None else f"{what} at {self.at}"


@dataclasses.dataclass(frozen=True)
class ProcessFacts:
    """What one process's logs say, for the lines about every process."""

    rank: int
    frame: Frame | None = None  # after a stop: its last stack dump's innermost frame of user code
    flight: FlightLog | None = None  # its flight recorder's last block (--flight-recorder)
    state: str | None = None  # in the script, or past it (contract.IN_SCRIPT, ...)
    stdout: tuple[str, ...] = ()  # with outputs only: each log's last OUTPUT_LINES lines
    stderr: tuple[str, ...] = ()
    # After a failure, a process the others' end stopped that raised an error of
    # its own all the same: its (type, message), from its error record.
    raised: tuple[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    kind: Kind
    root: RootCause | None
    engine: EngineFailure | None  # set with root: the engine ended the root cause
    processes: tuple[ProcessFacts, ...]  # in the outcome's record order
    outputs: bool  # whether processes hold every log's last lines
    stall: Stall | None = None  # what the stall watchdog found (kind STALL)
    second_registration: int | None = None  # the task id registered twice (kind SECOND_REGISTRATION)


def describe_exit(record: ProcessRecord) -> str:
    code = record.returncode
    if code is None:
        return "still running"
    how = f"killed by {signal_name(-code)}" if code < 0 else f"exit code {code}"
    if record.lost:  # what stands in for the process's end: its helper's
        ended = "closed" if record.lost.startswith("the connection") else "ended"
        return f"{record.lost} {ended} before the process's end came home ({how})"
    return how


def where(record: ProcessRecord) -> str:
    host = record.spec.host.name
    return f"process {record.spec.rank}" + ("" if host == "localhost" else f" on {host}")


def tail(path: str, n: int = TAIL_LINES) -> list[str]:
    """A log's last ``n`` lines (of its last LOG_TAIL bytes)."""
    return _lines(contract.read_tail(path, LOG_TAIL))[-n:]


def _lines(data: bytes | None) -> list[str]:
    return [] if data is None else data[-LOG_TAIL:].decode("utf-8", "replace").splitlines()


def diagnose(outcome: Outcome, outputs: bool = False) -> Diagnosis:
    """Read the attempt's files once.  ``outputs``: keep every log's last
    lines too (JUnit's)."""
    records = outcome.records
    stopped = outcome.reason is not None
    read_stderr = stopped or outputs or outcome.root_cause is not None
    processes, notes, stderr_lines = [], [], []
    for rec in records:
        data = rec.stderr_tail(DUMP_TAIL if stopped else LOG_TAIL) if read_stderr else None
        lines = _lines(data)
        stderr_lines.append(lines)
        notes.append(contract.parse_engine_note(lines[-1]) if lines else None)
        facts = ProcessFacts(rec.spec.rank)
        if stopped and data:
            facts = _stack_facts(rec, data.decode("utf-8", "replace"))
        if outcome.root_cause is not None and rec.verdict in ENDED_BY_OTHERS and rec.error_file:
            own = ErrorRecord.load(rec.error_file)
            facts = facts if own is None else dataclasses.replace(facts, raised=(own.type, own.message))
        if outputs:
            facts = dataclasses.replace(facts, stdout=tuple(tail(rec.stdout_log, OUTPUT_LINES)),
                                        stderr=tuple(lines[-OUTPUT_LINES:]))
        processes.append(facts)
    root = engine = None
    twice = _second_registration(outcome, stderr_lines)
    if twice is not None:
        pass  # every process aborted because the service was told so: none of them is the cause
    elif outcome.stall is not None:
        root = _stall_root(outcome.stall, records, stderr_lines)
    elif outcome.root_cause is not None:
        i = outcome.root_cause
        root = _root_cause(records[i], stderr_lines[i], processes[i].stdout if outputs else None)
        root = _with_fingerprint(root, records[i], processes[i].frame)
        if notes[i] is not None:
            ranks = tuple(sorted(r.spec.rank for r, note in zip(records, notes)
                                 if r.verdict in ENDED_BY_OTHERS + (Verdict.ROOT_CAUSE,) and note == notes[i]))
            engine = EngineFailure(notes[i], ranks, tuple(tail(notes[i].log)))
    kind = Kind.SECOND_REGISTRATION if twice is not None else _kind(outcome, root, engine)
    return Diagnosis(kind, root, engine, tuple(processes), outputs, outcome.stall, twice)


def _second_registration(outcome: Outcome, stderr: list[list[str]]) -> int | None:
    """The task id the coordination service saw register twice, where a
    failed attempt's logs say so (the service's error reaches every task)."""
    if outcome.root_cause is None:
        return None
    for lines in stderr:
        task = causes.second_registration("\n".join(lines[-DUMP_LINES:]))
        if task is not None:
            return task
    return None


def _stall_root(stall: Stall, records: list[ProcessRecord], stderr: list[list[str]]) -> RootCause:
    """A stall's root cause: the first process that stands out (with no
    place holding most processes, the first of them all), at its place."""
    group = stall.odd[0]
    i = next(i for i, rec in enumerate(records) if rec.spec.rank == group.ranks[0])
    rec = records[i]
    exit = f"stalled at {group.place.text()}{spun(group, stall)}"
    if stall.waiting is None:  # no place holds most: the others' places belong to it too
        exit += "".join(f"; {group_name(g, records)} at {g.place.text()}{spun(g, stall)}" for g in stall.odd[1:])
    return RootCause(rec.spec.rank, rec.spec.host.name, where(rec), rec.pid,
                     exit, None, None, tuple(stderr[i][-TAIL_LINES:]),
                     rec.stderr_log, (), stall.fingerprint, group.place.at)


def group_name(group: StallGroup, records: list[ProcessRecord]) -> str:
    """"process 1 on hostB", "processes 0, 2"."""
    if len(group.ranks) == 1:
        rec = next((r for r in records if r.spec.rank == group.ranks[0]), None)
        return where(rec) if rec is not None else f"process {group.ranks[0]}"
    return "processes " + ", ".join(map(str, group.ranks))


def spun(group: StallGroup, stall: Stall) -> str:
    """What the group's processes whose own threads spun while their Python
    stood still (a native busy wait, as NCCL's in a hang) did, in brackets;
    "" where none did."""
    spinning = dict(stall.spinning)
    said = [(rank, spinning[rank]) for rank in group.ranks if rank in spinning]
    if not said:
        return ""
    if len(group.ranks) == 1:
        s = said[0][1]
        return f" (its Python stood still while {s.threads} of its own threads spun, {_cpu(s, 'cores of CPU')})"
    each = ", ".join(f"process {rank}: {s.threads} threads, {_cpu(s, 'cores')}" for rank, s in said)
    return f" (their Python stood still while their own threads spun: {each})"


def _cpu(spinning, unit: str) -> str:
    """"1.95 cores of CPU"; for threads that spun though the machine's load
    left them next to none (the kernel preempting them again and again,
    ``child.watch.activity.starved_spinners``), says so."""
    if spinning.cores < 0.005:
        return "starved of CPU by the machine's load"
    return f"{spinning.cores:.2f} {unit}"


def stall_lines(stall: Stall, records: list[ProcessRecord]) -> list[str]:
    """The stall in two lines: how long, then who stands out and where the
    others wait (and whose threads spun there)."""
    head = f"the job stalled: no process made progress for {stall.seconds:g} s"
    if stall.waiting is None and len(stall.odd) == 1:  # every process at one line, parked outside JAX
        group = stall.odd[0]
        return [head, f"{group_name(group, records)} {'stand' if len(group.ranks) > 1 else 'stands'} still at "
                      f"{group.place.text()}, parked outside JAX with no CPU and no I/O"]
    if stall.waiting is None:
        parts = "; ".join(f"{group_name(g, records)} at {g.place.text()}{spun(g, stall)}" for g in stall.odd)
        return [head, f"the processes wait at different places: {parts}"]
    odd = "; ".join(f"{group_name(g, records)} {'stand' if len(g.ranks) > 1 else 'stands'} out, at "
                    f"{g.place.text()}{spun(g, stall)}" for g in stall.odd)
    waiting = stall.waiting
    return [head, f"{odd}; {group_name(waiting, records)} {'wait' if len(waiting.ranks) > 1 else 'waits'} "
                  f"at {waiting.place.text()}{spun(waiting, stall)}"]


def _stack_facts(rec: ProcessRecord, text: str) -> ProcessFacts:
    log = contract.parse_flight_block(text)
    state = log.state if log is not None else dumped_state(text)
    return ProcessFacts(rec.spec.rank, last_place(text), log if log is not None and log.rank == rec.spec.rank else None,
                        state)


def _root_cause(rec: ProcessRecord, stderr: list[str], stdout: tuple[str, ...] | None) -> RootCause:
    """``stdout``: its stdout log's last lines, where they were read already.
    A fatal error's dump (faulthandler: the process aborted) is left out of
    its last lines: what came before it says why, and the dump's main thread
    is its line (``ProcessFacts.frame``)."""
    fatal = next((i for i in range(len(stderr) - 1, -1, -1) if stderr[i].startswith("Fatal Python error:")), None)
    stderr = stderr if fatal is None or fatal == 0 else stderr[:fatal]
    output_path, output = rec.stderr_log, stderr[-TAIL_LINES:]
    if any(loss.stream == "stderr" and loss.tail for loss in rec.losses):
        output_path += " (and what jaxrun kept of it in memory once the file stopped)"
    if not output:
        lines = list(stdout[-TAIL_LINES:]) if stdout is not None else tail(rec.stdout_log)
        output_path, output = (rec.stdout_log, lines) if lines else (rec.stderr_log, [])
    return RootCause(rec.spec.rank, rec.spec.host.name, where(rec), rec.pid, describe_exit(rec),
                     ErrorRecord.load(rec.error_file), rec.resources.oom if rec.resources else None,
                     tuple(stderr[-TAIL_LINES:]), output_path, tuple(output), error_path=rec.error_file or "")


def _with_fingerprint(root: RootCause, rec: ProcessRecord, frame: Frame | None) -> RootCause:
    """``root`` with its fingerprint: its exception at the line of the user's
    that raised it, or the crash signal at the line its stack dump shows
    (where the process dumped one: PYTHONFAULTHANDLER); with no line, the
    same crash signal in the same process in the same phase of its life
    (start-up, work, teardown) is the same failure."""
    if rec.lost:  # a host or a connection went away: that is not the user's bug
        return root
    if root.error is not None:
        line = raised_at(root.error.traceback)
        if line is None:
            return root
        return dataclasses.replace(root, fingerprint=("exception", root.error.type, root.error.message, *line))
    code = rec.returncode
    if code is not None and code < 0 and signal_name(-code) in CRASH_SIGNALS:
        if frame is not None:
            return dataclasses.replace(root, fingerprint=("signal", signal_name(-code), frame[0], frame[1]))
        return dataclasses.replace(root, fingerprint=("crash", signal_name(-code), rec.spec.rank, rec.phase))
    return root


def run_failure(rec: ProcessRecord) -> tuple[tuple | None, str]:
    """One failed run of one process, read from its files: its fingerprint
    (None: unknown) and its failure in short, for a process that restarts
    alone (``launcher.restarts.policy``)."""
    data = rec.stderr_tail(DUMP_TAIL)
    lines = _lines(data)
    frame = _stack_facts(rec, data.decode("utf-8", "replace")).frame if data else None
    root = _with_fingerprint(_root_cause(rec, lines, None), rec, frame)
    return root.fingerprint, root.failure


def attempt_fingerprint(found: Diagnosis) -> tuple | None:
    """What makes an attempt's failure the same as another's, as a
    deterministic bug's is: its root cause's fingerprint; None (never the
    same) where no process is to blame or the engine failed."""
    if found.root is None or found.engine is not None:
        return None
    return found.root.fingerprint


_KINDS = {StopReason.TIMEOUT: Kind.TIMEOUT, StopReason.SIGNAL: Kind.SIGNAL, StopReason.INTERNAL: Kind.INTERNAL,
          StopReason.FAILURE: Kind.FAILURE}


def _kind(outcome: Outcome, root: RootCause | None, engine: EngineFailure | None) -> Kind:
    if outcome.start_error is not None:
        return Kind.START_ERROR
    if outcome.stall is not None:
        return Kind.STALL
    if engine is not None:
        return Kind.ENGINE_FAILURE
    if root is not None:
        return Kind.PROCESS_FAILURE
    return Kind.SUCCESS if outcome.reason is None else _KINDS.get(outcome.reason, Kind.FAILURE)


def attach(outcome: Outcome, outputs: bool = False) -> Diagnosis:
    """The outcome's diagnosis, made once and kept on it (the run loop's)."""
    found = outcome.diagnosis
    if not isinstance(found, Diagnosis) or (outputs and not found.outputs):
        found = outcome.diagnosis = diagnose(outcome, outputs)
    return found


def of(outcome: Outcome, outputs: bool = False) -> Diagnosis:
    """The diagnosis kept on the outcome, or, where it has none (or one without
    the outputs asked for), a new one that is not kept: an outcome the caller
    may still change must not answer with what its files said before."""
    found = outcome.diagnosis
    if isinstance(found, Diagnosis) and (found.outputs or not outputs):
        return found
    return diagnose(outcome, outputs)
