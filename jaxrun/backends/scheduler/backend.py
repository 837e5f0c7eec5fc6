"""Existing schedulers as backends: Slurm (``srun``) and Open MPI (``mpirun``).

One attempt is one scheduler step.  Building the scheduler's command line is
pure and lives here.  Running it is :mod:`jaxrun.backends.scheduler.step`;
each rank's Child is :mod:`jaxrun.backends.scheduler.child`, fed by the task
channel the tasks connect back to (:mod:`jaxrun.backends.scheduler.channel`).
Each task runs the task agent (:mod:`jaxrun.backends.scheduler.task_agent`), which
starts the shim with ``contract.RANK_SOURCE`` telling it to take its rank
from the scheduler.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TextIO

from jaxrun import contract
from jaxrun.core import spec as planning
from jaxrun.core.backend import Backend
from jaxrun.core.config import LaunchError, SchedulerOptions

if TYPE_CHECKING:  # the step is loaded only when one is started
    from jaxrun.backends.scheduler.child import RankChild
    from jaxrun.backends.scheduler.step import Step

# What mpirun must carry to remote nodes besides what the plan sets (jaxrun's
# variables, the user's --env/-x, PYTHONUNBUFFERED); it forwards nothing by
# default (srun forwards everything).  Local ranks inherit mpirun's whole
# environment, so a missing name shows only on other nodes.
MPI_FORWARD = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV")
MPI_FORWARD_PREFIXES = contract.CONTRACT_PREFIXES + ("XLA_",)


class SchedulerError(planning.PlanError):
    """The scheduler options cannot work together; the message says why."""


def task_argv(python: str, shim_args: Sequence[str]) -> list[str]:
    """What every task runs.  Placeholders stay in: the task fills them in from
    its scheduler-given rank, since one command line serves every rank."""
    return [python, "-m", contract.SCHEDULER_AGENT_MODULE, "--", *contract.shim_argv(python, shim_args)]


def srun_command(options: SchedulerOptions, num_processes: int, task: Sequence[str],
                 exclude: Sequence[str] = (), nodes: int | None = None) -> list[str]:
    """One step.  Inside an allocation (SLURM_JOB_ID set) srun uses it; outside,
    srun asks for one.  --kill-on-bad-exit ends every task once one fails,
    even if jaxrun itself cannot reach them.  An elastic restart leaves out
    the nodes in ``exclude``, and asks for ``nodes`` instead of --nodes."""
    argv = ["srun", "--kill-on-bad-exit=1", f"--ntasks={num_processes}"]
    if nodes or options.nodes:
        argv.append(f"--nodes={nodes or options.nodes}")
    if exclude:
        argv.append(f"--exclude={','.join(exclude)}")
    if options.tasks_per_node:
        argv.append(f"--ntasks-per-node={options.tasks_per_node}")
    return argv + list(options.scheduler_args) + list(task)


def mpirun_command(options: SchedulerOptions, num_processes: int, task: Sequence[str], env: Mapping[str, str],
                   is_root: bool, planned: Iterable[str] = ()) -> list[str]:
    """``planned``: the names the plan set for every process, which must reach
    every node whatever they are called."""
    if options.nodes:
        raise SchedulerError("--nodes works with --launcher slurm only; give mpirun its hosts with --scheduler-arg")
    argv = ["mpirun", "-n", str(num_processes)]
    if options.tasks_per_node:
        argv += ["--map-by", f"ppr:{options.tasks_per_node}:node"]
    if is_root:
        argv.append("--allow-run-as-root")  # mpirun refuses root without it
    planned = set(planned)
    for name in sorted(env):
        if name in MPI_FORWARD or name in planned or name.startswith(MPI_FORWARD_PREFIXES):
            argv += ["-x", name]  # by name: values (the channel secret) stay off the command line
    return argv + list(options.scheduler_args) + list(task)


def step_env(options: SchedulerOptions, specs: Sequence[planning.ProcessSpec], base: Mapping[str, str],
             devices_per_process: int | None = None) -> dict[str, str]:
    """One environment for every task: what all specs share, plus the rank source.
    Per-rank values (process id, local id, device ids) come from the scheduler
    instead: with --devices-per-process each task derives its devices from its
    local rank (see the task agent)."""
    common = planning.common_env(specs)
    for name in (contract.PROCESS_ID, contract.LOCAL_PROCESS_ID, contract.LOCAL_PROCESS_COUNT,
                 contract.JAX_LOCAL_DEVICE_IDS):
        common.pop(name, None)
    env = dict(base)
    env.update(common)
    env[contract.RANK_SOURCE] = options.name
    if devices_per_process is not None:
        env[contract.TASK_DEVICES_PER_PROCESS] = str(devices_per_process)
    return env


# Node states (sinfo's %T) in which an elastic restart leaves a node of the
# allocation out; a state ending in "*" means the node does not respond.
UNUSABLE_NODE_STATES = ("down", "drain", "drained", "draining", "fail", "failing", "maint", "unknown",
                        "not_responding", "no_respond", "reboot", "power_down", "powered_down", "powering_down")
SLURM_QUERY_TIMEOUT = 30.0


def expand_nodelist(nodelist: str, run=subprocess.run) -> list[str]:
    """The node names of a Slurm node list (``node[1-3,7]``), by scontrol."""
    done = _slurm(["scontrol", "show", "hostnames", nodelist], run)
    return done.split()


def node_problems(names: Sequence[str], run=subprocess.run) -> dict[str, str]:
    """{node: why} for each node Slurm reports down, drained or draining,
    failing, not responding (or does not know); the others are fine."""
    lines = _slurm(["sinfo", "-h", "-N", "-n", ",".join(names), "-o", "%N|%T|%E"], run)
    states: dict[str, tuple[str, str]] = {}
    for line in lines.splitlines():
        name, _, rest = line.partition("|")
        state, _, reason = rest.partition("|")
        states.setdefault(name.strip(), (state.strip().lower(), reason.strip()))
    problems = {}
    for name in names:
        state, reason = states.get(name, ("unknown to sinfo", ""))
        base = state.rstrip("*~#!%$@^-+")
        if state.endswith("*") or base in UNUSABLE_NODE_STATES or name not in states:
            why = "not responding" if state.endswith("*") else base
            problems[name] = f"Slurm says {why}" + (f" ({reason})" if reason and reason != "none" else "")
    return problems


def _slurm(argv: list[str], run) -> str:
    try:
        done = run(argv, capture_output=True, text=True, timeout=SLURM_QUERY_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"{argv[0]} failed: {e}") from None
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise LaunchError(f"{' '.join(argv[:3])} exited with status {done.returncode}"
                          + (f": {said[-1]}" if said else ""))
    return done.stdout


class SchedulerBackend(Backend):
    """Every attempt is one srun or mpirun step; each rank is a Child."""

    writes_log_files = False

    def __init__(self, options: SchedulerOptions, launch: planning.LaunchOptions, console: TextIO,
                 base_env: Mapping[str, str] | None = None):
        self.options = options
        self.name = options.name
        self.launch = launch
        self.console = console
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.fixed: str | None = None
        self.step: Step | None = None
        self.exclude: tuple[str, ...] = ()  # an elastic restart's nodes left out (srun --exclude)
        self.nodes: int | None = None  # and how many of the allocation's nodes it may use

    def choose_coordinator(self, fixed: str | None) -> tuple[str, None]:
        # Task 0 picks a free port on its own node at start (see the task
        # agent), unless --coordinator fixed one.
        self.fixed = fixed
        return fixed or "", None

    def pool(self) -> list[planning.Host]:
        """Slurm, inside an allocation: its nodes, each with the tasks one
        node runs (--ntasks-per-node, else an even share of -n)."""
        nodes = expand_nodelist(self.base_env.get("SLURM_JOB_NODELIST", ""))
        per_node = self.options.tasks_per_node or -(-self.launch.num_processes // max(1, len(nodes)))
        return [planning.Host(name, slots=per_node) for name in nodes]

    def regroup(self, hosts: Sequence[planning.Host]) -> dict[str, str]:
        """Slurm: the nodes it reports down, drained, failing or not
        responding are left out of the next step (``srun --exclude``)."""
        problems = node_problems([h.name for h in hosts])
        left = len(hosts) - len(problems)
        self.exclude = tuple(problems)
        self.nodes = min(self.options.nodes, left) if self.options.nodes and left else None
        return problems

    def command_builder(self, count: int, planned: Iterable[str] = ()):
        task = task_argv(self.launch.python, planning.shim_args(self.launch.target))
        if self.options.name == "slurm":
            return lambda env: srun_command(self.options, count, task, self.exclude, self.nodes)
        is_root = os.geteuid() == 0
        planned = tuple(planned)
        return lambda env: mpirun_command(self.options, count, task, env, is_root, planned)

    def begin_attempt(self, specs: Sequence[planning.ProcessSpec], log_dir: str) -> None:
        env = step_env(self.options, specs, self.base_env, self.launch.devices_per_process)
        build = self.command_builder(len(specs), planning.common_env(specs))
        build(env)  # bad combinations fail here, before anything starts
        from jaxrun.backends.scheduler.step import Step

        self.step = Step(self.options.command, specs, build, env, log_dir, self.console, self.fixed,
                         hooks=self.hooks)

    def spawn(self, spec: planning.ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None, on_join: Callable[[], None]) -> RankChild:
        return self.step.spawn(spec, extra_env, on_join)

    def end_attempt(self) -> None:
        if self.step is not None:
            self.step.close()
            self.step = None

    def abort(self) -> None:
        # Read once: end() may clear it from another thread meanwhile.
        step = self.step
        if step is not None:
            step.abort()
