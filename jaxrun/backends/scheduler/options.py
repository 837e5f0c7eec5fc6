"""What a run under a scheduler step needs beyond the launch, one type per engine.

The registry's ``options`` build these from the command line's values
(``slurm_options``, ``mpirun_options``); each refuses what its engine
cannot do.  The type alone says which engine runs
(:mod:`jaxrun.backends.scheduler.engines` builds its backend).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from jaxrun.core.config import LaunchError
from jaxrun.core.spec import LaunchOptions

NODES_REFUSED = "--nodes works with --launcher slurm only; give mpirun its hosts with --scheduler-arg"


@dataclasses.dataclass(frozen=True)
class SchedulerOptions:
    """A run as one scheduler step; a subclass per engine."""

    tasks_per_node: int | None = None
    scheduler_args: tuple[str, ...] = ()  # passed to the engine's program verbatim
    channel_port: int | None = None  # --channel-port: the task channel's port; None: a free one


@dataclasses.dataclass(frozen=True)
class SlurmOptions(SchedulerOptions):
    """One srun step, in the Slurm allocation or a new one."""

    nodes: int | None = None  # --nodes: spread the tasks over this many nodes


@dataclasses.dataclass(frozen=True)
class MpirunOptions(SchedulerOptions):
    """One Open MPI mpirun step; mpirun takes its hosts from its own
    arguments, so it has no ``nodes``."""


def slurm_options(values: Mapping[str, Any], launch: LaunchOptions) -> SlurmOptions:
    return SlurmOptions(values.get("tasks_per_node"), tuple(values.get("scheduler_args") or ()),
                        channel_port(values), values.get("nodes"))


def mpirun_options(values: Mapping[str, Any], launch: LaunchOptions) -> MpirunOptions:
    if values.get("nodes"):
        raise LaunchError(NODES_REFUSED)
    return MpirunOptions(values.get("tasks_per_node"), tuple(values.get("scheduler_args") or ()),
                         channel_port(values))


def channel_port(values: Mapping[str, Any]) -> int | None:
    port = values.get("channel_port")
    if port is not None and port > 65535:
        raise LaunchError(f"--channel-port {port}: a TCP port is at most 65535")
    return port
