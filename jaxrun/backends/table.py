"""The ways jaxrun starts controllers, in one table (``jaxrun.backends`` serves it).

``BACKENDS`` maps each ``--launcher`` word to its entry: what the command
line needs to know (its options, the file descriptors each process costs,
the program that must be on PATH) and how to start it.  ``create_backend``
is the one place that builds a backend, for the run loop.  An entry imports
its module only when a run starts it, so ``--help`` and a local run never
load SSH or scheduler code.

A new backend is one module here and one entry below: its options object
is its own (``RunConfig.backend_options``), built by the entry's ``options``
from the command line's values, and the command-line options it takes
beyond everyone's are the ``Flag``s its entry lists (one declared below for
each, listed by every entry that takes it).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from jaxrun.core.config import BackendEntry, Flag, RunConfig, Value
from jaxrun.core.spec import LaunchOptions

if TYPE_CHECKING:
    from jaxrun.core.backend import Backend


def start_local(config: RunConfig, console: TextIO, early: Any = None) -> Backend:
    # The fork server is how a local run starts when it may preload.
    if config.preload:
        from jaxrun.backends.forkserver.client import ForkServerBackend

        return ForkServerBackend(config.preload_modules, console, early=early)
    from jaxrun.backends.local import LocalBackend

    return LocalBackend()


def head_start_local(config: RunConfig) -> Any:
    """A run that preloads starts its server now, before the launcher loads
    (``forkserver.client.ForkServerBackend`` takes it for the first attempt).
    One that imports modules of its own there starts it with the plan, as
    before, so that they see what every process gets."""
    if not config.preload or config.preload_modules:
        return None
    from jaxrun import portable
    from jaxrun.backends.forkserver.process import ServerProcess, server_env

    # Claim the orphans first, as the run does (it claims them again): a
    # daemon that a controller leaves must become this process's to kill,
    # and descendants started before the claim are not covered (seen here:
    # setsid daemons outlived jaxrun).  Where the kernel cannot, the run's
    # mark must be in the environment the server is given.
    if not portable.claim_orphans():
        from jaxrun.core import reaper

        reaper.become_subreaper()
    return ServerProcess(config.options.python, server_env(os.environ, config.options.extra_env))


def start_ssh(config: RunConfig, console: TextIO, early: Any = None) -> Backend:
    from jaxrun.backends.ssh.backend import SshBackend

    return SshBackend(config.backend_options, config.options.hosts, console, verbose=config.verbose,
                      preload=config.preload, preload_modules=config.preload_modules)


def start_scheduler(config: RunConfig, console: TextIO, early: Any = None) -> Backend:
    from jaxrun.backends.scheduler.engines import start  # the options' type says which engine

    return start(config.backend_options, config.options, console)


def start_ray(config: RunConfig, console: TextIO, early: Any = None) -> Backend:
    from jaxrun.backends.ray.backend import RayBackend

    return RayBackend(config.backend_options, config.options, console)


def ray_options(values: Mapping[str, Any], launch: LaunchOptions) -> Any:
    from jaxrun.backends.ray.backend import options  # imports no ray: it checks that ray is there

    return options(values, launch)


def ssh_options(values: Mapping[str, Any], launch: LaunchOptions) -> Any:
    from jaxrun.backends.ssh.options import options

    return options(values, launch)


def slurm_options(values: Mapping[str, Any], launch: LaunchOptions) -> Any:
    from jaxrun.backends.scheduler.options import slurm_options

    return slurm_options(values, launch)


def mpirun_options(values: Mapping[str, Any], launch: LaunchOptions) -> Any:
    from jaxrun.backends.scheduler.options import mpirun_options

    return mpirun_options(values, launch)


# Across hosts.  jaxrun has always let a run that does not go over SSH carry
# its connection options (and --chdir) unused: they stay not exclusive.
SSH_SECTION = "Across hosts (SSH)"
SSH_CONFIG = Flag("ssh_config", ("--ssh-config",), "ssh client configuration file (ssh -F).", metavar="FILE",
                  value=Value.FILE, exclusive=False)
SSH_OPTION = Flag("ssh_options", ("--ssh-option",), "Extra ssh -o option, e.g. Port=2222 (repeatable).",
                  metavar="OPT", multiple=True, exclusive=False)
CONNECT_TIMEOUT = Flag("connect_timeout", ("--connect-timeout",), "ssh connect timeout per host.",
                       metavar="SECONDS", value=Value.SECONDS, minimum=1, default=10.0, exclusive=False)
CHDIR = Flag("chdir", ("--chdir",), "Working directory on the hosts (default: the current one).", metavar="DIR",
             exclusive=False)
NO_FORWARD = Flag("no_forward", ("--no-forward",), "Do not carry this shell's JAX_*, XLA_*, NCCL_*, TF_CPP_*, "
                  "CUDA_* and LD_LIBRARY_PATH to the hosts (-x KEY= blanks one).", value=Value.SWITCH,
                  exclusive=False)
SETUP = Flag("setup", ("--setup",), "Shell code each host runs before the interpreter, e.g. "
             "'module load cuda; conda activate env'.", metavar="COMMAND")
SYNC = Flag("sync", ("--sync",), "Copy the working directory (--chdir) to the same path on every host first "
            "(rsync, else tar; .git and git-ignored files stay behind).", value=Value.SWITCH,
            refusal="--sync copies the working directory to SSH hosts: it needs --hosts or -H")

# The scheduler step's (srun or mpirun), in the engines' section beside --launcher.
ENGINES_SECTION = "Engines (Slurm, Open MPI)"
STEP_REFUSAL = "--nodes, --ntasks-per-node and --scheduler-arg need --launcher {launchers}"
NODES = Flag("nodes", ("--nodes",), "slurm: spread the processes over this many nodes (srun -N).",
             value=Value.COUNT, minimum=1, section=ENGINES_SECTION, refusal=STEP_REFUSAL)
TASKS_PER_NODE = Flag("tasks_per_node", ("--ntasks-per-node",), "slurm/mpirun: processes per node.",
                      value=Value.COUNT, minimum=1, section=ENGINES_SECTION, refusal=STEP_REFUSAL)
SCHEDULER_ARG = Flag("scheduler_args", ("--scheduler-arg",), "Pass ARG to srun or mpirun unchanged (repeatable), "
                     "e.g. --scheduler-arg=--overcommit.", metavar="ARG", multiple=True, section=ENGINES_SECTION,
                     refusal=STEP_REFUSAL)
CHANNEL_PORT = Flag("channel_port", ("--channel-port",), "slurm/mpirun: the port on this host that the tasks "
                    "connect back to (default: a free one), for a firewall.", metavar="PORT", value=Value.COUNT,
                    minimum=1, section=ENGINES_SECTION)
# mpirun lists --nodes too: its options refuse it with a hint of their own.
STEP_FLAGS = (NODES, TASKS_PER_NODE, SCHEDULER_ARG, CHANNEL_PORT)

RAY_ADDRESS = Flag("ray_address", ("--ray-address",), "The Ray cluster's address, HOST:PORT of its GCS "
                   "(default: $RAY_ADDRESS, else auto).", metavar="ADDR")
PLACEMENT = Flag("placement", ("--placement",), "How Ray places the processes on its nodes: one "
                 "placement group bundle each (default: spread).", ("pack", "spread", "strict-spread"))


BACKENDS: dict[str, BackendEntry] = {entry.name: entry for entry in (
    # Locally jaxrun holds each process's two pipes and the two log files it
    # moves them into, and follows the files for the console: 6 (measured:
    # the launcher's peak grows by 6 a process: bench/fds.py, setup.limits).
    BackendEntry("local", "child processes of jaxrun on this machine, forked from a preloading server by default",
                 kind="local", fds_per_process=6, start=start_local, head_start=head_start_local, default=True),
    # Over SSH: the ssh session's three pipes and the two log files it pumps into.
    BackendEntry("ssh", "processes on the hosts of --hosts or -H, over the system's ssh client",
                 kind="ssh", fds_per_process=5, start=start_ssh, options=ssh_options, engine="ssh",
                 engine_missing="--hosts/-H: ssh (the OpenSSH client) is not on PATH", takes_hosts=True,
                 elastic=True, section=SSH_SECTION,
                 flags=(SSH_CONFIG, SSH_OPTION, CONNECT_TIMEOUT, CHDIR, SYNC, NO_FORWARD, SETUP)),
    # Under a scheduler: the two pipes (both ends), the task's three sockets
    # and the two log files.
    BackendEntry("slurm", "one srun step, in the Slurm allocation or a new one",
                 kind="scheduler", fds_per_process=9, start=start_scheduler, options=slurm_options, engine="srun",
                 engine_missing="--launcher slurm: srun is not on PATH", scheduled=True,
                 reads_allocation=True, elastic=True, elastic_variable="SLURM_JOB_NODELIST",
                 elastic_refusal="--min-hosts with --launcher slurm works inside an allocation (sbatch or salloc, "
                 "with --no-kill): outside one, each restart asks Slurm for new nodes",
                 flags=STEP_FLAGS),
    BackendEntry("mpirun", "one Open MPI mpirun step",
                 kind="scheduler", fds_per_process=9, start=start_scheduler, options=mpirun_options,
                 engine="mpirun", engine_missing="--launcher mpirun: mpirun is not on PATH", scheduled=True,
                 flags=STEP_FLAGS),
    # On a Ray cluster: as under a scheduler (the step is the Ray driver).
    BackendEntry("ray", "one Ray actor per process, on a running Ray cluster (pip install 'jaxrun[ray]')",
                 kind="ray", fds_per_process=9, start=start_ray, options=ray_options, scheduled=True,
                 flags=(RAY_ADDRESS, PLACEMENT, CHDIR)),
)}


def head_start(config: RunConfig) -> Any:
    """What the run's backend starts as soon as the command line is known
    good, before the launcher is loaded, to be given to ``create_backend``;
    None where it starts nothing early.  The caller ends it (``close``, a
    no-op once the backend has), whatever happens."""
    entry = BACKENDS[config.backend]
    if config.dry_run or entry.head_start is None:
        return None
    return entry.head_start(config)


def create_backend(config: RunConfig, console: TextIO, early: Any = None) -> Backend:
    """The backend that starts this run's processes (the run loop's one call),
    with what ``head_start`` began for it."""
    return BACKENDS[config.backend].start(config, console, early)
