"""Starting one controller: locally here, remotely in :mod:`jaxrun.ssh`.

A spawner turns a ``ProcessSpec`` into a running ``Child`` whose stdout and
stderr are pipes.  Every local child starts in a session of its own, so one
``killpg`` reaches the grandchildren it starts too.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Mapping, Protocol

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


class LocalChild:
    """A local controller: the shim's process, leader of its own process group."""

    def __init__(self, popen: subprocess.Popen):
        self.popen = popen
        self.pid = popen.pid
        self.stdout = popen.stdout
        self.stderr = popen.stderr

    def send(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def wait(self) -> int:
        return self.popen.wait()


class LocalSpawner:
    def __init__(self, base_env: Mapping[str, str] | None = None):
        self.base_env = dict(os.environ if base_env is None else base_env)

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str]) -> LocalChild:
        env = dict(self.base_env)
        env.update(spec.env)
        env.update(extra_env)
        env[contract.LIFELINE_FD] = str(lifeline_fd)
        popen = subprocess.Popen(
            list(spec.argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(lifeline_fd,),
            start_new_session=True,
            bufsize=0,
        )
        return LocalChild(popen)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
