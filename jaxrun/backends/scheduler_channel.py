"""Launcher side of a scheduler launch: one ``srun``/``mpirun`` step, one Child per rank.

A ``Step`` hands the supervisor one ``RankChild`` per rank, so the summary,
the report and the per-process logs work as for any backend.  The first
``spawn`` starts the whole step.  The task agents
(:mod:`jaxrun.backends.scheduler_agent`) connect back to a TCP listener here,
each connection opened by a ``wire.Hello`` that carries the per-run secret
and answered by a ``wire.Ack``, three connections per task:

- ``stdout`` and ``stderr`` carry the child's bytes unchanged; a forwarder
  thread copies them into the pipe the supervisor's pump already reads;
- ``ctrl`` carries ``wire`` messages: the coordinator address, signals to
  the task, and the task's error record and exit code back.

Why a channel instead of demultiplexing ``srun --label`` / ``mpirun
--tag-output``: those prefix whole lines only, so partial last lines, bytes
without a newline and the exact byte stream would be lost or altered, and
neither reports per-task exit codes or lets us signal one task.  The cost is
one TCP listener per run: compute nodes must be able to reach the launcher's
host (which ``srun`` and ``mpirun`` already require for their own I/O).
Whatever the scheduler itself prints (allocation errors, its own failure
notes) goes to ``engine.log`` in the log folder and to the console.  When the
step ends before some tasks reported back, each of those ranks ends with the
step's code and one note (``contract.EngineNote``) in its stderr log; the
console leaves those notes out, and the summary names the failure once.

The listener faces the network, so ``TaskListener`` trusts nothing that has
not shown the secret:

- it binds the one address the tasks are told (``channel_address``), never
  a wildcard;
- one thread reads every header, without blocking, against one deadline for
  the whole line: a client that sends a byte a second holds nothing;
- at most ``MAX_UNAUTHENTICATED`` connections wait for their header at a
  time; more are closed at once.  A task whose connection was closed gets no
  ``Ack`` and connects again (see the agent), so a flood delays it, no more;
- running out of file descriptors (EMFILE, ENFILE) closes the stranger that
  has waited longest, or pauses accepting for a moment when there is none;
  it never ends the listener;
- once every rank has attached its three connections, it stops listening.

Only connections that showed the secret get a thread: the three per rank.
Every thread is started through ``base.start_thread``, so one that dies is
reported to the run instead of leaving ranks that never end; their names
(what ``contract.INJECT_THREAD_FAULT`` matches) are ``task-channel``,
``step-watcher``, ``step-kill``, and ``rank-N-ctrl``, ``rank-N-stdout``,
``rank-N-stderr`` for rank N.

Stopping a step that Slurm still queues needs care: ``srun`` withdraws its
pending job on SIGTERM or SIGINT, but after SIGKILL the job stays in the
queue.  ``Step.kill`` therefore sends SIGTERM first while no task has reached
us, and the job id ``srun`` reported as queued is cancelled with ``scancel``
if ``srun`` ended without withdrawing it.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import selectors
import signal
import socket
import subprocess
import threading
import time
from typing import Callable, Mapping, Sequence, TextIO

from jaxrun import contract, wire
from jaxrun.core.backend import RunHooks, start_thread
from jaxrun.core.spec import ProcessSpec

CHUNK = 1 << 16
# After the step exits, how long ranks may still report their exit codes.
LATE_REPORT_WAIT = 3.0
# One deadline for a connection's whole Hello line, from its accept.
HEADER_TIMEOUT = 10.0
MAX_HEADER = 512  # a Hello is about 80 bytes
MAX_UNAUTHENTICATED = 64
ACCEPT_BATCH = 256  # accepts per wake-up, so a flood cannot starve the headers already in
ACCEPT_PAUSE = 0.1  # after EMFILE/ENFILE: no accepts for this long, then try again
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# How long srun gets after SIGTERM to withdraw its pending job before SIGKILL.
SRUN_WITHDRAW_WAIT = 2.0
SRUN_ABORT_WAIT = 1.0  # the most abort() waits for that
# After the task channel closes, how long the tasks get to end their step.
CLOSE_WAIT = 10.0
SCANCEL_TIMEOUT = 10.0
# What srun prints (at its default verbosity) when its job must wait, and once it
# runs or srun itself withdrew it.
QUEUED = re.compile(rb"srun: job (\d+) queued and waiting for resources")
# Only an allocation ends the wait.  "Job allocation N has been revoked" is
# srun asking for the withdrawal, which a loaded controller may not have done
# yet: the job is still cancelled (a job gone already is no error).
ALLOCATED = re.compile(rb"srun: job (\d+) has been allocated resources")
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)


class RankChild:
    """One rank of the step, seen through its task's channel connections."""

    def __init__(self, rank: int, step: "Step"):
        self.rank = rank
        self.step = step
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.stdout = os.fdopen(out_r, "rb", buffering=0)
        self.stderr = os.fdopen(err_r, "rb", buffering=0)
        self.error_file: str | None = None
        self.resources: contract.Resources | None = None  # measured by the task agent
        self.joined_file: str | None = None  # made here when the task says its controller joined
        self._unattached = {"stdout": out_w, "stderr": err_w}  # write ends no task holds yet
        self._ctrl: socket.socket | None = None
        self._pending: list[int] = []  # signals sent before the task connected
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._code: int | None = None

    @property
    def pid(self) -> int:
        return self.step.pid

    def send(self, signum: int) -> None:
        with self._lock:
            if self._done.is_set():
                return
            attached = self._ctrl is not None
            if not attached:
                self._pending.append(signum)
        if attached:
            self.tell(wire.Signal.of(signum))
        elif signum == signal.SIGKILL or (signum in ENDING_SIGNALS and not self.step.reached):
            # The task has not reached us (still queued or starting): only
            # ending the whole step can stop it.  A step no task has reached
            # yet has nothing to stop gracefully, and may be queued: end it now.
            self.step.kill()

    def wait(self) -> int:
        self._done.wait()
        return self._code

    # -- connections, offered by the listener's thread ----------------------
    def wants(self, kind: str) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
            return self._ctrl is None if kind == "ctrl" else kind in self._unattached

    def attach(self, kind: str, sock: socket.socket, hooks: RunHooks) -> None:
        """Take a connection that showed the secret; serve it in its own thread."""
        with self._lock:
            if self._done.is_set():
                target = None
            elif kind == "ctrl":
                target = None if self._ctrl is not None else self._serve_ctrl
                if target:
                    self._ctrl = sock
            else:
                fd = self._unattached.pop(kind, None)
                target = None if fd is None else (lambda: self._forward(fd, sock))
        if target is None:  # a duplicate, or the rank was given up meanwhile
            sock.close()
            return
        start_thread(f"rank-{self.rank}-{kind}", target, hooks=hooks)

    def _forward(self, fd: int, sock: socket.socket) -> None:
        try:
            while True:
                data = sock.recv(CHUNK)
                if not data:
                    break
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
        except OSError:
            pass
        finally:
            os.close(fd)
            sock.close()

    def _serve_ctrl(self) -> None:
        sock = self._ctrl
        try:
            with self._lock:
                pending, self._pending = self._pending, []
            for signum in pending:
                self.tell(wire.Signal.of(signum))
            self.step.ctrl_connected(self)
            self._read_ctrl(sock)
        finally:
            # No exit line: the task wrapper itself was killed (usually by the
            # scheduler ending the step after another task failed).  Also when
            # this thread fails: the rank must end either way.
            self.finish(-signal.SIGKILL)
            sock.close()

    def _read_ctrl(self, sock: socket.socket) -> None:
        lines = sock.makefile("rb")
        try:
            for raw in lines:
                msg = wire.decode(raw)
                if isinstance(msg, wire.Coordinator):
                    self.step.set_coordinator(msg.address)
                elif isinstance(msg, wire.Joined):
                    contract.mark_joined(self.joined_file)  # the supervisor looks for it
                elif isinstance(msg, wire.Error) and self.error_file:
                    record = contract.ErrorRecord.from_json(msg.record)
                    if record:
                        record.dump(self.error_file)
                elif isinstance(msg, wire.Exit):
                    self.resources = contract.Resources.from_dict(msg.resources)
                    self.finish(msg.returncode)
                    self.tell(wire.Ack())
        except (OSError, ValueError):
            pass

    def tell(self, msg: wire.Message) -> None:
        try:
            self._ctrl.sendall(msg.line())
        except OSError:
            pass

    def wait_reported(self, timeout: float) -> None:
        self._done.wait(timeout)

    def hang_up(self) -> None:
        """Close the control connection: the task then kills its child.
        Never blocks (the watchdog calls it through ``abort``)."""
        if self._ctrl is not None:
            try:
                self._ctrl.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def finish(self, code: int, note: str | None = None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._code = code
            leftovers, self._unattached = self._unattached, {}
            self._done.set()
        for kind, fd in leftovers.items():
            if note and kind == "stderr":
                try:
                    os.write(fd, note.encode())
                except OSError:
                    pass
            os.close(fd)


class TaskListener:
    """The channel's one listening socket, and the one thread (``task-channel``)
    that accepts and reads headers; see the module docstring.

    ``attach(hello, sock)`` is called for each connection that showed the
    secret and that ``wanted(hello)`` accepted, after its ``Ack`` went out.
    The listener closes once ``expected`` connections were attached, or at
    ``close()``.
    """

    def __init__(self, host: str, secret: str, expected: int, wanted: Callable[[wire.Hello], bool],
                 attach: Callable[[wire.Hello, socket.socket], None], hooks: RunHooks):
        self.secret = secret.encode()
        self.expected = expected
        self.wanted = wanted
        self.attach = attach
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # The backlog absorbs a burst (every task at once, or a flood) while
        # this thread drains it; the kernel caps it at somaxconn.
        self.sock = socket.create_server((host, 0), family=family, backlog=max(1024, 3 * expected))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self._closing = False
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._waiting: dict[socket.socket, tuple[float, bytearray]] = {}  # deadline, bytes so far
        self.thread = start_thread("task-channel", self._serve, hooks=hooks)

    def stop(self) -> None:
        """Stop listening soon; never blocks.  The thread closes what it holds."""
        self._closing = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    def close(self) -> None:
        """Stop listening, and wait (briefly) until the thread has."""
        self.stop()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout=1.0)
        if not self.thread.is_alive():  # ended, or died early: nobody else closes these
            self.sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _serve(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        selector.register(self.sock, selectors.EVENT_READ)
        resume_at: float | None = None  # accepting paused until then (out of descriptors)
        try:
            while not self._closing and self.expected > 0:
                now = time.monotonic()
                if resume_at is not None and now >= resume_at:
                    selector.register(self.sock, selectors.EVENT_READ)
                    resume_at = None
                wake = [deadline for deadline, _ in self._waiting.values()]
                if resume_at is not None:
                    wake.append(resume_at)
                for key, _ in selector.select(max(0.0, min(wake) - now) if wake else None):
                    if key.fileobj is self._wake_r:
                        self._wake_r.recv(64)
                    elif key.fileobj is self.sock:
                        if not self._accept_some(selector):
                            selector.unregister(self.sock)
                            resume_at = time.monotonic() + ACCEPT_PAUSE
                    elif key.fileobj in self._waiting:
                        self._read_header(key.fileobj, selector)
                now = time.monotonic()
                for sock in [s for s, (deadline, _) in self._waiting.items() if deadline <= now]:
                    self._drop(sock, selector)
        finally:
            # Every rank attached, or the step is closing: nobody else may come in.
            for sock in list(self._waiting):
                self._drop(sock, selector)
            selector.close()
            self.sock.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept_some(self, selector: selectors.BaseSelector) -> bool:
        """Accept what the backlog holds; False when out of file descriptors."""
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.sock.accept()
            except BlockingIOError:
                return True
            except OSError as e:
                if e.errno not in OUT_OF_RESOURCES:
                    continue  # that one connection failed (ECONNABORTED and the like)
                if not self._waiting:
                    return False
                # Out of descriptors: the stranger that has waited longest
                # makes room.  A task's Hello comes with its connection, so
                # it passes at accept time and never waits to be evicted.
                self._drop(next(iter(self._waiting)), selector)
                continue
            sock.setblocking(False)
            self._waiting[sock] = (time.monotonic() + HEADER_TIMEOUT, bytearray())
            # A task sends its Hello with the connection: it is usually here
            # already, and then the connection never counts against the cap.
            if self._read_header(sock, None) and len(self._waiting) > MAX_UNAUTHENTICATED:
                self._drop(sock, None)
            elif sock in self._waiting:
                selector.register(sock, selectors.EVENT_READ)
        return True

    def _read_header(self, sock: socket.socket, selector: selectors.BaseSelector | None) -> bool:
        """Read what has arrived; True while the header is still incomplete."""
        _, data = self._waiting[sock]
        try:
            chunk = sock.recv(MAX_HEADER - len(data))
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            chunk = b""
        data += chunk
        if chunk and b"\n" not in data and len(data) < MAX_HEADER:
            return True
        line, newline, rest = bytes(data).partition(b"\n")
        hello = self._authenticate(line) if newline and not rest else None  # a task sends nothing before its Ack
        if hello is None:
            self._drop(sock, selector)
            return False
        self._forget(sock, selector)
        try:
            sent = sock.send(wire.Ack().line())
        except OSError:
            sent = 0
        if sent != len(wire.Ack().line()):
            sock.close()
            return False
        sock.setblocking(True)
        self.expected -= 1
        self.attach(hello, sock)
        return False

    def _authenticate(self, line: bytes) -> wire.Hello | None:
        try:
            hello = wire.decode(line)
        except (ValueError, RecursionError):  # WireError is a ValueError
            return None
        if not isinstance(hello, wire.Hello) or not isinstance(hello.secret, str):
            return None
        # Bytes, compared in constant time; any text (non-ASCII, lone
        # surrogates from a JSON escape) encodes under surrogatepass.
        if not secrets.compare_digest(hello.secret.encode("utf-8", "surrogatepass"), self.secret):
            return None
        if type(hello.rank) is not int or hello.kind not in wire.Hello.STREAM_KINDS:
            return None
        return hello if self.wanted(hello) else None

    def _forget(self, sock: socket.socket, selector: selectors.BaseSelector | None) -> None:
        del self._waiting[sock]
        if selector is not None:
            try:
                selector.unregister(sock)
            except (KeyError, ValueError):
                pass  # accepted in this round and not registered yet

    def _drop(self, sock: socket.socket, selector: selectors.BaseSelector | None) -> None:
        self._forget(sock, selector)
        sock.close()


class Step:
    """One scheduler step for all ranks; see the module docstring."""

    def __init__(
        self,
        command: str,
        specs: Sequence[ProcessSpec],
        build_command: Callable[[Mapping[str, str]], list[str]],
        step_env: Mapping[str, str],
        log_dir: str,
        console: TextIO,
        fixed_coordinator: str | None = None,
        channel_host: str | None = None,
        hooks: RunHooks | None = None,
    ):
        self.command = command  # srun or mpirun, as messages name it
        self.build_command = build_command
        self.step_env = dict(step_env)
        self.log_dir = log_dir
        self.console = console
        self.hooks = hooks or RunHooks()
        self.secret = secrets.token_hex(16)
        self.children = {s.rank: RankChild(s.rank, self) for s in specs}
        self.coordinator = fixed_coordinator
        self.lock = threading.Lock()
        self.connected: list[RankChild] = []
        self.reached = False  # a task has attached: the step runs, it is not queued
        self.queued_job: str | None = None  # the job srun said it waits for, until it runs
        self.popen: subprocess.Popen | None = None
        self._killing = False
        self._withdraw_lock = threading.Lock()
        host = channel_host or channel_address()
        self.listener = TaskListener(host, self.secret, 3 * len(self.children), self._wanted, self._attach, self.hooks)
        self.channel = contract.join_address(host, self.listener.port)

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0

    def spawn(self, spec: ProcessSpec, extra_env: Mapping[str, str]) -> RankChild:
        child = self.children[spec.rank]
        child.error_file = extra_env.get(contract.ERROR_FILE)
        child.joined_file = extra_env.get(contract.JOINED_FILE)
        if self.popen is None:
            self._start_step()
        return child

    def _start_step(self) -> None:
        env = dict(self.step_env)
        env[contract.TASK_CHANNEL] = self.channel
        env[contract.TASK_SECRET] = self.secret
        os.makedirs(self.log_dir, exist_ok=True)
        self.popen = subprocess.Popen(
            self.build_command(env),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        start_thread("step-watcher", self._watch_step, hooks=self.hooks)

    # -- the step process ------------------------------------------------------
    def _watch_step(self) -> None:
        log_path = os.path.join(self.log_dir, "engine.log")
        try:
            self._copy_engine_output(log_path)
        finally:
            # Whatever happened above, every rank ends once the step has.
            self.popen.stdout.close()  # nobody reads it any more: srun must not block on it
            code = self.popen.wait()
            self._withdraw_queued_job()
            deadline = time.monotonic() + LATE_REPORT_WAIT
            for child in self.children.values():
                child.wait_reported(max(0.0, deadline - time.monotonic()))
            # Every rank still unreported ends with the same engine failure.
            # Each one's stderr log records it; the console leaves those lines
            # out, and the summary names the failure once for all of them.
            note = contract.EngineNote.of(self.command, code, self.reached, log_path).line()
            for child in self.children.values():
                child.finish(code or 1, note)

    def _copy_engine_output(self, log_path: str) -> None:
        """What srun/mpirun print goes to engine.log and the console; neither
        a full disk nor a console that went away stops the copying (srun
        would block on its output)."""
        try:
            log = open(log_path, "wb")
        except OSError as e:
            log = None
            self._say(f"[{self.command}] jaxrun: cannot write {log_path}: {e}")
        console = True
        try:
            for line in self.popen.stdout:
                self._note_scheduler_line(line)
                if log is not None:
                    try:
                        log.write(line)
                        log.flush()
                    except OSError:
                        log.close()
                        log = None
                if console:
                    console = self._say(f"[{self.command}] {line.decode(errors='replace').rstrip()}")
        finally:
            if log is not None:
                try:
                    log.close()
                except OSError:
                    pass

    def _say(self, text: str) -> bool:
        try:
            print(text, file=self.console, flush=True)
            return True
        except (OSError, ValueError):
            return False

    def _note_scheduler_line(self, line: bytes) -> None:
        if self.command != "srun":
            return
        queued = QUEUED.search(line)
        if queued:
            self.queued_job = queued.group(1).decode()
        elif ALLOCATED.search(line):
            self.queued_job = None

    def _withdraw_queued_job(self, timeout: float = SCANCEL_TIMEOUT) -> None:
        """srun ended while its job was still queued (it was SIGKILLed before
        it could withdraw it): cancel that job, or it would run later."""
        with self._withdraw_lock:
            job, self.queued_job = self.queued_job, None
            if job is None:
                return
            try:
                subprocess.run(["scancel", job], env=self.step_env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout)
            except (OSError, subprocess.SubprocessError):
                self._say(f"[{self.command}] jaxrun: could not cancel the queued job {job}; run: scancel {job}")

    # -- the channel -------------------------------------------------------------
    def _wanted(self, hello: wire.Hello) -> bool:
        child = self.children.get(hello.rank)
        return child is not None and child.wants(hello.kind)

    def _attach(self, hello: wire.Hello, sock: socket.socket) -> None:
        self.reached = True
        self.children[hello.rank].attach(hello.kind, sock, self.hooks)

    def ctrl_connected(self, child: RankChild) -> None:
        with self.lock:
            self.connected.append(child)
            coordinator = self.coordinator
        if coordinator:
            child.tell(wire.Start(coordinator))

    def set_coordinator(self, address: str) -> None:
        with self.lock:
            if self.coordinator:
                return  # --coordinator was given; task 0's choice is not needed
            self.coordinator = address
            ready = list(self.connected)
        for child in ready:
            child.tell(wire.Start(address))

    # -- stopping --------------------------------------------------------------
    def kill(self) -> None:
        """End the step now, from any thread, without waiting.  An srun that
        no task has reached may still wait for its allocation: it gets
        SIGTERM, on which it withdraws its job (SIGKILL would leave the job
        queued), and SIGKILL only ``SRUN_WITHDRAW_WAIT`` later."""
        popen = self.popen
        if popen is None or popen.returncode is not None:
            return
        if self.command != "srun" or self.reached:
            self._signal(signal.SIGKILL)
            return
        self._signal(signal.SIGTERM)
        with self.lock:
            if self._killing:
                return
            self._killing = True
        start_thread("step-kill", self._kill_later, hooks=self.hooks)

    def _kill_later(self) -> None:
        deadline = time.monotonic() + SRUN_WITHDRAW_WAIT
        while self.popen.returncode is None and time.monotonic() < deadline:
            time.sleep(0.05)
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.popen is not None and self.popen.returncode is None:
            try:
                os.killpg(self.popen.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def close(self) -> None:
        """Closing the channel makes every task kill its child; then the step
        ends.  A step no task has reached is withdrawn from the queue."""
        self.listener.close()
        for child in self.children.values():
            child.hang_up()
        if self.popen:
            if not self.reached:
                self.kill()
            try:
                self.popen.wait(timeout=CLOSE_WAIT)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.popen.wait()
            self._withdraw_queued_job()
        for child in self.children.values():
            child.finish(-signal.SIGKILL)

    def abort(self) -> None:
        """The watchdog's last resort: hang up on every task and end the step.
        It waits for one thing only, and briefly: a queued job withdrawn (by
        srun, a few ms, else by scancel), since the caller SIGKILLs what is
        left next, and a SIGKILL that came first would leave the job queued."""
        self.listener.stop()
        for child in self.children.values():
            child.hang_up()
        self.kill()
        if self.queued_job is not None and self.popen is not None:
            deadline = time.monotonic() + SRUN_ABORT_WAIT
            while not _has_exited(self.popen.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
            # srun may end without withdrawing it (a loaded controller), and
            # the step watcher that would cancel it may not outlive this
            # process: cancel it here, briefly (a job gone already is no error).
            self._withdraw_queued_job(timeout=SRUN_ABORT_WAIT)


def _has_exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, without reaping it (the
    step watcher's ``Popen.wait`` does that)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # reaped already


def channel_address() -> str:
    """The one address the channel binds and tells the tasks.

    ``contract.TASK_CHANNEL_HOST`` if set, else this host's name, resolved
    here: tasks connect to exactly the address we listen on (binding a
    wildcard would expose the channel on every interface).  A name that
    resolves to nothing gives loopback, as does a name that resolves to a
    loopback address, which then only serves tasks on this node.
    """
    name = os.environ.get(contract.TASK_CHANNEL_HOST) or socket.gethostname()
    try:
        found = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return "127.0.0.1"
    # IPv4 first: what tasks on most clusters resolve and route.
    found.sort(key=lambda info: info[0] != socket.AF_INET)
    return found[0][4][0] if found else "127.0.0.1"
