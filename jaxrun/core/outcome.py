"""What one attempt of a job came to: a record per process and the verdicts.

The supervisor fills these in; the summary, the JSON report, JUnit and the
GitHub annotations read them.
"""

from __future__ import annotations

import dataclasses
import enum

from jaxrun import contract
from jaxrun.core.spec import ProcessSpec

INTERNAL_ERROR = 70  # exit status when jaxrun itself failed (sysexits' EX_SOFTWARE)
BUG_REPORT = "this is a bug in jaxrun; please report it with the log folder"


class Verdict(enum.Enum):
    OK = "ok"  # exited 0
    ROOT_CAUSE = "failed first"
    CONSEQUENCE = "failed after the root cause"
    STOPPED = "stopped by jaxrun"
    RESTARTED = "failed, started again alone"  # an earlier run of a recoverable job's process
    FAILED_ALONE = "failed, the others went on"  # a recoverable job's, after the one that failed first
    NOT_STARTED = "never started"


class StopReason(enum.Enum):
    FAILURE = "failure"
    SIGNAL = "signal"
    TIMEOUT = "timeout"
    INTERNAL = "internal error"  # a launcher thread died: jaxrun's bug, not the job's
    STALL = "stall"  # no process made progress for --stall-timeout, and they wait at different places
    NOT_STARTED = "not started"  # a restart stopped in its start-up: planning, a preflight, a connection


# The most of a process's stderr that jaxrun keeps in memory once its log
# file stopped: enough for a long traceback, which the summary shows.
KEPT_STDERR = 1 << 16


@dataclasses.dataclass
class LogLoss:
    """A log file that jaxrun stopped writing (a full disk, any write error),
    while its process went on: when, why, and how much of what the process
    wrote after it the file lacks.  Filled in by the one thread that writes
    the file (``launcher.output``); read once the attempt is over."""

    stream: str  # "stdout" or "stderr"
    path: str
    error: str  # the failed write's strerror
    at: float  # wall clock of the failed write
    kept: int  # the bytes the file holds
    lost: int = 0  # bytes written since, not in the file
    tail: bytes = b""  # stderr's: the last KEPT_STDERR bytes of those (its traceback)

    def missed(self, data: bytes) -> None:
        self.lost += len(data)
        if self.stream == "stderr":
            self.tail = (self.tail + data)[-KEPT_STDERR:]

    def line(self, rank: int) -> str:
        """What the summary says of it."""
        import time

        when = time.strftime("%H:%M:%S", time.localtime(self.at))
        return (f"process {rank}'s {self.stream} log {self.path} stopped at {when} ({self.error}) after "
                f"{amount(self.kept)}; the process went on, and the {amount(self.lost)} it wrote since are not in it")

    def to_dict(self) -> dict:
        return {"stream": self.stream, "path": self.path, "error": self.error, "at": self.at,
                "bytes_kept": self.kept, "bytes_lost": self.lost}


def amount(size: int) -> str:
    """A number of bytes as people read it."""
    if size < 1000:
        return f"{size} bytes" if size != 1 else "1 byte"
    for unit in ("kB", "MB", "GB"):
        size /= 1000
        if size < 1000 or unit == "GB":
            return f"{size:.1f} {unit}"
    raise AssertionError


@dataclasses.dataclass
class ProcessRecord:
    spec: ProcessSpec
    stdout_log: str
    stderr_log: str
    error_file: str
    pid: int | None = None
    started_at: float | None = None  # wall clock, for the report
    ended_at: float | None = None
    returncode: int | None = None
    verdict: Verdict | None = None
    resources: contract.Resources | None = None  # measured where it ran, once it ended
    reaped_at: float | None = None  # wall clock of the machine that reaped it, as it did
    clock: str | None = None  # that machine (core.causes.clock_id), to compare reaped_at within
    lost: str | None = None  # its end was never reported: this helper ended instead
    # One life of a process is one start of it; a recoverable job's process
    # started again alone has more than one in an attempt (0: the first).
    life: int = 0
    earlier: list[ProcessRecord] = dataclasses.field(default_factory=list)  # its earlier lives, oldest first
    finished_at: float | None = None  # wall clock: its script returned (heard through its activity)
    joined_at: float | None = None  # wall clock: it reached the job's rendezvous (heard)
    marks: contract.Marks | None = None  # its compiles and checkpoint saves, as it left them (child.marks)
    losses: list[LogLoss] = dataclasses.field(default_factory=list)  # its log files jaxrun stopped writing

    def stderr_tail(self, size: int) -> bytes | None:
        """The last ``size`` bytes of its stderr: its log's, and after them
        what jaxrun kept of the bytes that log lacks (None: neither is there)."""
        data = contract.read_tail(self.stderr_log, size)
        kept = b"".join(loss.tail for loss in self.losses if loss.stream == "stderr")
        if not kept:
            return data
        return ((data or b"") + kept)[-size:]

    @property
    def phase(self) -> str:
        """Where in its life it was when it ended, as far as jaxrun heard:
        "start-up" (before its join), "work" (its script), or "teardown"
        (its script had returned: exit hooks, JAX's shutdown)."""
        if self.finished_at is not None:
            return "teardown"
        return "start-up" if self.joined_at is None else "work"

    @property
    def lives(self) -> list[ProcessRecord]:
        """Every life of this process in the attempt, oldest first, this one last."""
        return [*self.earlier, self]

    @property
    def exit_status(self) -> int | None:
        """Shell convention: 128+N for a signal."""
        return None if self.returncode is None else contract.exit_status(self.returncode)


@dataclasses.dataclass(frozen=True)
class Place:
    """Where a stalled process waits, from its stack dump: the innermost line
    of the user's code, and whether it was in the script or past it."""

    file: str | None
    line: int | None
    func: str | None = None
    source: str | None = None
    state: str | None = None  # contract.IN_SCRIPT, contract.IN_SHUTDOWN, ...
    # Its main thread's innermost frame is JAX's: it waits in a collective or
    # for a result, whichever line of the user's reached it.
    inside_jax: bool = False
    also: tuple[str, ...] = ()  # other processes' lines (FILE:LINE) that reached the same wait

    @property
    def key(self) -> tuple:
        if self.state == contract.IN_SHUTDOWN:
            return (self.state,)
        return self.file, self.line

    @property
    def at(self) -> str | None:
        return None if self.file is None else f"{self.file}:{self.line}"

    def text(self) -> str:
        if self.state == contract.IN_SHUTDOWN:
            return "JAX's shutdown, past the end of the script"
        if self.file is None:
            return "an unknown place (no stack dump in its log)"
        text = f"{self.file}:{self.line} in {self.func}" + (f": {self.source}" if self.source else "")
        if self.also:  # processes that reached one wait inside JAX from different lines
            return f"a call into JAX (a collective or a result) from {text}, and from {', '.join(self.also)}"
        return text


@dataclasses.dataclass(frozen=True)
class StallGroup:
    ranks: tuple[int, ...]
    place: Place


@dataclasses.dataclass(frozen=True)
class Stall:
    """What the stall watchdog found: how long nobody moved, where most of
    the processes wait (None: no place holds more than the others), the
    processes that stand out, each group at its place, and those whose own
    threads spun while their Python stood still (rank, how many, their CPU)."""

    seconds: float
    waiting: StallGroup | None
    odd: tuple[StallGroup, ...]
    spinning: tuple[tuple[int, contract.Spinning], ...] = ()

    @property
    def fingerprint(self) -> tuple:
        """The same stall again: processes standing out at the same lines
        (whichever processes they are)."""
        return ("stall", *sorted(repr(g.place.key) for g in self.odd))


@dataclasses.dataclass(frozen=True)
class Straggler:
    """The process the others waited for, window after window
    (``launcher/attempt/straggler.py``): where it ran, the share of the
    others' accounted time they spent waiting (``lost``), and how its own
    time compares with theirs: its work outside JAX (input, Python) and its
    programs, each in seconds and as a multiple of the others' median;
    ``windows``: in how many of the ``judged`` windows it was the one."""

    rank: int
    host: str
    lost: float  # 0..1
    work: float
    programs: float
    work_ratio: float
    programs_ratio: float
    windows: int
    judged: int

    def spends(self) -> str:
        """What it spends its own time on, against the others."""
        return (f"its own work (input, Python) {self.work_ratio:.1f}x the others', "
                f"its programs {self.programs_ratio:.1f}x")

    def line(self) -> str:
        return (f"process {self.rank} on {self.host} is the straggler: the others spent {self.lost:.0%} of "
                f"their time waiting for it ({self.windows} of {self.judged} windows); {self.spends()}")


@dataclasses.dataclass(frozen=True)
class PlacementRecord:
    """Where an attempt ran, as the report keeps it: its hosts in rank order, and the hosts left out
    before it with why (a lost host, one that failed its check again)."""

    hosts: tuple[str, ...]
    num_processes: int
    dropped: tuple[tuple[str, str], ...] = ()  # (host, why)


@dataclasses.dataclass
class Outcome:
    records: list[ProcessRecord]
    exit_code: int
    reason: StopReason | None
    signum: int | None = None
    root_cause: int | None = None  # rank
    fault: str | None = None  # which launcher thread died, and how
    log_errors: list[str] = dataclasses.field(default_factory=list)  # each log that stopped (LogLoss.line)
    lost: list[int] = dataclasses.field(default_factory=list)  # ranks whose end was never confirmed
    start_error: str | None = None  # why this attempt never started its processes
    stop_seconds: float | None = None  # a stop on a signal: from the signal to the last process's end
    placement: PlacementRecord | None = None  # where it ran (the run loop fills it in)
    # When the attempt began, by the wall clock (the run loop fills it in): its
    # --timeout counts from here, placement and start-up included.
    began_at: float | None = None
    stall: Stall | None = None  # the watchdog stopped it (reason STALL)
    # Spans (wall clock) in which no process moved for the stall timeout or more (the supervisor fills it in).
    stills: tuple[tuple[float, float], ...] = ()
    straggler: Straggler | None = None  # the process the others waited for (the time account's rule)
    # Each process's newest time account (contract.TimeSplit), by rank, and each
    # window the straggler rule judged: (the process that waited least, its gap).
    splits: dict = dataclasses.field(default_factory=dict)
    windows: list = dataclasses.field(default_factory=list)
    # A recoverable job whose processes ran to their own ends (nothing stopped
    # it), some of them failed: where they could start again alone, a whole
    # restart would only repeat that (restarts.policy).
    ran_out: bool = False
    recoverable: bool = False  # the processes did not share fate (launcher.restarts.policy)
    # JAX's fatal-error pages the console left to the logs, counted (the
    # printer's: "processes 1-3: JAX's fatal-error pages, 36 lines"); None: none.
    pages: str | None = None
    # reporting.diagnosis.Diagnosis, kept once the run loop has read the logs, so
    # that no report reads them again (core cannot name reporting's type).
    diagnosis: object | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def work_finished(self) -> bool:
        """The attempt failed, but only once its work was done: every process's
        script had returned (an abort in an exit hook or in JAX's shutdown).
        A restart would run the whole work again for nothing."""
        return (self.reason is StopReason.FAILURE and self.root_cause is not None and bool(self.records)
                and all(r.finished_at is not None for r in self.records))

    @classmethod
    def not_started(cls, exit_code: int, why: str, signum: int | None = None) -> Outcome:
        """An attempt that ended in its start-up, before its processes ran:
        ``exit_code`` is the start-up failure's own (2 for a host that cannot
        be reached, 128+N for a signal), and it is the run's."""
        reason = StopReason.SIGNAL if signum else StopReason.NOT_STARTED
        return cls([], exit_code, reason, signum=signum, start_error=why)


def exit_code(reason: StopReason | None, signum: int | None, root_status: int | None) -> int:
    """jaxrun's exit status for an attempt that ended so: ``root_status`` is
    the root cause's own (shell style), where a process failed first."""
    if reason is StopReason.INTERNAL:
        return INTERNAL_ERROR
    if reason is StopReason.SIGNAL:
        return 128 + signum
    if reason is StopReason.TIMEOUT:
        return 124
    if reason is StopReason.STALL:
        return contract.STALL_EXIT
    return root_status if root_status is not None else 0
