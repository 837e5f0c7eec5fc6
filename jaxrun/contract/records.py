"""What travels from a process to the reports: its error record, the
resources it used, its marks (compiles and checkpoint saves, for the run's
goodput), a scheduler step's note in a task's log, and the flight
recorder's block.  The one way anything reads back what a process left is in
``contract.files``; these records are read through it.

Imported at the first use of one of its names (``contract``'s ``__getattr__``):
a controller's start-up needs none of them."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from collections.abc import Sequence

from jaxrun.contract.files import *  # noqa: F401,F403
from jaxrun.contract.files import read_small
from jaxrun.contract.helpers import signal_name  # noqa: F401
from jaxrun.contract.names import *  # noqa: F401,F403

# -- the error record ------------------------------------------------------------------
# An error record is one exception's headline and traceback.  A larger one (an
# exception with a giant message) is not read: the reports then show the end
# of the log instead, and the root cause is judged from it.
ERROR_RECORD_MAX = 1 << 20


@dataclasses.dataclass(frozen=True)
class ErrorRecord:
    """What a controller's uncaught exception was, left for the run summary."""

    type: str
    message: str
    traceback: str = ""
    at: float = 0.0  # the wall-clock time it was recorded (0: unknown)

    @classmethod
    def of(cls, exc: BaseException, text: str) -> ErrorRecord:
        return cls(type(exc).__qualname__, str(exc), text, time.time())

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ErrorRecord | None:
        try:
            data = json.loads(text)
            return cls(str(data["type"]), str(data["message"]), str(data.get("traceback", "")),
                       float(data.get("at", 0.0)))
        except (ValueError, KeyError, TypeError):
            return None

    @classmethod
    def from_bytes(cls, data: bytes | None) -> ErrorRecord | None:
        """A record from a file's bytes (None: there were none); bad bytes are replaced."""
        return None if data is None else cls.from_json(data.decode("utf-8", "replace"))

    def dump(self, path: str) -> None:
        """Written 0600, as a new file that is never a symlink planted in a
        shared log folder (an old record is replaced, not written through)."""
        try:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json())
        except OSError:
            pass

    @classmethod
    def load(cls, path: str | None) -> ErrorRecord | None:
        """The record at ``path``, read with ``read_small`` up to ERROR_RECORD_MAX."""
        return cls.from_bytes(read_small(path, ERROR_RECORD_MAX)) if path else None

    @classmethod
    def take(cls, path: str) -> ErrorRecord | None:
        """Load a record an agent kept in a private folder of its own, and
        remove both (the record travels home another way)."""
        record = cls.load(path)
        for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
            try:
                remove(target)
            except OSError:
                pass
        return record

    @property
    def headline(self) -> str:
        return f"{self.type}: {self.message}"


# A check's diagnosis on a process's stderr (issue 74): the check's lines
# follow this one.  Every process that judged writes them; the console hides
# them (the log keeps them) and shows the job's one diagnosis in the summary,
# from the root cause's error record, which holds the same lines.
DIAGNOSIS_HEAD = "jaxrun: a check stopped this process; the summary gives the diagnosis below once for the job"


# -- what a process used --------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Resources:
    """What one controller used, measured where it ran, when it ended: the
    peak resident set and the CPU time of the process and of the children it
    waited for (``wait4``), and, where it was SIGKILLed, why jaxrun thinks the
    kernel's OOM killer did it (None otherwise)."""

    peak_rss_bytes: int
    cpu_seconds: float
    oom: str | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Resources | None:
        """None for anything but a well-formed dict (a far end of another version)."""
        if not isinstance(data, dict):
            return None
        try:
            peak, cpu, oom = int(data["peak_rss_bytes"]), float(data["cpu_seconds"]), data.get("oom")
        except (KeyError, TypeError, ValueError):
            return None
        return cls(peak, cpu, None if oom is None else str(oom))


# -- the marks: compiles, checkpoint saves, steps ----------------------------------------
MARKS_MAX = 4096  # bytes: a marks file larger than this is not read
PLACE_MAX = 300  # characters of a place the marks name (input_at, idle_at)


@dataclasses.dataclass(frozen=True)
class Marks:
    """What one process spent on compiles and checkpoint saves, and how many
    steps it marked, as its shim heard it (``child.watch.marks``).  Times are
    seconds; ``saved_at`` and ``written_at`` are the process's wall clock
    (``time.time()``), ``clock`` its machine (``core.causes.clock_id``), so
    the launcher can put them on its own clock.  ``compile_after_save``:
    the compile seconds since the last save ended (all of them before one).
    ``runtime_start``: the seconds JAX took to make its backends (the TPU
    runtime's start), left out of ``compile``.  ``input_at``, ``idle_at``:
    the script's line where the host spent most of its own compute, and
    most of its time parked outside JAX (``FILE:LINE in FUNCTION``, "" where
    none), with their seconds (``child.watch.accounting``, at the script's
    return)."""

    compile: float = 0.0
    checkpoint: float = 0.0
    saves: int = 0
    saved_at: float | None = None  # when the last save ended; None: no save seen
    compile_after_save: float = 0.0
    steps: int = 0
    written_at: float = 0.0
    clock: str = ""
    runtime_start: float = 0.0
    input_at: str = ""
    input_at_s: float = 0.0
    idle_at: str = ""
    idle_at_s: float = 0.0

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> Marks | None:
        """None for anything but a well-formed dict (a far end of another version)."""
        if not isinstance(data, dict):
            return None
        try:
            saved_at = data.get("saved_at")
            return cls(float(data["compile"]), float(data["checkpoint"]), int(data["saves"]),
                       None if saved_at is None else float(saved_at), float(data.get("compile_after_save", 0.0)),
                       int(data.get("steps", 0)), float(data.get("written_at", 0.0)), str(data.get("clock", "")),
                       float(data.get("runtime_start", 0.0)), str(data.get("input_at", ""))[:PLACE_MAX],
                       float(data.get("input_at_s", 0.0)), str(data.get("idle_at", ""))[:PLACE_MAX],
                       float(data.get("idle_at_s", 0.0)))
        except (KeyError, TypeError, ValueError):
            return None

    @classmethod
    def read(cls, path: str) -> Marks | None:
        """The marks a process left at ``path``, or None (none, or unreadable)."""
        data = read_small(path, MARKS_MAX)
        if data is None:
            return None
        try:
            return cls.from_dict(json.loads(data.decode("utf-8", "replace")))
        except ValueError:
            return None


def format_bytes(n: float) -> str:
    """A size as every part of jaxrun prints it: "163.1 MiB"."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


# -- a scheduler step that ended under its tasks ---------------------------------------
# When srun or mpirun ends before a task reported its exit, that task's stderr
# log ends with this one line.  The console leaves it out (the step says it once
# for every such task), and the summary finds it to name the engine failure once.
@dataclasses.dataclass(frozen=True)
class EngineNote:
    engine: str  # "srun", "mpirun"
    how: str  # "exited with code 1", "was killed by SIGKILL"
    started: bool  # whether any task of the step had reached jaxrun
    log: str  # the engine's own output, engine.log

    @classmethod
    def of(cls, engine: str, returncode: int, started: bool, log: str) -> EngineNote:
        how = f"was killed by {signal_name(-returncode)}" if returncode < 0 else f"exited with code {returncode}"
        return cls(engine, how, started, log)

    @property
    def when(self) -> str:
        return "before this task reported back" if self.started else "before any task started"

    def line(self) -> str:
        return f"jaxrun: {self.engine} {self.how} {self.when} (see {self.log})\n"


# Cheap to look for in a chunk of output before any line is parsed.
ENGINE_NOTE_MARKS = (b" before this task reported back (see ", b" before any task started (see ")
_ENGINE_NOTE = re.compile(r"jaxrun: (\S+) (exited with code -?\d+|was killed by \S+(?: \d+)?) "
                          r"before (this task reported back|any task started) \(see (.*)\)\n?")


def parse_engine_note(line: str) -> EngineNote | None:
    m = _ENGINE_NOTE.fullmatch(line)
    return None if m is None else EngineNote(m[1], m[2], m[3] == "this task reported back", m[4])


@dataclasses.dataclass(frozen=True)
class FlightEntry:
    """One execution of a compiled program, as the flight recorder keeps it."""

    seq: int  # this process's executions, from 1
    call: int | None  # among executions that span processes, from 1; None: this process's devices only
    function: str
    occurrence: int  # this process's executions of this function, this one included
    fingerprint: str
    inputs: str  # "f32[8,4],i32[]"
    file: str  # the innermost frame of the user's code that made the call
    line: int

    @property
    def label(self) -> str:
        return f"{self.function}#{self.occurrence}"

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def to_line(self, rank: int) -> str:
        call = "local" if self.call is None else f"call {self.call}"
        return (f"jaxrun: flight[{rank}] #{self.seq} {call} {self.label} fp={self.fingerprint} "
                f"in={self.inputs or '-'} at {self.file}:{self.line}")


@dataclasses.dataclass(frozen=True)
class FlightLog:
    """The last block a controller wrote: where it was, and its last entries."""

    rank: int
    runs: int  # programs run in all, of which ``entries`` are the last
    state: str
    entries: tuple[FlightEntry, ...]


_FLIGHT_BEGIN = re.compile(r"^jaxrun: flight\[(\d+)\] begin: the last \d+ of (\d+) programs run, "
                           r"oldest first; (.+)$", re.M)
_FLIGHT_ENTRY = re.compile(r"^jaxrun: flight\[(\d+)\] #(\d+) (?:call (\d+)|local) (\S+)#(\d+) fp=(\S+) "
                           r"in=(\S+) at (.+):(\d+)$")


def flight_end(rank: int) -> str:
    """The line that closes a process's flight block."""
    return f"jaxrun: flight[{rank}] end"


def flight_block(rank: int, runs: int, state: str, entries: Sequence[FlightEntry]) -> str:
    """The recorder's block, as a controller writes it into its stderr: a line
    a person can read and the summary can find, then one line per entry."""
    lines = [f"jaxrun: flight[{rank}] begin: the last {len(entries)} of {runs} programs run, oldest first; {state}"]
    lines.extend(e.to_line(rank) for e in entries)
    lines.append(flight_end(rank))
    return "\n".join(lines) + "\n"


def parse_flight_block(text: str) -> FlightLog | None:
    """The last block in a log's text; None if there is none.  Lines other
    writers put between its lines are skipped."""
    begins = list(_FLIGHT_BEGIN.finditer(text))
    if not begins:
        return None
    head = begins[-1]
    rank = int(head[1])
    entries = []
    for line in text[head.end():].splitlines():
        if line == flight_end(rank):
            break
        m = _FLIGHT_ENTRY.match(line)
        if m and int(m[1]) == rank:
            entries.append(FlightEntry(int(m[2]), None if m[3] is None else int(m[3]), m[4], int(m[5]), m[6],
                                       "" if m[7] == "-" else m[7], m[8], int(m[9])))
    return FlightLog(rank, int(head[2]), head[3], tuple(entries))
