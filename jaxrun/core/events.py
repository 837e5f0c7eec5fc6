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
class Exited:
    """A child's ``wait`` returned: the fields of its ``ChildExit``."""

    rank: int
    returncode: int  # Popen style: negative for a signal
    at: float  # the supervisor's clock, as the event was made
    resources: contract.Resources | None = None  # what it used, where its backend measures it
    reaped_at: float | None = None  # wall clock of the reaper's machine (ChildExit.reaped_at)
    clock: str | None = None  # which machine's clock that is
    pid: int | None = None  # the controller's own pid, where it differs from the child's
    lost: str | None = None  # the helper whose end stood in for the controller's


@dataclasses.dataclass(frozen=True)
class SignalReceived:
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
class Joined:
    """A process arrived at the job's rendezvous, as its child reported (``on_join``)."""

    rank: int
