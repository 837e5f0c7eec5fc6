"""Typed messages that threads send to the supervisor's single event queue."""

from __future__ import annotations

import dataclasses
import enum

from jaxrun import contract


class Stream(enum.Enum):
    STDOUT = "stdout"
    STDERR = "stderr"


@dataclasses.dataclass(frozen=True)
class StreamClosed:
    rank: int
    stream: Stream


@dataclasses.dataclass(frozen=True)
class ChildExit:
    """How a controller ended, as its reaper saw it.

    ``reaped_at`` is the wall clock (``time.time()``) of the machine whose
    process reaped the controller, read as it saw the end, and ``clock``
    names that machine (``core.causes.clock_id()``): two ends are put in
    time order only when they name the same clock.  ``lost`` is set when the
    controller's end was never reported: what stood between jaxrun and the
    controller (the ssh client, the connection to a host agent, the
    preloading server, a task agent) ended instead, and ``returncode`` is a
    stand-in (255, or SIGKILL where jaxrun then killed the controller)."""

    returncode: int  # Popen style: negative for a signal
    resources: contract.Resources | None = None  # measured where it was reaped; None if unknown
    reaped_at: float | None = None  # wall clock of the reaper's machine; None if unknown
    clock: str | None = None  # that machine; None: never compared with another's
    pid: int | None = None  # the controller's own pid, where the child's ``pid`` is a helper's
    lost: str | None = None  # the helper whose end stands in for the controller's ("the ssh client")
    marks: contract.Marks | None = None  # its compiles and checkpoint saves (contract.MARKS_FILE), where heard


@dataclasses.dataclass(frozen=True)
class Exited:
    """A child's ``wait`` returned."""

    rank: int
    end: ChildExit
    at: float  # the supervisor's clock, as the event was made


@dataclasses.dataclass(frozen=True)
class SignalReceived:
    signum: int


@dataclasses.dataclass(frozen=True)
class Forward:
    """Send this signal to every running process, and stop nothing: an
    interactive session's Ctrl-C, meant for the statement that runs."""

    signum: int


@dataclasses.dataclass(frozen=True)
class ThreadDied:
    """A launcher thread ended with an exception: a bug in jaxrun."""

    name: str
    error: str  # "TypeName: message"


@dataclasses.dataclass(frozen=True)
class LogWriteFailed:
    """jaxrun could not write a log file it keeps for a remote process."""

    rank: int
    path: str
    error: str  # strerror


@dataclasses.dataclass(frozen=True)
class Activity:
    """A process's activity changed (busy, idle, spin), as its child reported (``News.activity``)."""

    rank: int
    state: str  # the activity line: contract.BUSY, contract.IDLE, a SPIN line (contract.activity_word)


@dataclasses.dataclass(frozen=True)
class Joined:
    """A process arrived at the job's rendezvous, as its child reported (``on_join``)."""

    rank: int
    recoverable: bool = False  # it enabled JAX's fault tolerance
