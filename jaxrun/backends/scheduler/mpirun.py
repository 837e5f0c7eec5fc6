"""``--launcher mpirun``: each attempt is one Open MPI ``mpirun`` step.

mpirun takes its hosts from its own arguments (``--scheduler-arg``), so
jaxrun chooses none: the base class's placement is right, and there is no
elastic restart.  What is mpirun's own is its command line, and what it
must forward to other nodes, by name.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence

from jaxrun import contract
from jaxrun.backends.scheduler.backend import SchedulerBackend
from jaxrun.backends.scheduler.options import MpirunOptions
from jaxrun.backends.scheduler.step import Command
from jaxrun.core import forward

# What mpirun must carry to remote nodes besides what the plan sets (jaxrun's
# variables, the user's --env/-x, PYTHONUNBUFFERED): it forwards nothing by
# default (srun forwards everything), so jaxrun names what core.forward
# carries for an engine, and every JAXRUN_*/JAX_* name.  Local ranks inherit
# mpirun's whole environment, so a missing name shows only on other nodes.


def mpi_forwards(name: str) -> bool:
    return forward.carried(name, engine=True) or name.startswith(contract.CONTRACT_PREFIXES)


def mpirun_command(options: MpirunOptions, num_processes: int, task: Sequence[str], env: Mapping[str, str],
                   is_root: bool, planned: Iterable[str] = ()) -> list[str]:
    """``planned``: the names the plan set for every process, which must reach
    every node whatever they are called."""
    argv = ["mpirun", "-n", str(num_processes)]
    if options.tasks_per_node:
        argv += ["--map-by", f"ppr:{options.tasks_per_node}:node"]
    if is_root:
        argv.append("--allow-run-as-root")  # mpirun refuses root without it
    planned = set(planned)
    for name in sorted(env):
        if name in planned or mpi_forwards(name):
            argv += ["-x", name]  # by name: values (the channel secret) stay off the command line
    return argv + list(options.scheduler_args) + list(task)


class MpirunProcess(Command):
    """The mpirun of one step; it is started shielded and ends on SIGKILL."""

    program = "mpirun"
    repeats = (b"a non-zero exit code. Per user-direction", b"exited with non-zero status", b"exited on signal")

    def __init__(self, options: MpirunOptions, count: int, task: Sequence[str], planned: Iterable[str]):
        self.options, self.count, self.task, self.planned = options, count, list(task), tuple(planned)
        self.is_root = os.geteuid() == 0

    def argv(self, env: Mapping[str, str]) -> list[str]:
        return mpirun_command(self.options, self.count, self.task, env, self.is_root, self.planned)


class MpirunBackend(SchedulerBackend):
    """Every attempt is one mpirun step."""

    name = "mpirun"
    title = "Open MPI's mpirun"
    options_type = MpirunOptions
    rank_source = "mpirun"

    def step_process(self, count: int, task: Sequence[str], planned: Iterable[str]) -> MpirunProcess:
        return MpirunProcess(self.options, count, task, planned)
