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
    NOT_STARTED = "never started"


class StopReason(enum.Enum):
    FAILURE = "failure"
    SIGNAL = "signal"
    TIMEOUT = "timeout"
    INTERNAL = "internal error"  # a launcher thread died: jaxrun's bug, not the job's
    NOT_STARTED = "not started"  # a restart stopped in its start-up: planning, a preflight, a connection


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

    @property
    def exit_status(self) -> int | None:
        """Shell convention: 128+N for a signal."""
        return None if self.returncode is None else contract.exit_status(self.returncode)


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
    log_errors: list[str] = dataclasses.field(default_factory=list)  # "path: error" per log jaxrun could not write
    lost: list[int] = dataclasses.field(default_factory=list)  # ranks whose end was never confirmed
    start_error: str | None = None  # why this attempt never started its processes
    stop_seconds: float | None = None  # a stop on a signal: from the signal to the last process's end
    placement: PlacementRecord | None = None  # where it ran (the run loop fills it in)
    # reporting.diagnosis.Diagnosis, kept once the run loop has read the logs, so
    # that no report reads them again (core cannot name reporting's type).
    diagnosis: object | None = dataclasses.field(default=None, compare=False, repr=False)

    @classmethod
    def not_started(cls, exit_code: int, why: str, signum: int | None = None) -> Outcome:
        """An attempt that ended in its start-up, before its processes ran:
        ``exit_code`` is the start-up failure's own (2 for a host that cannot
        be reached, 128+N for a signal), and it is the run's."""
        reason = StopReason.SIGNAL if signum else StopReason.NOT_STARTED
        return cls([], exit_code, reason, signum=signum, start_error=why)
