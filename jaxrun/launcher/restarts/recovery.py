"""A recoverable job: JAX's fault tolerance under jaxrun.

A JAX program that sets ``jax_enable_recoverability`` before it joins stops
sharing fate across its processes: the survivors of a dead process go on,
and the process, started again with the same id, rejoins.  Process 0 hosts
the coordination service, so its death still ends everyone.

Each process says at its join whether it enabled recoverability (its joined
file, the SSH marker, the task channel's ``Joined``).  The job is
recoverable once every process said so (or with ``--recoverable``; never
with ``--no-recoverable``).  Then, within one attempt, the supervisor asks
this module what a failure of a process other than 0 means:

- the others go on, and one console line says so and why;
- where the backend can start one process again (locally, over SSH), and
  ``--max-restarts K`` allows, that process alone starts again, up to K
  times, unless it failed exactly as in its life before (#37's rule, per
  process: ``reporting.diagnosis.run_failure``);
- where it cannot (a scheduler's gang, Ray's group), the job says so once,
  and only whole jobs restart, after every process has ended.

Pure: it decides and words; the supervisor starts and stops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from jaxrun import contract
from jaxrun.core.logfiles import log_paths
from jaxrun.core.outcome import ProcessRecord, Verdict


@dataclasses.dataclass
class Recovery:
    mode: bool | None  # --recoverable True, --no-recoverable False; None: as the processes announce
    restarts: int  # --max-restarts: how many times each process may start again alone
    alone: bool  # the backend starts one process again (local, SSH); False: a gang
    engine: str  # the engine as users call it (``Backend.title``), for the gang's line
    total: int  # processes in the attempt
    note: Callable[[str], None] = print
    announced: set[int] = dataclasses.field(default_factory=set)  # ranks that enabled recoverability
    used: dict[int, int] = dataclasses.field(default_factory=dict)  # rank -> its restarts so far
    fingerprints: dict[int, tuple | None] = dataclasses.field(default_factory=dict)  # rank -> its last failure's
    failed: list[int] = dataclasses.field(default_factory=list)  # ranks whose last run failed, in order
    said: bool = False  # the gang's line is out

    @property
    def on(self) -> bool:
        if self.mode is not None:
            return self.mode and self.total > 1
        return self.total > 1 and len(self.announced) == self.total

    def why(self) -> str:
        if self.mode:
            return "the job is recoverable (--recoverable)"
        return "the job is recoverable: every process enabled jax_enable_recoverability"

    def begin(self) -> None:
        """The attempt starts: with --recoverable, the gang's line now."""
        self._tell_gang()

    def joined(self, rank: int, recoverable: bool) -> None:
        if recoverable:
            self.announced.add(rank)
        self._tell_gang()

    def _tell_gang(self) -> None:
        if self.on and not self.alone and not self.said:
            self.said = True
            self.note(f"jaxrun: {self.why()}; {self.engine} starts the processes as one gang and cannot start "
                      f"one of them again: a process other than 0 that fails leaves the others running, and "
                      f"--max-restarts restarts only whole jobs")

    def spares_others(self, rank: int) -> bool:
        """A failure of ``rank`` leaves the others running."""
        return self.on and rank != 0

    def after_failure(self, rank: int, who: str, how: str, fingerprint: tuple | None,
                      failure: str | None) -> bool:
        """A process other than 0 failed in a recoverable job: say so; True:
        start it again alone.  ``who`` names it ("process 2 on hostC"),
        ``how`` says how it ended, ``failure`` is its failure in short
        (for the same-failure line)."""
        head = f"jaxrun: {who} failed ({how}); the others go on ({self.why()})"
        used = self.used.get(rank, 0)
        before, self.fingerprints[rank] = self.fingerprints.get(rank), fingerprint
        if not self.alone or not self.restarts:
            self._final(rank)
            self.note(head)
            return False
        if fingerprint is not None and fingerprint == before:
            self._final(rank)
            self.note(f"{head}; not starting it again: the same failure as its life {used} ({failure})")
            return False
        if used >= self.restarts:
            self._final(rank)
            self.note(f"{head}; not starting it again: it was started again {used} time{'s' if used > 1 else ''} "
                      f"(--max-restarts {self.restarts})")
            return False
        self.used[rank] = used + 1
        self.note(f"{head}; starting process {rank} again alone (restart {used + 1} of {self.restarts})")
        return True

    def _final(self, rank: int) -> None:
        if rank not in self.failed:
            self.failed.append(rank)

    def cannot_restart(self, rank: int, why: str) -> None:
        self._final(rank)
        self.note(f"jaxrun: cannot start process {rank} again: {why}")

    @property
    def restarts_whole(self) -> bool:
        """Whether a failed attempt that ran to its end (no stop) may be
        restarted whole: only where no process could restart alone."""
        return not (self.on and self.alone)


def next_life(record: ProcessRecord, log_dir: str) -> ProcessRecord:
    """The record of a failed process's next life, alone: the same id,
    coordinator and environment, its own restart count, its own log files;
    the failed life becomes one of its earlier lives."""
    life = record.life + 1
    attempt = int(record.spec.env.get(contract.RESTART_COUNT, "0")) - record.life  # the attempt's own count
    env = {**record.spec.env, contract.PROCESS_RESTARTS: str(life), contract.RESTART_COUNT: str(attempt + life)}
    spec = dataclasses.replace(record.spec, env=env)
    record.verdict = Verdict.RESTARTED
    again = ProcessRecord(spec, *log_paths(log_dir, spec.rank, life), life=life, earlier=record.lives)
    record.earlier = []
    return again
