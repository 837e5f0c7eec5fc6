"""The one interface every way of starting controllers implements.

A backend is used the same way by the launcher's run loop, whatever it is:

    with backend:                                   # open(): connect, preflight
        for each attempt:
            placement = backend.place(ask)          # where it runs: hosts, count, hosts left out
            address, bind = backend.choose_coordinator(fixed)
            backend.begin_attempt(specs, log_dir)   # this attempt's resources
            child = backend.spawn(spec, ...)        # one per process, by the supervisor
            ...
            backend.end_attempt()                   # every child is gone
                                                    # close(): disconnect

A backend whose ``writes_log_files`` is true receives two pipes
(``log_fds``) and makes them the child's stdout and stderr: the child's
``stdout``/``stderr`` are then None, and jaxrun's log writer moves the pipes
into the log files in the kernel (``launcher.output.logwriter``), so that a
log's write error never reaches the process.  Other backends hand back
pipes, which the output pump reads into the logs.

Each backend lives beside its far-end agent, if it has one: the program it
starts on the other side (the fork server, the SSH host agent, the scheduler
task agent).  They talk in :mod:`jaxrun.wire` messages.

The run loop gives every backend its ``RunHooks``: threads a backend starts go
through ``start_thread``, so that a thread that dies is reported instead of
leaving the run waiting for it, and every wait during start-up goes through
``wait_until``, so that a signal or ``--timeout`` cuts it short.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import BinaryIO, Protocol

from jaxrun import contract
from jaxrun.core.events import ChildExit, Stream  # noqa: F401 -- ChildExit is part of the Child contract
from jaxrun.core.outcome import PlacementRecord
from jaxrun.core.spec import Host, ProcessSpec

POLL = 0.1  # seconds between looks at the stop flag while waiting
FIRST_POLL = 0.005  # the first look's wait; each next one waits twice as long, up to POLL


class Interrupted(Exception):
    """A wait was cut short: jaxrun is stopping (a signal, --timeout, or a
    dead internal thread).  The run loop decides what to report."""


@dataclasses.dataclass
class RunHooks:
    """What every part of the launcher needs from the run loop."""

    stopping: Callable[[], bool] = lambda: False  # give up waiting, now
    thread_died: Callable[[str, BaseException], None] = lambda name, error: None
    stop_begun: Callable[[float], None] = lambda wait: None  # the job is being stopped; it may take ``wait`` s


def start_thread(name: str, target: Callable, *args, hooks: RunHooks) -> threading.Thread:
    """A daemon thread whose unexpected death is reported through ``hooks``
    (the run then stops and names it), instead of leaving others waiting."""

    def guarded() -> None:
        try:
            if name.split(":")[0] in _injected_faults():
                raise RuntimeError(f"fault injected by {contract.INJECT_THREAD_FAULT}")
            target(*args)
        except BaseException as error:  # noqa: B036 -- anything that ends the thread
            hooks.thread_died(name, error)

    thread = threading.Thread(target=guarded, name=name, daemon=True)
    thread.start()
    return thread


def _injected_faults() -> set[str]:
    return set(filter(None, os.environ.get(contract.INJECT_THREAD_FAULT, "").split(",")))


def wait_until(ready: Callable[[], bool], hooks: RunHooks, timeout: float | None = None) -> bool:
    """Poll ``ready`` until it holds (True) or ``timeout`` passes (False);
    raises Interrupted as soon as the run is stopping."""
    end = None if timeout is None else time.monotonic() + timeout
    pause = FIRST_POLL
    while True:
        if hooks.stopping():  # first: what made ``ready`` true may be the reason to stop
            raise Interrupted()
        if ready():
            break
        left = pause if end is None else min(pause, end - time.monotonic())
        if left <= 0:
            return False
        time.sleep(left)
        pause = min(POLL, 2 * pause)  # a quick answer is heard at once, a slow one costs few looks
    return True


def _unheard(*_args) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class News:
    """What a child whose far end reports (``reports_joins``) passes on to the
    supervisor, from any thread: the controller's arrival at the rendezvous
    (and whether it enabled recoverability), and each change of its activity (the stall watchdog's:
    the line its sampler wrote, ``contract.read_activity_file``)."""

    joined: Callable[[bool], None] = _unheard  # recoverable: it enabled JAX's fault tolerance
    activity: Callable[[str], None] = _unheard


NO_NEWS = News()


class StreamFilter(Protocol):
    """What a backend's child takes out of one of its output streams before
    the bytes reach the log: facts its far end sends in-band (an SSH agent's
    joined marker and its report home).  The supervisor and the pump
    never read such facts themselves; the child hears them and passes each on
    the one way every backend does (``News``, the error file, ``wait``).
    The pump calls ``feed`` for every read and ``close`` once, at the end of
    the stream, both from its one thread."""

    def feed(self, data: bytes) -> bytes:
        """The process's own bytes in ``data``; what may start a fact is held back."""

    def close(self) -> bytes:
        """At the end of the stream: bytes held back that were the process's after all."""


class Child(Protocol):
    """One running controller, as the supervisor sees it.  Every backend's
    child has each of these; the supervisor probes for nothing.

    The facts a controller leaves reach the supervisor one way, whatever the
    backend: its error record in the error file the supervisor named in the
    spawn's ``extra_env`` (written by the child itself locally, by the
    backend's child when the record came home from a far end); its
    resources with its exit (``wait``); its arrival at the rendezvous and its
    changes between busy and idle either as the joined and activity files
    the supervisor watches (``reports_joins`` False) or through the spawn's
    ``News`` (True)."""

    # The process jaxrun holds for it: the controller itself locally, a
    # helper where a far end runs it (the local ssh client, the scheduler
    # step).  The controller's own pid, where it differs, comes with the
    # exit (``ChildExit.pid``), and is final then.  Signals go through
    # ``send``, never to this pid.
    pid: int
    stdout: BinaryIO | None  # None: it writes into the log writer's pipe it was given (``log_fds``)
    stderr: BinaryIO | None
    reports_joins: bool  # True: the child tells the spawn's ``News``; no joined or activity file is watched

    def send(self, signum: int) -> None:
        """Signal the controller's whole process group (grandchildren too);
        nothing once it has been reaped."""

    def wait(self) -> ChildExit:
        """Block until it ends, and what travels with its end has arrived
        (within a bound: nothing waits forever)."""

    def stream_filter(self, stream: Stream) -> StreamFilter | None:
        """What to take out of ``stream`` before the log (None: nothing)."""


Chooser = Callable[[Sequence[Host], Mapping[str, str]], tuple[tuple[Host, ...], int]]


@dataclasses.dataclass(frozen=True)
class Ask:
    """What the run loop asks of one attempt's placement.

    The first attempt, and every restart that is not elastic, asks for the
    launch's own ``hosts`` and ``num_processes`` (``recheck`` False).  An
    elastic restart asks for ``hosts``, the candidates in order of preference
    (the last attempt's hosts first, then the spares, the lost ones left out),
    with ``recheck`` True: the backend checks each one again and calls
    ``choose`` with those that passed and {name: why} for those it left out;
    ``choose`` returns the hosts and the process count the attempt uses, or
    raises (too few hosts left)."""

    hosts: tuple[Host, ...]
    num_processes: int
    recheck: bool = False
    choose: Chooser | None = None


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one attempt runs, decided once (``Backend.place``) before any of
    it starts: the plan's hosts and process count, the hosts left out with
    why, and what else the plan needs that only the backend knows
    (``LaunchOptions`` fields, e.g. each SSH host's GPUs)."""

    hosts: tuple[Host, ...]
    num_processes: int
    dropped: Mapping[str, str] = dataclasses.field(default_factory=dict)
    facts: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def record(self) -> PlacementRecord:
        return PlacementRecord(tuple(h.name for h in self.hosts), self.num_processes, tuple(self.dropped.items()))

    @classmethod
    def chosen(cls, ask: Ask, problems: Mapping[str, str], facts: Mapping[str, object] | None = None) -> Placement:
        """An elastic ask's placement once the backend checked its hosts:
        ``problems`` names those it left out."""
        good = [host for host in ask.hosts if host.name not in problems]
        hosts, count = ask.choose(good, problems) if ask.choose else (tuple(good), ask.num_processes)
        return cls(tuple(hosts), count, dict(problems), dict(facts or {}))


class Backend(abc.ABC):
    name: str = ""
    title: str = ""  # the engine as users call it, in a sentence ("Slurm"); empty: the name
    writes_log_files: bool = False
    # ``spawn`` may start one process again while the others of its attempt
    # run (a recoverable job's; see launcher.restarts.policy).  False: the backend
    # starts an attempt's processes as one gang (a scheduler step, Ray's group).
    starts_one_again: bool = False
    hooks: RunHooks = RunHooks()  # the run loop sets its own before open()

    def start_thread(self, name: str, target: Callable, *args) -> threading.Thread:
        return start_thread(name, target, *args, hooks=self.hooks)

    def open(self) -> None:
        """Before the first attempt: connections and checks that span the run."""

    @abc.abstractmethod
    def choose_coordinator(self, fixed: str | None) -> tuple[str, str | None]:
        """(address every process connects to, address process 0 binds, or
        None when the backend's far end decides), honouring --coordinator."""

    def place(self, ask: Ask) -> Placement:
        """Where this attempt runs; the one call that decides it, made once per
        attempt after ``open`` and before ``choose_coordinator``.  It may take
        long (a cluster placing the processes, hosts checked again): the run's
        ``--timeout`` counts, and its waits go through ``wait_until``.  A
        backend that places nothing itself takes what it is asked."""
        if ask.recheck:
            raise NotImplementedError(f"the {self.name} backend does not choose its hosts")
        return Placement(ask.hosts, ask.num_processes)

    def dry_run_coordinator(self, fixed: str | None) -> tuple[str, str | None]:
        """What --dry-run shows; it must not start or contact anything."""
        return self.choose_coordinator(fixed)

    def dry_run_command(self, specs: Sequence[ProcessSpec]) -> list[str] | None:
        """For --dry-run: the command the attempt's engine would run on this
        machine for these specs (srun, mpirun, with every option), when one
        process starts them all; None where each process starts alone."""
        return None

    def pool(self) -> list[Host]:
        """The hosts an elastic restart chooses from, when no --hosts-command
        lists them: those it was given (SSH), the allocation's nodes (Slurm)."""
        raise NotImplementedError(f"the {self.name} backend does not choose its hosts")

    def begin_attempt(self, specs: Sequence[ProcessSpec], log_dir: str) -> None:
        """One attempt is about to start these processes."""

    @abc.abstractmethod
    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None, news: News) -> Child:
        """Start one controller.  ``lifeline_fd`` is the read end of a pipe
        only the launcher writes to; a local child must hold it open.
        ``extra_env`` holds the error, joined and activity files' paths
        (contract.ERROR_FILE, contract.JOINED_FILE, contract.ACTIVITY_FILE) on
        the launcher's machine; ``news`` is for a child whose ``reports_joins``
        is true, from any thread."""

    def job_is_recoverable(self) -> None:
        """The restart policy decided, from every process's announcement, that
        this attempt's job is recoverable.  A backend whose far ends end their
        tasks themselves (a gang's task agents) tells them here, and they obey;
        the others have nothing to do: jaxrun itself spares the survivors."""

    def bring_home(self, spec: ProcessSpec, here: str, wait: float) -> str | None:
        """The traces ``spec``'s process finished (``contract.traces``), into
        ``here``: the trace folder the launcher named for it.  A backend whose
        far end keeps them elsewhere (its own host) fetches them, waiting up
        to ``wait`` seconds for a trace still being written; the others have
        nothing to do.  Why they could not come, or None."""
        return None

    def end_attempt(self) -> None:
        """The attempt is over and every child has exited."""

    def close(self) -> None:
        """After the last attempt, or when the run is abandoned."""

    def abort(self) -> None:
        """Last resort, from the watchdog thread while other threads may be
        stuck: end whatever this backend started (remote processes, a pending
        scheduler step) without waiting on anything.  Must not block."""

    def __enter__(self) -> Backend:
        try:
            self.open()
        except BaseException:  # half-open (a failed preflight, a signal): undo what started
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()
