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
    rank: int
    returncode: int  # Popen style: negative for a signal
    at: float
    resources: contract.Resources | None = None  # what it used, where its backend measures it


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
