"""The shared description of a launch: what to run, where, and each process's spec.

Every side reads these types: the planner builds ProcessSpecs from
LaunchOptions, the backends start them, and the reports describe them.
Nothing here touches the system.
"""


from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence

from jaxrun import contract


class PlanError(ValueError):
    """The options cannot describe a valid launch; the message says why."""


@dataclasses.dataclass(frozen=True)
class Target:
    """What each controller runs: a script path or a module, and its arguments."""

    name: str
    args: tuple[str, ...] = ()
    is_module: bool = False


@dataclasses.dataclass(frozen=True)
class Host:
    """One line of a hosts file or one ``-H`` entry."""

    name: str
    slots: int = 1
    user: str | None = None
    port: int | None = None
    python: str | None = None  # its own interpreter (python= in a hosts file); None: --python's

    @property
    def ssh_target(self) -> str:
        return f"{self.user}@{self.name}" if self.user else self.name


LOCAL_HOST = Host("localhost", slots=sys.maxsize)


@dataclasses.dataclass(frozen=True)
class LaunchOptions:
    target: Target
    num_processes: int
    coordinator: str  # host:port every process connects to
    run_id: str
    bind_address: str | None = None  # host:port the service listens on
    cpu_devices: int | None = None
    hosts: tuple[Host, ...] = (LOCAL_HOST,)
    python: str = sys.executable
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    mesh: str | None = None
    mesh_axis_types: str | None = None
    restart_count: int = 0
    verbose: bool = False
    devices_per_process: int | None = None  # accelerator devices per controller
    devices_per_host: int | None = None  # accelerators seen on each host, if known
    # This machine's TPU chips, where a local run splits them among its
    # processes (contract.devices.tpu_env), and a TCP port for each process,
    # where libtpu's processes meet (none for one process).
    tpu_chips: tuple[int, ...] = ()
    tpu_ports: tuple[int, ...] = ()
    # Slurm or Open MPI places the processes: a process's local rank (and so
    # its devices) is the scheduler's to give, when the step starts.
    scheduled: bool = False
    # Learned by the SSH preflight, by host name: the GPUs each host has, and
    # which machine it is (two names of one machine share local ranks and
    # devices, as processes on one machine must).
    host_devices: Mapping[str, int] = dataclasses.field(default_factory=dict)
    host_machines: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flight_recorder: int | None = None  # --flight-recorder K: entries each process keeps
    check_divergence: bool = False  # --check-divergence
    checks: str = "on"  # --checks: contract.CHECKS_MODES
    stall_timeout: float = 0.0  # --stall-timeout: 0 is off
    account: bool = True  # the time account and the straggler rule (--no-account: off)
    recoverable: bool | None = None  # --recoverable (True), --no-recoverable (False); None: as the processes say
    compile_cache: str = ""  # contract.COMPILE_CACHE: a folder here, a run's name elsewhere; empty: none


@dataclasses.dataclass(frozen=True)
class ProcessSpec:
    """Everything needed to start one controller, wherever it runs."""

    rank: int
    local_rank: int
    host: Host
    python: str
    shim_args: tuple[str, ...]  # after ``python -m jaxrun.shim``: the user's target
    env: Mapping[str, str]  # only what jaxrun sets; the backend adds the rest

    @property
    def argv(self) -> tuple[str, ...]:
        return contract.shim_argv(self.python, self.shim_args)


def shim_args(target: Target) -> tuple[str, ...]:
    return contract.target_args(target.name, target.args, target.is_module)


def common_env(specs: Sequence[ProcessSpec]) -> dict[str, str]:
    """The variables every process gets with the same value."""
    first = dict(specs[0].env)
    return {k: v for k, v in first.items() if all(s.env.get(k) == v for s in specs[1:])}


def local_device_ids(
    local_rank: int,
    local_count: int,
    per_process: int | None,
    per_host: int | None,
    host: str = "localhost",
) -> list[int] | None:
    """Which of its host's accelerators a controller owns; None means all of them.

    With ``per_process`` K, local process r owns ``[r*K, ..., r*K+K-1]``.  Without
    it, one process per host owns everything, and several split the host's
    devices evenly.
    """
    if per_process is None:
        if local_count == 1 or not per_host:
            return None
        if per_host % local_count:
            raise PlanError(
                f"{per_host} devices on {host} cannot be split evenly among {local_count} "
                f"processes; pass --devices-per-process"
            )
        per_process = per_host // local_count
    if per_process < 1:
        raise PlanError(f"--devices-per-process must be at least 1, got {per_process}")
    if per_host and local_count * per_process > per_host:
        raise PlanError(
            f"{local_count} processes x {per_process} devices need {local_count * per_process} "
            f"devices, but {host} has {per_host}"
        )
    return list(range(local_rank * per_process, (local_rank + 1) * per_process))
