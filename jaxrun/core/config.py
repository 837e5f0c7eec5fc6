"""What one run of jaxrun was asked to do: built from the command line, read
by the run loop and by the backend its registry entry builds.  No behaviour
here.

Which backend runs the processes is ``RunConfig.backend``, a key of
``jaxrun.backends.BACKENDS``; what that backend needs beyond the launch
itself is ``RunConfig.backend_options``, an object its entry builds and only
its backend reads.  So a new backend brings its own options and adds no
field here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from jaxrun.core.spec import LaunchOptions

if TYPE_CHECKING:
    from jaxrun.core.backend import Backend


class LaunchError(Exception):
    """Bad input found before anything started: exit 2 with this one line."""


@dataclasses.dataclass(frozen=True)
class SchedulerOptions:
    """A run as one scheduler step (srun or mpirun)."""

    name: str  # the scheduler as --launcher names it: "slurm" or "mpirun"
    nodes: int | None = None
    tasks_per_node: int | None = None
    scheduler_args: tuple[str, ...] = ()  # passed to srun/mpirun verbatim

    @property
    def command(self) -> str:
        """The scheduler's own program, as it shows in messages and the engine log."""
        return "srun" if self.name == "slurm" else "mpirun"


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
    backend: str = "local"  # the --launcher word: which entry of jaxrun.backends.BACKENDS starts the processes
    backend_options: Any = None  # what that entry built from the command line (SshOptions, SchedulerOptions)
    timestamps: bool = False  # --timestamps: console lines start with their arrival time
    # Elastic restarts: a restart leaves out the hosts that were lost, fills
    # their places from the spares and goes on with at least this many hosts.
    min_hosts: int | None = None
    hosts_command: str | None = None  # --hosts-command: prints the hosts file again before each restart


def no_options(values: Mapping[str, Any], launch: LaunchOptions) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class Flag:
    """A command-line option that one backend declares in its registry entry.
    The command line adds it, in a help section of that backend's own, and
    refuses it with any other ``--launcher``; the entry's ``options`` reads
    its value as ``values[name]`` (None when it was not given)."""

    name: str  # the parameter name, e.g. "ray_address"
    opts: tuple[str, ...]  # e.g. ("--ray-address",)
    help: str  # says the default: the option itself has none, so that "given" is plain
    choices: tuple[str, ...] = ()  # the words it takes; empty: any text
    metavar: str | None = None


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """One way of starting the processes, as the command line and the run
    loop see it: one row of ``jaxrun.backends.BACKENDS``.  The command line
    reads everything but ``start``; only the run loop starts a backend."""

    name: str  # its --launcher word
    help: str  # one line: what it starts, and where
    kind: str  # how a message names its runs: "(9 each, scheduler run)"
    fds_per_process: int  # file descriptors jaxrun itself holds for each process while it runs
    start: Callable[[RunConfig, TextIO], Backend]  # imports the backend's module, then builds it
    # Its options from the command line's values (every option by its
    # parameter name) and the launch: raises LaunchError for a value it refuses.
    options: Callable[[Mapping[str, Any], LaunchOptions], Any] = no_options
    engine: str | None = None  # the program it runs on this machine, which must be on PATH
    engine_missing: str = ""  # the one-line error when it is not
    default: bool = False  # the way a run starts when neither --launcher nor hosts say
    takes_hosts: bool = False  # it starts the processes on the hosts of --hosts/-H
    scheduled: bool = False  # a scheduler places the processes and numbers them
    count_variable: str | None = None  # inside an allocation, the variable that holds its task count
    flags: tuple[Flag, ...] = ()  # its own command-line options
    elastic: bool = False  # its backend can start a restart on other hosts (Backend.regroup): --min-hosts

    def flags_given(self, values: Mapping[str, Any]) -> list[str]:
        """Its own options that the command line gave (their first spelling)."""
        return [flag.opts[0] for flag in self.flags if values.get(flag.name) is not None]
