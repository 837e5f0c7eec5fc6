"""The ways jaxrun starts controllers, in one table, each beside its far-end agent.

``BACKENDS`` maps each ``--launcher`` word to its entry: what the command
line needs to know (its options, the file descriptors each process costs,
the program that must be on PATH) and how to start it.  ``create_backend``
is the one place that builds a backend, for the run loop.  An entry imports
its module only when a run starts it, so ``--help`` and a local run never
load SSH or scheduler code.

A new backend is one module here and one entry below: its options object
is its own (``RunConfig.backend_options``), built by the entry's ``options``
from the command line's values.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from jaxrun.core.config import BackendEntry, Flag, LaunchError, RunConfig, SchedulerOptions, SshOptions
from jaxrun.core.spec import LaunchOptions

if TYPE_CHECKING:
    from jaxrun.core.backend import Backend


def start_local(config: RunConfig, console: TextIO) -> Backend:
    # The fork server is how a local run starts when it may preload.
    if config.preload:
        from jaxrun.backends.forkserver.client import ForkServerBackend

        return ForkServerBackend(config.preload_modules, console)
    from jaxrun.backends.local import LocalBackend

    return LocalBackend()


def start_ssh(config: RunConfig, console: TextIO) -> Backend:
    from jaxrun.backends.ssh.backend import SshBackend

    return SshBackend(config.backend_options, config.options.hosts, console, verbose=config.verbose,
                      preload=config.preload, preload_modules=config.preload_modules)


def start_scheduler(config: RunConfig, console: TextIO) -> Backend:
    from jaxrun.backends.scheduler.backend import SchedulerBackend

    return SchedulerBackend(config.backend_options, config.options, console)


def start_ray(config: RunConfig, console: TextIO) -> Backend:
    from jaxrun.backends.ray.backend import RayBackend

    return RayBackend(config.backend_options, config.options, console)


def ray_options(values: Mapping[str, Any], launch: LaunchOptions) -> Any:
    from jaxrun.backends.ray.backend import options  # imports no ray: it checks that ray is there

    return options(values, launch)


def ssh_options(values: Mapping[str, Any], launch: LaunchOptions) -> SshOptions:
    return SshOptions(
        python=launch.python,
        chdir=values["chdir"] or os.getcwd(),
        config_file=values["ssh_config"],
        options=tuple(values["ssh_options"]),
        connect_timeout=values["connect_timeout"],
        env=launch.extra_env,
        script=None if launch.target.is_module else launch.target.name,
        sync=values["sync"],
    )


def slurm_options(values: Mapping[str, Any], launch: LaunchOptions) -> SchedulerOptions:
    return SchedulerOptions("slurm", values["nodes"], values["tasks_per_node"], tuple(values["scheduler_args"]))


def mpirun_options(values: Mapping[str, Any], launch: LaunchOptions) -> SchedulerOptions:
    if values["nodes"]:
        raise LaunchError("--nodes works with --launcher slurm only; give mpirun its hosts with --scheduler-arg")
    return SchedulerOptions("mpirun", None, values["tasks_per_node"], tuple(values["scheduler_args"]))


BACKENDS: dict[str, BackendEntry] = {entry.name: entry for entry in (
    # Locally jaxrun follows each process's two log files for the console
    # (each child writes its own).
    BackendEntry("local", "child processes of jaxrun on this machine, forked from a preloading server by default",
                 kind="local", fds_per_process=2, start=start_local, default=True),
    # Over SSH: the ssh session's three pipes and the two log files it pumps into.
    BackendEntry("ssh", "processes on the hosts of --hosts or -H, over the system's ssh client",
                 kind="ssh", fds_per_process=5, start=start_ssh, options=ssh_options, engine="ssh",
                 engine_missing="--hosts/-H: ssh (the OpenSSH client) is not on PATH", takes_hosts=True,
                 elastic=True),
    # Under a scheduler: the two pipes (both ends), the task's three sockets
    # and the two log files.
    BackendEntry("slurm", "one srun step, in the Slurm allocation or a new one",
                 kind="scheduler", fds_per_process=9, start=start_scheduler, options=slurm_options, engine="srun",
                 engine_missing="--launcher slurm: srun is not on PATH", scheduled=True,
                 count_variable="SLURM_NTASKS", elastic=True),
    BackendEntry("mpirun", "one Open MPI mpirun step",
                 kind="scheduler", fds_per_process=9, start=start_scheduler, options=mpirun_options,
                 engine="mpirun", engine_missing="--launcher mpirun: mpirun is not on PATH", scheduled=True),
    # On a Ray cluster: as under a scheduler (the step is the Ray driver).
    BackendEntry("ray", "one Ray actor per process, on a running Ray cluster (pip install 'jaxrun[ray]')",
                 kind="ray", fds_per_process=9, start=start_ray, options=ray_options, scheduled=True, flags=(
                     Flag("ray_address", ("--ray-address",), "The Ray cluster's address, HOST:PORT of its GCS "
                          "(default: $RAY_ADDRESS, else auto).", metavar="ADDR"),
                     Flag("placement", ("--placement",), "How Ray places the processes on its nodes: one "
                          "placement group bundle each (default: spread).", ("pack", "spread", "strict-spread")))),
)}


def create_backend(config: RunConfig, console: TextIO) -> Backend:
    """The backend that starts this run's processes (the run loop's one call)."""
    return BACKENDS[config.backend].start(config, console)
