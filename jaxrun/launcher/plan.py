"""Pure planning: launch options in, one ProcessSpec per controller out.

Nothing here touches the system: no ports are probed, no files are written,
no processes start.  The CLI resolves everything impure (free ports, the run
id, the hosts file) first and hands the values in, which keeps this step easy
to unit-test exhaustively.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Mapping, Sequence

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


def assign_hosts(hosts: Sequence[Host], num_processes: int) -> list[tuple[Host, int]]:
    """Fill slots in host order: returns (host, local_rank) for each rank."""
    if num_processes < 1:
        raise PlanError(f"the number of processes must be at least 1, got {num_processes}")
    total = sum(h.slots for h in hosts)
    if num_processes > total:
        raise PlanError(
            f"{num_processes} processes requested but the hosts have only {total} slots"
        )
    placement: list[tuple[Host, int]] = []
    for host in hosts:
        for local in range(host.slots):
            if len(placement) == num_processes:
                return placement
            placement.append((host, local))
    return placement


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


def device_env(opts: LaunchOptions, local_rank: int, local_count: int, host: str) -> dict[str, str]:
    """The variables that give a controller its accelerators.

    Under a scheduler the placement above is only a guess (every rank on one
    "localhost"): which tasks share a node is decided when the step starts.
    So the plan claims no device ids there; it passes K on, and each task's
    agent derives its ids from the local rank the scheduler gave it.
    """
    if opts.scheduled:
        if opts.devices_per_process is None:
            return {}
        if opts.devices_per_process < 1:
            raise PlanError(f"--devices-per-process must be at least 1, got {opts.devices_per_process}")
        return {contract.TASK_DEVICES_PER_PROCESS: str(opts.devices_per_process)}
    per_host = opts.host_devices.get(host, opts.devices_per_host)
    ids = local_device_ids(local_rank, local_count, opts.devices_per_process, per_host, host)
    return {} if ids is None else {contract.JAX_LOCAL_DEVICE_IDS: ",".join(map(str, ids))}


def plan(opts: LaunchOptions) -> list[ProcessSpec]:
    if opts.cpu_devices is not None and opts.devices_per_process is not None:
        raise PlanError("--cpu-devices and --devices-per-process cannot be used together")
    placement = assign_hosts(opts.hosts, opts.num_processes)

    def machine(host: Host) -> str:
        return opts.host_machines.get(host.name, host.name)

    per_machine: dict[str, int] = {}
    for host, _ in placement:
        per_machine[machine(host)] = per_machine.get(machine(host), 0) + 1
    local_of: dict[str, int] = {}
    specs = []
    for rank, (host, _) in enumerate(placement):
        local_rank = local_of[machine(host)] = local_of.get(machine(host), -1) + 1
        local_count = per_machine[machine(host)]
        values = contract.placeholder_values(rank, opts.num_processes, local_rank, opts.coordinator)
        target = dataclasses.replace(
            opts.target, args=tuple(contract.substitute(a, values) for a in opts.target.args)
        )
        env = dict(opts.extra_env)
        env.update(contract_env(opts, rank, local_rank, local_count))
        env.update(device_env(opts, local_rank, local_count, host.name))
        specs.append(
            ProcessSpec(
                rank=rank,
                local_rank=local_rank,
                host=host,
                python=opts.python,
                shim_args=shim_args(target),
                env=env,
            )
        )
    return specs


def contract_env(opts: LaunchOptions, rank: int, local_rank: int, local_count: int) -> dict[str, str]:
    env = contract.process_env(
        coordinator=opts.coordinator, num_processes=opts.num_processes, process_id=rank,
        local_process_id=local_rank, local_process_count=local_count, run_id=opts.run_id,
        restart_count=opts.restart_count,
    )
    if opts.bind_address and rank == 0:
        env.update(contract.bind_env(opts.bind_address))
    if opts.cpu_devices is not None:
        env.update(contract.cpu_env(opts.cpu_devices))
    if opts.mesh:
        env[contract.MESH] = opts.mesh
    if opts.mesh_axis_types:
        env[contract.MESH_AXIS_TYPES] = opts.mesh_axis_types
    if opts.verbose:
        env[contract.VERBOSE] = "1"
    if opts.flight_recorder:
        env[contract.FLIGHT_RECORDER] = str(opts.flight_recorder)
    if opts.check_divergence:
        env[contract.CHECK_DIVERGENCE] = "1"
    return env
