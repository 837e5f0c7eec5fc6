"""What one run of jaxrun was asked to do: built by the CLI, read by the run
loop and by the backend the factory picks from it.  No behaviour here."""

from __future__ import annotations

import dataclasses
from typing import Mapping

from jaxrun.core.spec import LaunchOptions

# The schedulers jaxrun rides on, by the name --launcher gives them.
SCHEDULERS = ("slurm", "mpirun")
LAUNCHERS = ("local", "ssh", *SCHEDULERS)


class LaunchError(Exception):
    """Bad input found before anything started: exit 2 with this one line."""


@dataclasses.dataclass(frozen=True)
class SchedulerOptions:
    launcher: str  # one of SCHEDULERS
    nodes: int | None = None
    tasks_per_node: int | None = None
    scheduler_args: tuple[str, ...] = ()  # passed to srun/mpirun verbatim

    @property
    def command(self) -> str:
        """The scheduler's own program, as it shows in messages and the engine log."""
        return "srun" if self.launcher == "slurm" else "mpirun"


@dataclasses.dataclass(frozen=True)
class SshOptions:
    python: str
    chdir: str
    config_file: str | None = None
    options: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # --env/-x, for preflight
    script: str | None = None  # the script's path as given (None for -m): checked on every host
    sync: bool = False  # --sync: copy chdir to every host first


@dataclasses.dataclass
class RunConfig:
    options: LaunchOptions  # coordinator filled in per attempt
    log_dir: str
    output: str = "stream"
    console_ranks: frozenset[int] | None = None  # None: every process on the console
    grace: float = 30.0
    timeout: float | None = None
    max_restarts: int = 0
    report_path: str | None = None
    dry_run: bool = False
    verbose: bool = False
    fixed_coordinator: str | None = None  # from --coordinator
    junit_path: str | None = None
    github_actions: bool = False  # group output per process, annotate the root cause
    preload: bool = True  # fork local controllers from a server that imported jax
    preload_modules: tuple[str, ...] = ()
    scheduler: SchedulerOptions | None = None  # --launcher slurm|mpirun: one scheduler step
    ssh: SshOptions | None = None  # --hosts/-H: over SSH
    timestamps: bool = False  # --timestamps: console lines start with their arrival time
