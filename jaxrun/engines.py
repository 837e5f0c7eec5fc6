"""Existing schedulers as launch engines: Slurm (``srun``) and Open MPI (``mpirun``).

Building the scheduler's command line is pure and lives here; running it and
turning its tasks back into one Child per rank is :mod:`jaxrun.taskchannel`.
Each task runs ``python -m jaxrun.task -- python -m jaxrun.shim ...`` with
``JAXRUN_RANK_SOURCE`` telling the shim to take its rank from the scheduler.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Mapping, Sequence, TextIO

from jaxrun import contract
from jaxrun import plan as planning
if TYPE_CHECKING:  # the channel is loaded only when a step is started
    from jaxrun.taskchannel import StepSpawner

ENGINES = ("slurm", "mpirun")
RANK_SOURCE = {"slurm": "slurm", "mpirun": "mpi"}
# What mpirun must carry to remote nodes besides jaxrun's own variables; it
# forwards nothing by default (srun forwards everything).
MPI_FORWARD = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
MPI_FORWARD_PREFIXES = contract.CONTRACT_PREFIXES + ("XLA_",)


class EngineError(planning.PlanError):
    """The engine options cannot work together; the message says why."""


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    kind: str  # one of ENGINES
    nodes: int | None = None
    tasks_per_node: int | None = None
    scheduler_args: tuple[str, ...] = ()  # passed to srun/mpirun verbatim


def task_argv(python: str, target: planning.Target) -> list[str]:
    """What every task runs.  Placeholders stay in: the task fills them in from
    its scheduler-given rank, since one command line serves every rank."""
    return [python, "-m", "jaxrun.task", "--", *planning.shim_argv(python, target)]


def srun_command(engine: EngineOptions, num_processes: int, task: Sequence[str]) -> list[str]:
    # One step.  Inside an allocation (SLURM_JOB_ID set) srun uses it; outside,
    # srun asks for one.  --kill-on-bad-exit ends every task once one fails,
    # even if jaxrun itself cannot reach them.
    argv = ["srun", "--kill-on-bad-exit=1", f"--ntasks={num_processes}"]
    if engine.nodes:
        argv.append(f"--nodes={engine.nodes}")
    if engine.tasks_per_node:
        argv.append(f"--ntasks-per-node={engine.tasks_per_node}")
    return argv + list(engine.scheduler_args) + list(task)


def mpirun_command(engine: EngineOptions, num_processes: int, task: Sequence[str], env: Mapping[str, str], is_root: bool) -> list[str]:
    if engine.nodes:
        raise EngineError("--nodes works with --launcher slurm only; give mpirun its hosts with --scheduler-arg")
    argv = ["mpirun", "-n", str(num_processes)]
    if engine.tasks_per_node:
        argv += ["--map-by", f"ppr:{engine.tasks_per_node}:node"]
    if is_root:
        argv.append("--allow-run-as-root")  # mpirun refuses root without it
    for name in sorted(env):
        if name in MPI_FORWARD or name.startswith(MPI_FORWARD_PREFIXES):
            argv += ["-x", name]  # by name: values (the channel secret) stay off the command line
    return argv + list(engine.scheduler_args) + list(task)


def step_env(engine: EngineOptions, specs: Sequence[planning.ProcessSpec], base: Mapping[str, str]) -> dict[str, str]:
    """One environment for every task: what all specs share, plus the rank source.
    Per-rank values (process id, local id) come from the scheduler instead."""
    first = dict(specs[0].env)
    common = {k: v for k, v in first.items() if all(s.env.get(k) == v for s in specs[1:])}
    for name in (contract.PROCESS_ID, contract.LOCAL_PROCESS_ID, contract.LOCAL_PROCESS_COUNT):
        common.pop(name, None)
    env = dict(base)
    env.update(common)
    env[contract.RANK_SOURCE] = RANK_SOURCE[engine.kind]
    return env


def task_coordinator(fixed: str | None) -> tuple[str, str | None]:
    """``choose_coordinator`` for engines: task 0 picks a free port on its own
    node at start (see jaxrun.task), unless --coordinator fixed one."""
    return fixed or "", None


def step_spawner(engine: EngineOptions, options: planning.LaunchOptions, specs, log_dir: str,
                 console: TextIO, fixed_coordinator: str | None = None) -> StepSpawner:
    env = step_env(engine, specs, os.environ)
    task = task_argv(options.python, options.target)
    if engine.kind == "slurm":
        build = lambda e: srun_command(engine, options.num_processes, task)  # noqa: E731
    else:
        is_root = os.geteuid() == 0
        build = lambda e: mpirun_command(engine, options.num_processes, task, e, is_root)  # noqa: E731
    build(env)  # bad combinations fail here, before anything starts
    name = "srun" if engine.kind == "slurm" else "mpirun"
    from jaxrun.taskchannel import StepSpawner

    return StepSpawner(name, specs, build, env, log_dir, console, fixed_coordinator)
