"""What one run of jaxrun was asked to do: built from the command line, read
by the run loop and by the backend its registry entry builds.  No behaviour
here.

Which backend runs the processes is ``RunConfig.backend``, a key of
``jaxrun.backends.table.BACKENDS``; what that backend needs beyond the launch
itself is ``RunConfig.backend_options``, an object its entry builds and only
its backend reads.  So a new backend brings its own options and adds no
field here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from jaxrun.core.modes import Mode, Script
from jaxrun.core.spec import LaunchOptions

if TYPE_CHECKING:
    from jaxrun.core.backend import Backend


class LaunchError(Exception):
    """Bad input found before anything started: exit 2 with this one line."""


class OutOfFiles(Exception):
    """jaxrun cannot have the open files it needs, for what is open already
    (inherited descriptors) or a limit the system hit at start-up (EMFILE,
    ENFILE): exit 70 with this one line, no process left."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Built once, from the command line, and never changed after."""

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
    quiet: bool = False  # -q: no routine lines; the closing lines are the failure and the log folder
    fixed_coordinator: str | None = None  # from --coordinator
    junit_path: str | None = None
    github_actions: bool = False  # group output per process, annotate the root cause
    preload: bool = True  # fork local controllers from a server that imported jax
    preload_modules: tuple[str, ...] = ()
    backend: str = "local"  # the --launcher word: which entry of jaxrun.backends.table.BACKENDS starts the processes
    backend_options: Any = None  # what that entry built from the command line (its own options type)
    timestamps: bool = False  # --timestamps: console lines start with their arrival time
    # Elastic restarts: a restart leaves out the hosts that were lost, fills
    # their places from the spares and goes on with at least this many hosts.
    min_hosts: int | None = None
    hosts_command: str | None = None  # --hosts-command: prints the hosts file again before each restart
    mode: Mode = dataclasses.field(default_factory=Script)  # a script, or an interactive session (-i)
    profile: tuple[float, float] | None = None  # --profile START:SECONDS: a trace of every process
    count_source: str = ""  # what decided the process count when -n did not (the allocation's variable)
    probe: str = ""  # --probe before the job (PROBE_REPORT, PROBE_STRICT), or `jaxrun probe` alone; "": none


# --probe's words, and `jaxrun probe`'s (the probe alone: its table, or --json).
PROBE_REPORT, PROBE_STRICT, PROBE_TABLE, PROBE_JSON = "report", "strict", "table", "json"
PROBE_ALONE = (PROBE_TABLE, PROBE_JSON)


def no_options(values: Mapping[str, Any], launch: LaunchOptions) -> None:
    return None


class Value(enum.Enum):
    """What a Flag takes; the command line turns each into its own type."""

    TEXT = "text"  # any text, or one of its choices
    COUNT = "count"  # a whole number, at least its minimum
    SECONDS = "seconds"  # a finite number of seconds, at least its minimum
    FILE = "file"  # the path of a file that exists
    SWITCH = "switch"  # on when given; takes no value


@dataclasses.dataclass(frozen=True)
class Flag:
    """A command-line option that backends declare in their registry entries.
    The command line adds it once, however many entries list it, and refuses
    it with a ``--launcher`` that lists it not; an entry's ``options`` reads
    its value as ``values[name]``."""

    name: str  # the parameter name, e.g. "ray_address"
    opts: tuple[str, ...]  # e.g. ("--ray-address",)
    help: str  # says the default when there is none below, so that "given" stays plain
    choices: tuple[str, ...] = ()  # the words it takes; empty: any text
    metavar: str | None = None
    value: Value = Value.TEXT
    minimum: float | None = None  # COUNT and SECONDS: the least value taken
    multiple: bool = False  # repeatable: its value is a tuple of every one given
    default: Any = None  # shown in --help; a value equal to it counts as not given
    section: str | None = None  # its --help section; None: that of the first entry that lists it
    # False: a launcher that does not list it ignores it, as jaxrun always
    # has (--ssh-config and its kin, --chdir), instead of refusing it.
    exclusive: bool = True
    refusal: str = "{opt} works with --launcher {launchers} only"  # the error when refused

    def given(self, values: Mapping[str, Any]) -> bool:
        value = values.get(self.name)
        if self.multiple or self.value is Value.SWITCH:
            return bool(value)
        return value is not None and value != self.default

    def refused(self, launchers: Sequence[str]) -> str:
        """The one line that refuses it: ``launchers`` are those that list it."""
        return self.refusal.format(opt=self.opts[0], launchers=" or ".join(launchers))


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """One way of starting the processes, as the command line and the run
    loop see it: one row of ``jaxrun.backends.table.BACKENDS``.  The command line
    reads everything but ``start``; only the run loop starts a backend."""

    name: str  # its --launcher word
    help: str  # one line: what it starts, and where
    kind: str  # how a message names its runs: "(9 each, scheduler run)"
    fds_per_process: int  # file descriptors jaxrun itself holds for each process while it runs
    start: Callable[..., Backend]  # (config, console, early): imports the backend's module, then builds it
    # What it may start as soon as the command line is known good, before the
    # launcher is loaded (the local run's preloading server); None: nothing.
    head_start: Callable[[RunConfig], Any] | None = None
    # Its options from the command line's values (every option by its
    # parameter name) and the launch: raises LaunchError for a value it refuses.
    options: Callable[[Mapping[str, Any], LaunchOptions], Any] = no_options
    engine: str | None = None  # the program it runs on this machine, which must be on PATH
    engine_missing: str = ""  # the one-line error when it is not
    default: bool = False  # the way a run starts when neither --launcher nor hosts say
    takes_hosts: bool = False  # it starts the processes on the hosts of --hosts/-H
    scheduled: bool = False  # a scheduler places the processes and numbers them
    reads_allocation: bool = False  # inside an allocation, its task layout is the default process count
    flags: tuple[Flag, ...] = ()  # the command-line options it takes beyond everyone's
    section: str | None = None  # the --help section of its flags; None: "With --launcher NAME"
    elastic: bool = False  # its backend can start a restart on other hosts (Backend.place with a recheck): --min-hosts
    # Where restarts can find other hosts only inside something the
    # environment names (Slurm's allocation): that variable, and the one-line
    # error for --min-hosts without it.
    elastic_variable: str | None = None
    elastic_refusal: str = ""

    @property
    def help_section(self) -> str:
        return self.section or f"With --launcher {self.name}"


@dataclasses.dataclass(frozen=True)
class Declared:
    """One flag of a registry, as the command line adds it: once."""

    flag: Flag
    launchers: tuple[str, ...]  # the entries that list it, in the registry's order
    section: str  # the --help section it shows in


def declared_flags(backends: Mapping[str, BackendEntry]) -> dict[str, Declared]:
    """Every flag the entries list, each once, by parameter name, in the order
    they first appear.  Two different flags of one name are a registry bug."""
    found: dict[str, Declared] = {}
    for entry in backends.values():
        for flag in entry.flags:
            seen = found.get(flag.name)
            if seen is None:
                found[flag.name] = Declared(flag, (entry.name,), flag.section or entry.help_section)
            elif seen.flag != flag:
                raise ValueError(f"two different flags are named {flag.name}: declare it once and list it")
            else:
                found[flag.name] = dataclasses.replace(seen, launchers=(*seen.launchers, entry.name))
    return found


def on_github_actions(environ: Mapping[str, str]) -> bool:
    """Whether this run is a step of a GitHub Actions job (its output is then grouped)."""
    return environ.get("GITHUB_ACTIONS") == "true"
