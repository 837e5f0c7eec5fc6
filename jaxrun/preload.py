"""Launcher side of the preloading fork server (see :mod:`jaxrun.zygote`).

``PreloadSpawner`` satisfies the same ``FileSpawner`` protocol as
``LocalSpawner``: each controller still gets its own environment, its own log
files as stdout and stderr, its own process group and the launcher's
lifeline.  Only its parent differs: the server forks it, so exits arrive as
messages instead of through ``waitpid``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
from typing import Mapping, Sequence

from jaxrun import contract
from jaxrun.plan import ProcessSpec

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

    def _finish(self, code: int) -> None:
        self._code = code
        self._done.set()


def common_env(specs: Sequence[ProcessSpec]) -> dict[str, str]:
    """The variables every process gets with the same value."""
    first = dict(specs[0].env)
    return {k: v for k, v in first.items() if all(s.env.get(k) == v for s in specs[1:])}


def differing_import_time_vars(specs: Sequence[ProcessSpec]) -> list[str]:
    common = common_env(specs)
    keys = {k for s in specs for k in s.env if k.startswith(IMPORT_TIME_PREFIXES)}
    per_process_ok = {contract.JAX_COORDINATOR_BIND_ADDRESS, contract.JAX_LOCAL_DEVICE_IDS}
    return sorted(k for k in keys if k not in common and k not in per_process_ok)


class PreloadSpawner:
    writes_log_files = True

    def __init__(self, specs: Sequence[ProcessSpec], preload: Sequence[str] = (), base_env: Mapping[str, str] | None = None):
        self.base_env = dict(os.environ if base_env is None else base_env)
        env = dict(self.base_env)
        env.update(common_env(specs))
        env["PYTHONUNBUFFERED"] = "1"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.server = subprocess.Popen(
            [specs[0].argv[0], "-m", "jaxrun.zygote", str(theirs.fileno()), *preload],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            process_group=0,
        )
        theirs.close()
        self.sock = ours
        self.lock = threading.Lock()
        self.started: "list[int]" = []
        self.started_cond = threading.Condition()
        self.children: dict[int, ForkedChild] = {}
        self.early_exits: dict[int, int] = {}
        self.ready = False
        self.reader = threading.Thread(target=self._read, name="preload-reader", daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(256)
            except OSError:
                data = b""
            if not data:
                break
            word, *rest = data.decode().split()
            with self.started_cond:
                if word == "ready":
                    self.ready = True
                elif word == "started":
                    self.started.append(int(rest[0]))
                elif word == "exit":
                    pid, code = int(rest[0]), int(rest[1])
                    if pid in self.children:
                        self.children[pid]._finish(code)
                    else:
                        self.early_exits[pid] = code
                self.started_cond.notify_all()
        # The server is gone: nothing will report these exits any more.
        with self.started_cond:
            self.ready = None
            for child in self.children.values():
                if not child._done.is_set():
                    child.send(signal.SIGKILL)
                    child._finish(-signal.SIGKILL)
            self.started_cond.notify_all()

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: Sequence[int]) -> ForkedChild:
        env = dict(self.base_env)
        env.update(spec.env)
        env.update(extra_env)
        # argv after "python -m jaxrun.shim" is what the shim's main() takes.
        request = json.dumps({"argv": list(spec.argv[3:]), "env": env}).encode()
        with self.lock:
            try:
                socket.send_fds(self.sock, [request], [*log_fds, lifeline_fd])
            except OSError as e:
                raise PreloadError(f"the preloading server is gone ({e})") from None
            with self.started_cond:
                self.started_cond.wait_for(lambda: self.started or self.ready is None)
                if not self.started:
                    raise PreloadError("the preloading server exited; try --no-preload")
                pid = self.started.pop(0)
                child = ForkedChild(pid)
                self.children[pid] = child
                if pid in self.early_exits:
                    child._finish(self.early_exits.pop(pid))
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
            os.killpg(self.server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.server.wait()

