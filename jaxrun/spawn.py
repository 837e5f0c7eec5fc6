"""Starting one controller: locally here, remotely in :mod:`jaxrun.ssh`.

A spawner turns a ``ProcessSpec`` into a running ``Child``.  A spawner whose
``writes_log_files`` is true takes two open log files (``log_fds``) and makes
them the child's stdout and stderr; the child's ``stdout``/``stderr`` are then
None.  Other spawners (SSH, srun, mpirun) hand back pipes, and the supervisor
writes the logs.  Every local child starts in a process group of its own, so
one ``killpg`` reaches the grandchildren it starts too.  (A group, not a session:
the children stay in the user's session, so that the kernel's per-session CPU
shares, "autogroups", weigh jaxrun and its processes together, as they do for
a shell's background jobs.  A terminal's Ctrl-C reaches only the foreground
group, jaxrun's, either way.)
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Protocol, Sequence

from jaxrun import contract
from jaxrun.plan import ProcessSpec


class Child(Protocol):
    pid: int
    stdout: object
    stderr: object

    def send(self, signum: int) -> None: ...
    def wait(self) -> int: ...


class Spawner(Protocol):
    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str]) -> Child: ...


class FileSpawner(Protocol):
    writes_log_files: bool  # True

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: Sequence[int]) -> Child: ...


class LocalChild:
    """A local controller: the shim's process, leader of its own process group."""

    stdout = stderr = None  # it writes its log files itself

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid

    def send(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self) -> int:
        return self.popen.wait()


class LocalSpawner:
    writes_log_files = True

    def __init__(self, base_env: Mapping[str, str] | None = None):
        self.base_env = dict(os.environ if base_env is None else base_env)

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: Sequence[int]) -> LocalChild:
        env = dict(self.base_env)
        env.update(spec.env)
        env.update(extra_env)
        env[contract.LIFELINE_FD] = str(lifeline_fd)
        popen = subprocess.Popen(
            list(spec.argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_fds[0],
            stderr=log_fds[1],
            pass_fds=(lifeline_fd,),
            process_group=0,
        )
        return LocalChild(popen)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
