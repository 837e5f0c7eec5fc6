"""The one restart policy: what follows each end, for the whole run.

Every end the run meets comes here, and ``RestartPolicy.decide`` gives one
of five answers:

- ``GO_ON``: a recoverable job's process other than 0 failed and is not
  started again; the others go on without it;
- ``START_ALONE``: that process alone starts again, with its id, its
  coordinator and its environment;
- ``RESTART_JOB``: the attempt is over and the whole job is placed on the
  same hosts and started again;
- ``RESTART_ELASTIC``: the same, but placed anew (``--min-hosts``,
  ``--hosts-command``): lost hosts are left out and spares fill in;
- ``STOP``: fail fast (a process's end), or the run ends here (an
  attempt's end).

The rules, each written once:

- **one budget**: ``--max-restarts N`` is N restarts for the run, whatever
  they restart; every ``START_ALONE``, ``RESTART_JOB`` and
  ``RESTART_ELASTIC`` spends one;
- **the same failure twice** is never restarted: a process that fails as
  its life before did, or an attempt that fails as the one before did (the
  fingerprint of ``reporting.diagnosis``), since a restart would meet the
  same bug;
- **a recoverable job**: once every process announced at its join that it
  enabled ``jax_enable_recoverability`` (or always, with ``--recoverable``;
  never with ``--no-recoverable``), a failed process other than 0 stops
  nobody.  Process 0 hosts the coordination service, so its end stops the
  attempt.  Where the engine starts processes as one gang (Slurm, Open MPI,
  Ray), no process starts again alone, and only whole jobs restart;
- **a finished run is never thrown away**: an attempt whose every process
  had finished its script before it failed (an abort in an exit hook or in
  JAX's shutdown) is not restarted: a restart would do the work again;
- what restarts: a failure and a stall.  A signal to jaxrun, ``--timeout``,
  jaxrun's own fault and a restart that could not start stop the run.

Pure: it reads ends and answers; the supervisor and the run loop act.
"""

from __future__ import annotations

import dataclasses
import enum

from jaxrun.core.outcome import StopReason

RESTARTED = (StopReason.FAILURE, StopReason.STALL)  # the attempt ends that a restart may follow


class Answer(enum.Enum):
    GO_ON = "go on"
    START_ALONE = "start this process again"
    RESTART_JOB = "place and start the job again"
    RESTART_ELASTIC = "place the job anew and start it again"
    STOP = "stop"


@dataclasses.dataclass(frozen=True)
class ProcessEnd:
    """A process failed while its attempt ran (nothing was stopping)."""

    rank: int
    fingerprint: tuple | None = None  # its failure's (None: unknown, never "the same")
    failure: str | None = None  # that failure in short, for the line
    who: str = ""  # "process 2 on hostC"
    how: str = ""  # "exit code 7", "killed by SIGKILL"


@dataclasses.dataclass(frozen=True)
class AttemptEnd:
    """An attempt ended; ``reason`` None: every process exited 0."""

    reason: StopReason | None
    fingerprint: tuple | None = None  # its root failure's (None: unknown or an engine's)
    failure: str | None = None
    ran_out: bool = False  # a recoverable job whose processes ran to their own ends
    finished: str | None = None  # every script had returned before it failed: who failed at teardown


@dataclasses.dataclass(frozen=True)
class Decision:
    answer: Answer
    why: str = ""  # the console line (after "jaxrun: ") that says what follows, and why; "": nothing to say


@dataclasses.dataclass(frozen=True)
class Heard:
    """What a join changed: a line to print, and whether the job turned
    recoverable with it, which the far ends that end their own tasks must be
    told (with --recoverable they knew from the start)."""

    line: str | None = None
    turned: bool = False


@dataclasses.dataclass(frozen=True)
class Engine:
    """What the backend can do, as the policy needs it."""

    title: str  # the engine as users call it ("Slurm"), for the gang's line
    starts_one_again: bool  # it can start one process of a running job again (local, SSH)
    elastic: bool = False  # restarts are placed anew (--min-hosts or --hosts-command)


class RestartPolicy:
    def __init__(self, max_restarts: int, engine: Engine, recoverable: bool | None = None):
        self.budget = max_restarts
        self.engine = engine
        self.mode = recoverable  # --recoverable True, --no-recoverable False; None: as the processes announce
        self.spent = 0
        self.total = 0  # processes in the attempt that runs
        self.announced: set[int] = set()
        self.lives: dict[int, tuple | None] = {}  # rank -> its last failed life's fingerprint, this attempt
        self.alone: dict[int, int] = {}  # rank -> how often it started again alone, this attempt
        self.failed: list[int] = []  # ranks that failed and were not started again, in order, this attempt
        self.last_attempt: tuple | None = None  # the last failed attempt's fingerprint
        self.attempts = 0  # attempts ended
        self._said_gang = False

    # -- the attempt's life ---------------------------------------------------------
    def begin_attempt(self, total: int) -> str | None:
        """A new attempt of ``total`` processes; a line to print, if any."""
        self.total, self.announced, self.lives, self.alone, self.failed = total, set(), {}, {}, []
        self._said_gang = False
        return self._gang_line()

    def joined(self, rank: int, recoverable: bool) -> Heard:
        """A process joined, and said whether it enabled recoverability."""
        before = self.recoverable
        if recoverable:
            self.announced.add(rank)
        return Heard(self._gang_line(), turned=self.recoverable and not before and self.mode is None)

    @property
    def recoverable(self) -> bool:
        """Whether the running attempt is a recoverable job: decided here, once."""
        if self.total < 2:
            return False
        if self.mode is not None:
            return self.mode
        return len(self.announced) == self.total

    def why_recoverable(self) -> str:
        if self.mode:
            return "the job is recoverable (--recoverable)"
        return "the job is recoverable: every process enabled jax_enable_recoverability"

    def spares_others(self, rank: int) -> bool:
        """Whether a failure of ``rank`` leaves the others running."""
        return self.recoverable and rank != 0

    @property
    def left(self) -> int:
        return max(0, self.budget - self.spent)

    # -- the one decision -------------------------------------------------------------
    def decide(self, end: ProcessEnd | AttemptEnd) -> Decision:
        if isinstance(end, ProcessEnd):
            return self._process(end)
        return self._attempt(end)

    def _process(self, end: ProcessEnd) -> Decision:
        if not self.spares_others(end.rank):
            return Decision(Answer.STOP)  # fail fast: the attempt stops
        head = f"{end.who} failed ({end.how}); the others go on ({self.why_recoverable()})"
        before, self.lives[end.rank] = self.lives.get(end.rank), end.fingerprint
        if not self.engine.starts_one_again or not self.budget:
            return self._go_on(end.rank, head)
        if self._same(end.fingerprint, before):
            return self._go_on(end.rank, f"{head}; not starting it again: the same failure as its life "
                                         f"{self.alone.get(end.rank, 0)} ({end.failure})")
        if not self.left:
            return self._go_on(end.rank, f"{head}; not starting it again: {self._spent_text()}")
        self.spent += 1
        self.alone[end.rank] = self.alone.get(end.rank, 0) + 1
        return Decision(Answer.START_ALONE, f"{head}; starting process {end.rank} again alone "
                                            f"(restart {self.spent} of {self.budget})")

    def _attempt(self, end: AttemptEnd) -> Decision:
        self.attempts += 1
        before, self.last_attempt = self.last_attempt, end.fingerprint if end.reason in RESTARTED else None
        if end.reason not in RESTARTED:
            return Decision(Answer.STOP)
        if end.finished:
            return Decision(Answer.STOP, f"not restarting: the work finished (every process's script returned) "
                                         f"before {end.finished} failed at teardown")
        if end.ran_out and self.engine.starts_one_again:
            return Decision(Answer.STOP)  # its processes had their restarts alone; a whole one would repeat them
        if not self.left:
            return Decision(Answer.STOP)  # the summary said how it ended; --max-restarts said the rest
        if self._same(end.fingerprint, before):
            return Decision(Answer.STOP, f"not restarting: the same failure as attempt {self.attempts - 1} "
                                         f"({end.failure})")
        self.spent += 1
        if self.engine.elastic:
            return Decision(Answer.RESTART_ELASTIC)  # the run loop words it once the hosts are chosen
        return Decision(Answer.RESTART_JOB, f"restarting the whole job (restart {self.spent} of {self.budget})")

    # -- the rules, once ------------------------------------------------------------------
    @staticmethod
    def _same(fingerprint: tuple | None, before: tuple | None) -> bool:
        """The same failure again: a known fingerprint, equal to the last one."""
        return fingerprint is not None and fingerprint == before

    def _spent_text(self) -> str:
        times = "once" if self.spent == 1 else f"{self.spent} times"
        return f"the run restarted {times} (--max-restarts {self.budget})"

    def _go_on(self, rank: int, line: str) -> Decision:
        if rank not in self.failed:
            self.failed.append(rank)
        return Decision(Answer.GO_ON, line)

    def cannot_start(self, rank: int, why: str) -> str:
        """A START_ALONE whose spawn failed: that process's lives end here."""
        if rank not in self.failed:
            self.failed.append(rank)
        return f"cannot start process {rank} again: {why}"

    def _gang_line(self) -> str | None:
        """Once an attempt, where the job is recoverable but the engine starts a gang."""
        if not self.recoverable or self.engine.starts_one_again or self._said_gang:
            return None
        self._said_gang = True
        return (f"jaxrun: {self.why_recoverable()}; {self.engine.title} starts the processes as one gang and "
                f"cannot start one of them again: a process other than 0 that fails leaves the others "
                f"running, and --max-restarts restarts only whole jobs")
