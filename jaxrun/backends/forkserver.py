"""Local controllers forked from a server that imported jax once (the default).

The server is :mod:`jaxrun.backends.forkserver_agent`.  Each controller still
gets its own environment, its own log files as stdout and stderr, its own
process group and the launcher's lifeline, exactly as with
:class:`~jaxrun.backends.local.LocalBackend`.  Only its parent differs: the
server forks it, so exits arrive as messages instead of through ``waitpid``.

When variables that jax reads at import differ between processes, one
server cannot serve them all: that attempt starts fresh interpreters instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from typing import Mapping, Sequence, TextIO

from jaxrun import contract, wire
from jaxrun.backends.local import LocalBackend, child_env
from jaxrun.launcher.plan import ProcessSpec, common_env

# Variables that jax reads when it is imported: the server is started with the
# values common to every process, so they must not differ between processes.
IMPORT_TIME_PREFIXES = ("JAX_", "XLA_", "TF_CPP_")


class PreloadError(RuntimeError):
    pass


class ForkedChild:
    stdout = stderr = None  # it writes its log files itself

    def __init__(self, pid: int):
        self.pid = pid
        self._done = threading.Event()
        self._code: int | None = None

    def send(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)
        except ProcessLookupError:
            try:  # forked but not yet in its own group
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        self._done.wait()
        return self._code

    def finish(self, code: int) -> None:
        self._code = code
        self._done.set()


def differing_import_time_vars(specs: Sequence[ProcessSpec]) -> list[str]:
    common = common_env(specs)
    keys = {k for s in specs for k in s.env if k.startswith(IMPORT_TIME_PREFIXES)}
    per_process_ok = {contract.JAX_COORDINATOR_BIND_ADDRESS, contract.JAX_LOCAL_DEVICE_IDS}
    return sorted(k for k in keys if k not in common and k not in per_process_ok)


class ForkServer:
    """One running server and the reader thread that hears its messages."""

    def __init__(self, specs: Sequence[ProcessSpec], preload: Sequence[str], base_env: Mapping[str, str]):
        env = dict(base_env)
        env.update(common_env(specs))
        env["PYTHONUNBUFFERED"] = "1"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.process = subprocess.Popen(
            [specs[0].python, "-m", contract.FORKSERVER_AGENT_MODULE, str(theirs.fileno()), *preload],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            process_group=0,
        )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.cond = threading.Condition()
        self.children: dict[int, ForkedChild] = {}
        self.early_exits: dict[int, int] = {}
        self.alive = True
        self.reader = threading.Thread(target=self._read, name="forkserver-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(wire.MAX_PACKET)
            except OSError:
                data = b""
            if not data:
                break
            msg = wire.decode(data)
            with self.cond:
                if isinstance(msg, wire.Started):
                    self.started.append(msg.pid)
                elif isinstance(msg, wire.ChildExited):
                    if msg.pid in self.children:
                        self.children[msg.pid].finish(msg.returncode)
                    else:
                        self.early_exits[msg.pid] = msg.returncode
                self.cond.notify_all()
        # The server is gone: nothing will report these exits any more.
        with self.cond:
            self.alive = False
            for child in self.children.values():
                if not child._done.is_set():
                    child.send(signal.SIGKILL)
                    child.finish(-signal.SIGKILL)
            self.cond.notify_all()

    def fork(self, spec: ProcessSpec, env: Mapping[str, str], fds: Sequence[int]) -> ForkedChild:
        request = wire.ForkRequest(list(spec.shim_args), dict(env)).encode()
        with self.lock:
            try:
                socket.send_fds(self.sock, [request], list(fds))
            except OSError as e:
                raise PreloadError(f"the preloading server is gone ({e})") from None
            with self.cond:
                self.cond.wait_for(lambda: self.started or not self.alive)
                if not self.started:
                    raise PreloadError("the preloading server exited; try --no-preload")
                pid = self.started.pop(0)
                child = ForkedChild(pid)
                self.children[pid] = child
                if pid in self.early_exits:
                    child.finish(self.early_exits.pop(pid))
        return child

    def close(self) -> None:
        try:
            # shutdown, not just close: the reader thread's pending recv would
            # keep the socket open, and the server would never see EOF.
            self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
        except OSError:
            pass
        # Every controller has exited by now, so the server holds nothing worth
        # a clean interpreter shutdown (tearing down jax's modules takes a
        # noticeable fraction of a second).
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


class ForkServerBackend(LocalBackend):
    name = "forkserver"

    def __init__(self, preload: Sequence[str] = (), console: TextIO | None = None,
                 base_env: Mapping[str, str] | None = None):
        super().__init__(base_env)
        self.preload = tuple(preload)
        self.console = console
        self.server: ForkServer | None = None

    def begin(self, specs: Sequence[ProcessSpec], log_dir: str) -> None:
        differing = differing_import_time_vars(specs)
        if differing:
            if self.console is not None:
                print(f"jaxrun: not preloading jax: {', '.join(differing)} differ between processes", file=self.console)
            return
        self.server = ForkServer(specs, self.preload, self.base_env)

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None):
        if self.server is None:
            return super().spawn(spec, lifeline_fd, extra_env, log_fds)
        env = child_env(self.base_env, spec, extra_env, lifeline_fd)
        del env[contract.LIFELINE_FD]  # the fd number is the server's to give
        return self.server.fork(spec, env, [*log_fds, lifeline_fd])

    def end(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
