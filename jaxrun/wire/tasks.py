"""The scheduler task channel: what a task agent (``backends/scheduler/task_agent.py``,
one per rank, started by srun, mpirun or a Ray actor) and the launcher's
listener (``backends/scheduler/channel.py``) say to each other.

Each task opens three connections (``CONTROL``, ``STDOUT``, ``STDERR``),
each with a ``TaskHello`` that the launcher answers with an ``Ack``.  On the
control connection, the task sends ``Coordinator`` (task 0's choice),
``TaskJoined``, ``TaskActivity``, ``Error`` and ``Exit``; the launcher sends
``Start``, ``Signal`` and, once it has the exit, ``Ack``.
"""

from typing import ClassVar

from jaxrun.wire.controller import (
    CONTROL as CONTROL,
    STDERR as STDERR,
    STDOUT as STDOUT,
    Exit as Exit,
    Signal as Signal,
)
from jaxrun.wire.encoding import Message, message


@message("hello")
class TaskHello(Message):
    """First line of each task connection: which run, which rank, which stream."""

    secret: str
    rank: int
    kind: str  # one of STREAM_KINDS

    STREAM_KINDS: ClassVar[tuple[str, ...]] = (CONTROL, STDOUT, STDERR)


@message("coordinator")
class Coordinator(Message):
    """Task 0's choice of coordinator address, on its own node."""

    address: str


@message("start")
class Start(Message):
    """Every task may start its controller, which joins ``address``."""

    address: str


@message("joined")
class TaskJoined(Message):
    """The controller has arrived at the job's rendezvous (``recoverable``: it enabled JAX's fault tolerance)."""

    recoverable: bool = False


@message("activity")
class TaskActivity(Message):
    """The controller's sampler changed state: ``contract.BUSY``, ``contract.IDLE``, ``contract.FINISHED``
    or a SPIN line with its details (``contract.Spinning``): the line it wrote."""

    state: str


@message("error")
class Error(Message):
    """The controller's error record (``contract.ErrorRecord.to_json``)."""

    record: str


@message("recoverable")
class JobRecoverable(Message):
    """The launcher decided that the job is recoverable (every process said so
    at its join): a task whose controller, other than process 0, fails ends
    with 0, so that the scheduler's own fail-fast leaves the others be."""


@message("ack")
class Ack(Message):
    """The launcher took a connection (its answer to a ``TaskHello``), or has the exit code (the task may end)."""
