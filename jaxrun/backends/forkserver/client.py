"""Local controllers forked from a server that imported jax once (the default).

The server is :mod:`jaxrun.backends.forkserver.server`.  Each controller still
gets its own environment, its own log pipes as stdout and stderr, its own
process group and the launcher's lifeline, exactly as with
:class:`~jaxrun.backends.local.LocalBackend`.  Only its parent differs: the
server forks it, so exits arrive as messages instead of through ``waitpid``.

When variables that jax reads at import differ between processes, one
server cannot serve them all: that attempt starts fresh interpreters instead.

The server and the launcher talk over a stream socket, one frame per message
(``encoding.send_frame``), so a request of any size (an environment of a few
hundred KiB) is served like any other; a packet socket would cap it, and
macOS has no Unix packet sockets at all.

``begin`` waits for the server's ``Ready``, so a module that cannot be
imported is bad input (exit 2, nothing started), and that wait, like every
wait for the server, gives way to a signal or ``--timeout``.

The server is a helper, and the stop signals are the launcher's: it starts
with them blocked (:mod:`jaxrun.backends.shield`), so a SIGTERM sent to the
whole tree at once leaves it serving while its controllers use their grace.
Should it die anyway (SIGKILL, the OOM killer), its controllers are not
killed for it: they become the launcher's orphans, and :func:`adopt` waits
for each as its parent, with its real exit code and resources.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TextIO

import psutil

from jaxrun import contract, portable
from jaxrun.backends.forkserver.process import ServerProcess, server_env
from jaxrun.backends.local import LocalBackend, LocalChild, child_env
from jaxrun.core import causes, usage
from jaxrun.core.backend import POLL, ChildExit, Interrupted, News, RunHooks, start_thread
from jaxrun.core.config import LaunchError
from jaxrun.core.events import Stream
from jaxrun.core.reaper import ProcessGroup
from jaxrun.core.spec import ProcessSpec, common_env
from jaxrun.wire import encoding, forkserver

# Variables that jax reads when it is imported: the server is started with the
# values common to every process, so they must not differ between processes.
IMPORT_TIME_PREFIXES = ("JAX_", "XLA_", "TF_CPP_")
# What a controller reads again after the fork, whatever the server saw.
REREAD_PREFIXES = contract.CONTRACT_PREFIXES  # JAXRUN_*, JAX_*
# How long a dead server's controllers may take to become the launcher's.
ADOPT_WAIT = 5.0
SERVER = "the preloading server"  # what ended instead, where a controller's own end is unknown


class PreloadError(LaunchError):
    """The preloading server cannot serve this run; the message says why."""


class ForkedChild:
    """A controller the server forked: the server reaps it, and says so."""

    stdout = stderr = None  # it writes into the log writer's pipes
    reports_joins = False  # it marks its join in its joined file

    def __init__(self, pid: int, watch: usage.OomWatch | None = None):
        self.pid = pid
        self.watch = watch
        self.group = ProcessGroup(pid)
        self.done = threading.Event()
        self._exit: ChildExit | None = None

    def send(self, signum: int) -> None:
        if self.watch is not None:
            self.watch.saw(signum)
        if not self.group.send(signum) and not self.group.is_reaped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signum)  # forked but not yet in its own group

    def wait(self) -> ChildExit:
        self.done.wait()
        return self._exit

    def finish(self, code: int, used: dict | None = None, reaped_at: float | None = None,
               lost: str | None = None) -> None:
        """It was reaped: ``code``, what was measured (``Resources.to_dict``)
        and when (the server's ``reaped_at``, on this machine's clock; now,
        if the reaper did not say).  ``lost``: its end was never reported,
        and ``code`` stands in for it (see ``ChildExit.lost``)."""
        self.group.reaped()
        figures = contract.Resources.from_dict(used)
        if reaped_at is None and lost is None:
            reaped_at = time.time()
        self._exit = ChildExit(code, self.watch.with_verdict(code, figures) if self.watch else figures,
                               reaped_at, causes.clock_id(), lost=lost)
        self.done.set()

    def stream_filter(self, stream: Stream) -> None:
        return None  # its bytes are its own


def adopt(child: ForkedChild, server: int, within: float = ADOPT_WAIT) -> None:
    """See a controller whose server died to its end, as its new parent:
    the launcher is a child subreaper (``core.reaper``), so the kernel hands
    it the server's orphans, and ``wait4`` then gives their real exit codes
    and resources.  What is left in its group dies first, while the dead
    leader still holds the group's id.  Nothing is killed early: a stop
    under way keeps its grace.  Only where the orphan went elsewhere (no
    subreaper), or had ended before the server could tell, is its status
    unknown: once it is gone, it is reported as killed, with the server
    named as what ended instead (``ChildExit.lost``)."""
    me, deadline = os.getpid(), time.monotonic() + within
    try:
        proc = psutil.Process(child.pid)
        parent = proc.ppid()
        while parent == server and time.monotonic() < deadline:  # reparented as the server's exit ends
            time.sleep(0.01)
            parent = proc.ppid()
    except psutil.Error:
        proc = parent = None
    if parent == me:
        unreaped = portable.ended_unreaped(child.pid, block=True)
        if unreaped:
            child.group.send(signal.SIGKILL)
        try:
            _, code, used = usage.wait4(child.pid)
        except ChildProcessError:  # reaped by another waiter meanwhile: its status is gone with it
            code, used = None, None
        if unreaped is None:  # the system cannot wait without reaping: at once, then
            child.group.send(signal.SIGKILL)
        if code is not None:
            child.finish(code, used.to_dict() if used else None)
            return
    while proc is not None and running(proc):
        time.sleep(POLL)
    child.finish(-signal.SIGKILL, lost=SERVER)


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def differing_import_time_vars(specs: Sequence[ProcessSpec]) -> list[str]:
    common = common_env(specs)
    keys = {k for s in specs for k in s.env if k.startswith(IMPORT_TIME_PREFIXES)}
    per_process_ok = {contract.JAX_COORDINATOR_BIND_ADDRESS, contract.JAX_LOCAL_DEVICE_IDS}
    return sorted(k for k in keys if k not in common and k not in per_process_ok)


class ForkServer:
    """One running server (``process.ServerProcess``) and the reader thread
    that hears its messages, started by ``attach`` once the run has its hooks."""

    def __init__(self, server: ServerProcess):
        self.server = server
        self.process = server.popen
        self.sock = server.sock
        self.hooks = RunHooks()
        self.lock = threading.Lock()
        self.started: list[int] = []
        self.cond = threading.Condition()
        self.children: dict[int, ForkedChild] = {}
        self.early_exits: dict[int, tuple[int, dict | None, float | None]] = {}
        self.ready: str | None = None  # "" once ready; else why it could not be
        self.alive = True
        self.reader: threading.Thread | None = None

    @classmethod
    def for_attempt(cls, specs: Sequence[ProcessSpec], preload: Sequence[str],
                    base_env: Mapping[str, str]) -> ForkServer:
        """A server for these processes: jax imported with what they all get."""
        return cls(ServerProcess(specs[0].python, server_env(base_env, common_env(specs)), preload))

    def attach(self, hooks: RunHooks) -> None:
        """Hear the server from now on, with the run's hooks."""
        self.hooks = hooks
        self.reader = start_thread("forkserver-reader", self._read, hooks=hooks)

    def _read(self) -> None:
        while True:
            try:
                frame = encoding.recv_frame(self.sock)
            except (OSError, encoding.WireError):
                frame = None
            if frame is None:
                break
            msg = encoding.decode(frame[0])
            with self.cond:
                if isinstance(msg, forkserver.Ready):
                    self.ready = msg.error
                elif isinstance(msg, forkserver.Started):
                    self.started.append(msg.pid)
                elif isinstance(msg, forkserver.ChildExited):
                    if msg.pid in self.children:
                        self.children[msg.pid].finish(msg.returncode, msg.resources, msg.reaped_at)
                    else:
                        self.early_exits[msg.pid] = (msg.returncode, msg.resources, msg.reaped_at)
                self.cond.notify_all()
        # The server is gone, and with it the news of these exits: its
        # controllers live on, as this process's orphans, and still get
        # whatever grace a stop gives them.
        with self.cond:
            self.alive = False
            orphans = [child for child in self.children.values() if not child.done.is_set()]
            self.cond.notify_all()
        for child in orphans:
            start_thread(f"forkserver-orphan:{child.pid}", adopt, child, self.process.pid, hooks=self.hooks)

    def _wait(self, ready) -> None:
        """Wait on the reader's news, giving way to a signal or --timeout."""
        with self.cond:
            while not self.cond.wait_for(ready, timeout=POLL):
                if self.hooks.stopping():
                    raise Interrupted()

    def wait_ready(self, modules: Sequence[str]) -> None:
        self._wait(lambda: self.ready is not None or not self.alive)
        if self.ready:
            what = "jax" if not modules else "jax and " + ", ".join(modules)
            raise LaunchError(f"the preloading server could not import {what}: {self.ready} (or use --no-preload)")
        if self.ready is None:
            code = self.process.wait()
            raise LaunchError(f"the preloading server exited with status {code} before it was ready; try --no-preload")

    def fork(self, spec: ProcessSpec, env: Mapping[str, str], fds: Sequence[int]) -> ForkedChild:
        request = forkserver.ForkRequest(list(spec.shim_args), dict(env)).encode()
        watch = usage.OomWatch()
        with self.lock:
            try:
                encoding.send_frame(self.sock, request, fds)
            except OSError as e:
                raise PreloadError(f"the preloading server is gone ({e})") from None
            self._wait(lambda: self.started or not self.alive)
            with self.cond:
                if not self.started:
                    raise PreloadError("the preloading server exited; try --no-preload")
                pid = self.started.pop(0)
                child = ForkedChild(pid, watch)
                self.children[pid] = child
                if pid in self.early_exits:
                    child.finish(*self.early_exits.pop(pid))
        return child

    def close(self, wait: bool = True) -> None:
        """End the server (once), and wait for it unless ``wait`` is false."""
        self.server.close(wait)

    def kill(self) -> None:
        """The last resort's end: no wait, from any thread."""
        self.server.kill()


def serves(server: ServerProcess, specs: Sequence[ProcessSpec], preload: Sequence[str],
           base_env: Mapping[str, str]) -> bool:
    """Whether ``server``, started before the attempt was planned
    (``backends.table.head_start``), serves these processes as one started
    for them would: the same interpreter and modules, and the same
    environment but for jaxrun's own variables and the values of ``JAX_*``,
    which a controller reads again after the fork
    (``child.join.preloaded.sync_preloaded_config``); none it lacks, though."""
    if specs[0].python != server.python or tuple(preload) != server.preload:
        return False
    wanted = server_env(base_env, common_env(specs))
    if set(server.env) - set(wanted):
        return False
    return all(server.env.get(k) == v for k, v in wanted.items() if not k.startswith(REREAD_PREFIXES))


class ForkServerBackend(LocalBackend):
    name = "forkserver"

    def __init__(self, preload: Sequence[str] = (), console: TextIO | None = None,
                 base_env: Mapping[str, str] | None = None, early: ServerProcess | None = None):
        super().__init__(base_env)
        self.preload = tuple(preload)
        self.console = console
        self.server: ForkServer | None = None
        self.early = early  # started before the launcher loaded (``table.head_start``), for the first attempt
        self.ending: list[ServerProcess] = []  # ended by end_attempt, reaped by close

    def begin_attempt(self, specs: Sequence[ProcessSpec], log_dir: str) -> None:
        early, self.early = self.early, None
        differing = differing_import_time_vars(specs)
        if early is not None and (differing or not serves(early, specs, self.preload, self.base_env)):
            early.close()
            early = None
        if differing:
            if self.console is not None:
                print(f"jaxrun: not preloading jax: {', '.join(differing)} differ between processes", file=self.console)
            return
        self.server = ForkServer(early) if early is not None else ForkServer.for_attempt(specs, self.preload,
                                                                                        self.base_env)
        self.server.attach(self.hooks)
        self.server.wait_ready(self.preload)

    def spawn(self, spec: ProcessSpec, lifeline_fd: int, extra_env: Mapping[str, str],
              log_fds: tuple[int, int] | None, news: News) -> ForkedChild | LocalChild:
        if self.server is None:
            return super().spawn(spec, lifeline_fd, extra_env, log_fds, news)
        env = child_env(self.base_env, spec, extra_env, lifeline_fd)
        del env[contract.LIFELINE_FD]  # the fd number is the server's to give
        child = self.server.fork(spec, env, [*log_fds, lifeline_fd])
        self.started.append(child)
        return child

    def abort(self) -> None:
        super().abort()
        for server in (self.server, self.early):  # each read once: another thread may clear it meanwhile
            if server is not None:
                server.kill()

    def end_attempt(self) -> None:
        super().end_attempt()
        if self.server is not None:
            # Its end is waited for later: the attempt's report need not wait
            # for the kernel to tear it down.
            self.server.close(wait=False)
            self.ending.append(self.server.server)
            self.server = None

    def close(self) -> None:
        early, self.early = self.early, None
        if early is not None:  # the run ended before its first attempt began
            early.close()
        for server in self.ending:
            server.reap()
        self.ending.clear()
        super().close()
