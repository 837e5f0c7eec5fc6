"""Pure planning: launch options in, one ProcessSpec per controller out.

Nothing here touches the system: no ports are probed, no files are written,
no processes start.  The CLI resolves everything impure (free ports, the run
id, the hosts file) first and hands the values in, which keeps this step easy
to unit-test exhaustively.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxrun import contract
from jaxrun.contract import devices
from jaxrun.core.spec import (  # noqa: F401 -- the plan's vocabulary
    LOCAL_HOST,
    Host,
    LaunchOptions,
    PlanError,
    ProcessSpec,
    Target,
    common_env,
    local_device_ids,
    shim_args,
)


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
    if opts.tpu_chips:
        if local_count == 1 and opts.devices_per_process is None:
            return {}  # the one process owns every chip, as a bare python does
        try:
            return devices.tpu_env(opts.tpu_chips, local_rank, local_count, opts.devices_per_process, opts.tpu_ports)
        except ValueError as e:
            raise PlanError(str(e)) from None
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
                python=host.python or opts.python,
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
    env[contract.CHECKS] = opts.checks
    if opts.stall_timeout:
        env[contract.STALL_TIMEOUT] = f"{opts.stall_timeout:g}"
    if not opts.account:
        env[contract.ACCOUNT] = contract.ACCOUNT_OFF
    if opts.recoverable is not None:  # unset: as the processes announce (a task agent's "auto")
        env[contract.RECOVERABLE_MODE] = "on" if opts.recoverable else "off"
    if opts.compile_cache and not contract.own_compile_cache(opts.extra_env):
        env[contract.COMPILE_CACHE] = opts.compile_cache
    return env
