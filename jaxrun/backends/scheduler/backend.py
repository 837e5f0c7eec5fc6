"""Existing schedulers as backends: what Slurm (``srun``) and Open MPI (``mpirun``) share.

One attempt is one scheduler step.  ``SchedulerBackend`` builds it: one
environment for every task, and the engine's own ``StepProcess``
(:mod:`jaxrun.backends.scheduler.slurm`, :mod:`jaxrun.backends.scheduler.mpirun`),
which the shared :mod:`jaxrun.backends.scheduler.step` runs.  Each rank's Child
is :mod:`jaxrun.backends.scheduler.child`, fed by the task channel the tasks
connect back to (:mod:`jaxrun.backends.scheduler.channel`).  Each task runs
the task agent (:mod:`jaxrun.backends.scheduler.task_agent`), which starts the
shim with ``contract.RANK_SOURCE`` telling it to take its rank from the
scheduler.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from jaxrun import contract
from jaxrun.backends.scheduler.options import SchedulerOptions
from jaxrun.contract import devices
from jaxrun.core import spec as planning
from jaxrun.core.backend import Backend, News

if TYPE_CHECKING:  # the step is loaded only when one is started
    from jaxrun.backends.scheduler.child import RankChild
    from jaxrun.backends.scheduler.step import Command, Step


def task_argv(python: str, shim_args: Sequence[str]) -> list[str]:
    """What every task runs.  Placeholders stay in: the task fills them in from
    its scheduler-given rank, since one command line serves every rank."""
    return [python, "-m", contract.SCHEDULER_AGENT_MODULE, "--", *contract.shim_argv(python, shim_args)]


def step_env(rank_source: str, specs: Sequence[planning.ProcessSpec], base: Mapping[str, str],
             devices_per_process: int | None = None) -> dict[str, str]:
    """One environment for every task: what all specs share, plus the rank
    source (a key of ``contract.RANK_SOURCES``).  Per-rank values (process id,
    local id, device ids) come from the scheduler instead: with
    --devices-per-process each task derives its devices from its local rank
    (see the task agent); without it, from the GPUs the engine bound to the
    task, or an even share of its node's (``contract.devices``)."""
    common = planning.common_env(specs)
    for name in (contract.PROCESS_ID, contract.LOCAL_PROCESS_ID, contract.LOCAL_PROCESS_COUNT,
                 contract.JAX_LOCAL_DEVICE_IDS):
        common.pop(name, None)
    env = dict(base)
    env.update(common)
    env[contract.RANK_SOURCE] = rank_source
    env[contract.TASK_DEVICES_PER_PROCESS] = devices.AUTO if devices_per_process is None else str(devices_per_process)
    return env


class SchedulerBackend(Backend):
    """Every attempt is one scheduler step; each rank is a Child.  A subclass
    per engine says where the ranks come from and what process the step is."""

    writes_log_files = False
    rank_source: str = ""  # the key of contract.RANK_SOURCES its tasks read their ranks from
    options_type: type[SchedulerOptions] = SchedulerOptions  # the options it takes (the engines' table)

    def __init__(self, options: SchedulerOptions, launch: planning.LaunchOptions, console: TextIO,
                 base_env: Mapping[str, str] | None = None):
        self.options = options
        self.launch = launch
        self.console = console
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.fixed: str | None = None
        self.step: Step | None = None

    @abc.abstractmethod
    def step_process(self, count: int, task: Sequence[str], planned: Iterable[str]) -> Command:
        """This attempt's engine process for ``count`` tasks that run ``task``;
        ``planned``: the names the plan set for every process."""

    def choose_coordinator(self, fixed: str | None) -> tuple[str, None]:
        # Task 0 picks a free port on its own node at start (see the task
        # agent), unless --coordinator fixed one.
        self.fixed = fixed
        return fixed or "", None

    def step_parts(self, specs: Sequence[planning.ProcessSpec]) -> tuple[dict[str, str], Command]:
        """The attempt's step: the environment every task starts with (the
        task channel's two variables come when it starts) and its process."""
        env = step_env(self.rank_source, specs, self.base_env, self.launch.devices_per_process)
        task = task_argv(self.launch.python, planning.shim_args(self.launch.target))
        return env, self.step_process(len(specs), task, planning.common_env(specs))

    def dry_run_command(self, specs: Sequence[planning.ProcessSpec]) -> list[str]:
        env, process = self.step_parts(specs)
        return process.argv({**env, contract.TASK_CHANNEL: "", contract.TASK_SECRET: ""})

    def begin_attempt(self, specs: Sequence[planning.ProcessSpec], log_dir: str) -> None:
        env, process = self.step_parts(specs)
        from jaxrun.backends.scheduler.step import Step

        self.step = Step(process, specs, env, log_dir, self.console, self.fixed, hooks=self.hooks,
                         channel_port=self.options.channel_port or 0)

    def spawn(self, spec: planning.ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None, news: News) -> RankChild:
        return self.step.spawn(spec, extra_env, news)

    def job_is_recoverable(self) -> None:
        if self.step is not None:
            self.step.job_is_recoverable()

    def end_attempt(self) -> None:
        if self.step is not None:
            self.step.close()
            self.step = None

    def abort(self) -> None:
        # Read once: end() may clear it from another thread meanwhile.
        step = self.step
        if step is not None:
            step.abort()
