"""What travels from a process to the reports: its error record, the
resources it used, a scheduler step's note in a task's log, and the flight
recorder's block; and the one way anything reads back what a process left."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import stat
import time
from collections.abc import Sequence
from typing import BinaryIO

from jaxrun.contract.helpers import signal_name  # noqa: F401
from jaxrun.contract.names import *  # noqa: F401,F403
from jaxrun.contract.names import BUSY, FINISHED, IDLE, RECOVERABLE, SPIN

# -- reading back what a process left ---------------------------------------------------
# Every log and record is read after a run through these three: only a regular
# file, never through a symlink, and never more than a bound, so that a FIFO or
# a device put in a log's place cannot block the launcher, a link cannot lead
# it elsewhere, and a log of many gigabytes costs neither memory nor time.

def open_regular(path: str) -> BinaryIO | None:
    """``path`` opened for reading if it is a regular file (not a symlink);
    None otherwise, or if it cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return os.fdopen(fd, "rb")
    except OSError:
        pass
    os.close(fd)
    return None


def read_tail(path: str, size: int) -> bytes | None:
    """The last ``size`` bytes of a file (all of a shorter one); None if it
    is not a regular file or cannot be read."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read(size)
        except OSError:
            return None


def read_small(path: str, limit: int) -> bytes | None:
    """A whole file of at most ``limit`` bytes; None if it is larger, is not a
    regular file, or cannot be read."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            data = f.read(limit + 1)
        except OSError:
            return None
    return None if len(data) > limit else data


def private_folder(path: str) -> str | None:
    """Create ``path`` 0700, or check that the folder there is this user's
    alone: what is wrong with it ("it belongs to uid 65534"), or None.
    Checked with lstat: a symlink, another user's folder or one that others
    may enter is refused, never repaired.  OSError when it cannot be made."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder (a symlink or a file)"
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}"
    if st.st_mode & 0o077:
        return f"other users have access to it (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def write_private(path: str, data: bytes) -> None:
    """``data`` as the whole of ``path``, at once for a reader: a new file
    (0600, never through a symlink) renamed over the old one."""
    new = f"{path}.{os.getpid()}.new"
    try:
        os.unlink(new)
    except FileNotFoundError:
        pass
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(new, path)


def remove_private(path: str) -> None:
    """Remove what ``write_private`` wrote at ``path``, and the new copy a
    writer that ended before its rename left beside it."""
    for stale in [path, *glob.glob(glob.escape(path) + ".*.new")]:
        try:
            os.unlink(stale)
        except OSError:
            pass


def joined_recoverable(path: str) -> bool:
    """Whether the joined file at ``path`` says its process enabled recoverability."""
    data = read_small(path, 64)
    return data is not None and data.strip() == RECOVERABLE.encode()


@dataclasses.dataclass(frozen=True)
class Spinning:
    """What a SPIN line says: how many of the process's own threads burnt CPU
    while its Python did not move, and their CPU in cores."""

    threads: int
    cores: float

    def line(self) -> str:
        """The activity line that says it: ``spin 2 1.97``."""
        return f"{SPIN} {self.threads} {self.cores:.2f}"

    @classmethod
    def of(cls, said: str) -> Spinning | None:
        """The spinning a SPIN line says; None for any other line."""
        word, *rest = said.split() or [""]
        if word != SPIN or len(rest) != 2:
            return None
        try:
            threads, cores = int(rest[0]), float(rest[1])
        except ValueError:
            return None
        return cls(threads, cores) if 0 < threads < 100000 and 0 <= cores < 100000 else None


ACTIVITY_LINE_MAX = 40  # bytes: the longest line a sampler writes (a SPIN line)


def activity_word(said: str) -> str | None:
    """The state an activity line says (BUSY, IDLE, SPIN or FINISHED), or
    None for a line that is none of them."""
    if said in (BUSY, IDLE, FINISHED):
        return said
    return SPIN if Spinning.of(said) is not None else None


def read_activity(path: str) -> str | None:
    """The line a process's sampler wrote last (a word of ``activity_word``'s,
    a SPIN line with its details), or None."""
    data = read_small(path, ACTIVITY_LINE_MAX)
    said = data.strip().decode(errors="replace") if data else ""
    return said if activity_word(said) is not None else None


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


def flight_block(rank: int, runs: int, state: str, entries: Sequence[FlightEntry]) -> str:
    """The recorder's block, as a controller writes it into its stderr: a line
    a person can read and the summary can find, then one line per entry."""
    lines = [f"jaxrun: flight[{rank}] begin: the last {len(entries)} of {runs} programs run, oldest first; {state}"]
    lines.extend(e.to_line(rank) for e in entries)
    lines.append(f"jaxrun: flight[{rank}] end")
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
        if line == f"jaxrun: flight[{rank}] end":
            break
        m = _FLIGHT_ENTRY.match(line)
        if m and int(m[1]) == rank:
            entries.append(FlightEntry(int(m[2]), None if m[3] is None else int(m[3]), m[4], int(m[5]), m[6],
                                       "" if m[7] == "-" else m[7], m[8], int(m[9])))
    return FlightLog(rank, int(head[2]), head[3], tuple(entries))
