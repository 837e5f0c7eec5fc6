"""Launcher side of a scheduler launch: one ``srun``/``mpirun`` step, one Child per rank.

A ``Step`` hands the supervisor one ``RankChild`` per rank, so the summary,
the report and the per-process logs work as for any backend.  The first
``spawn`` starts the whole step.  The task agents
(:mod:`jaxrun.backends.scheduler_agent`) connect back to a TCP listener here,
each connection opened by a ``wire.Hello`` that carries the per-run secret,
three connections per task:

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
notes) goes to ``engine.log`` in the log folder and to the console.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import threading
import time
from typing import Callable, Mapping, Sequence, TextIO

from jaxrun import contract, wire
from jaxrun.launcher.plan import ProcessSpec

CHUNK = 1 << 16
# After the step exits, how long ranks may still report their exit codes.
LATE_REPORT_WAIT = 3.0
HEADER_TIMEOUT = 10.0


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
            if self._ctrl is None:
                self._pending.append(signum)
                never_started = True
            else:
                never_started = False
        if not never_started:
            self.tell(wire.Signal.of(signum))
        elif signum == signal.SIGKILL:
            # The task has not reached us (still queued or starting): only
            # ending the whole step can stop it.
            self.step.kill()

    def wait(self) -> int:
        self._done.wait()
        return self._code

    # -- called from the channel's connection threads --------------------
    def attach_stream(self, kind: str, sock: socket.socket) -> None:
        with self._lock:
            fd = self._unattached.pop(kind, None)
        if fd is None:  # a duplicate, or the rank was already given up
            sock.close()
            return
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

    def attach_ctrl(self, sock: socket.socket) -> None:
        with self._lock:
            if self._ctrl is not None or self._done.is_set():
                sock.close()
                return
            self._ctrl = sock
            pending, self._pending = self._pending, []
        for signum in pending:
            self.tell(wire.Signal.of(signum))
        self.step.ctrl_connected(self)
        lines = sock.makefile("rb")
        try:
            for raw in lines:
                msg = wire.decode(raw)
                if isinstance(msg, wire.Coordinator):
                    self.step.set_coordinator(msg.address)
                elif isinstance(msg, wire.Error) and self.error_file:
                    record = contract.ErrorRecord.from_json(msg.record)
                    if record:
                        record.dump(self.error_file)
                elif isinstance(msg, wire.Exit):
                    self.finish(msg.returncode)
                    self.tell(wire.Ack())
        except (OSError, ValueError):
            pass
        # No exit line: the task wrapper itself was killed (usually by the
        # scheduler ending the step after another task failed).
        self.finish(-signal.SIGKILL)
        sock.close()

    def tell(self, msg: wire.Message) -> None:
        try:
            self._ctrl.sendall(msg.line())
        except OSError:
            pass

    def wait_reported(self, timeout: float) -> None:
        self._done.wait(timeout)

    def hang_up(self) -> None:
        """Close the control connection: the task then kills its child."""
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
    ):
        self.command = command  # srun or mpirun, as messages name it
        self.build_command = build_command
        self.step_env = dict(step_env)
        self.log_dir = log_dir
        self.console = console
        self.secret = secrets.token_hex(16)
        self.children = {s.rank: RankChild(s.rank, self) for s in specs}
        self.coordinator = fixed_coordinator
        self.lock = threading.Lock()
        self.connected: list[RankChild] = []
        self.popen: subprocess.Popen | None = None
        # All interfaces: the tasks may run on other nodes.  The secret keeps
        # strangers' connections out of the run.
        self.listener = socket.create_server(("0.0.0.0", 0), backlog=max(16, 3 * len(specs)))
        self.channel = f"{channel_host or advertised_host()}:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, name="task-channel", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0

    def spawn(self, spec: ProcessSpec, extra_env: Mapping[str, str]) -> RankChild:
        child = self.children[spec.rank]
        child.error_file = extra_env.get(contract.ERROR_FILE)
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
        threading.Thread(target=self._watch_step, name="step-watcher", daemon=True).start()

    def _watch_step(self) -> None:
        log_path = os.path.join(self.log_dir, "engine.log")
        with open(log_path, "wb") as log:
            for line in self.popen.stdout:
                log.write(line)
                log.flush()
                print(f"[{self.command}] {line.decode(errors='replace').rstrip()}", file=self.console, flush=True)
        code = self.popen.wait()
        deadline = time.monotonic() + LATE_REPORT_WAIT
        for child in self.children.values():
            child.wait_reported(max(0.0, deadline - time.monotonic()))
        for child in self.children.values():
            note = f"jaxrun: this task never reported back; {self.command} exited with code {code} (see {log_path})\n"
            child.finish(code or 1, note)

    # -- the channel ---------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._route, args=(sock,), daemon=True).start()

    def _route(self, sock: socket.socket) -> None:
        sock.settimeout(HEADER_TIMEOUT)
        header = b""
        try:
            while not header.endswith(b"\n") and len(header) < 512:
                byte = sock.recv(1)
                if not byte:
                    break
                header += byte
            hello = wire.decode(header)
            if not isinstance(hello, wire.Hello) or not secrets.compare_digest(str(hello.secret), self.secret):
                raise ValueError("not a task of this run")
            child = self.children[int(hello.rank)]
        except (OSError, ValueError, KeyError):
            sock.close()
            return
        if hello.kind not in wire.Hello.STREAM_KINDS:
            sock.close()
            return
        sock.settimeout(None)
        if hello.kind == "ctrl":
            child.attach_ctrl(sock)
        else:
            child.attach_stream(hello.kind, sock)

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
        if self.popen and self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """Closing the channel makes every task kill its child; then the step ends."""
        self.listener.close()
        for child in self.children.values():
            child.hang_up()
        if self.popen:
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
                self.popen.wait()
        for child in self.children.values():
            child.finish(-signal.SIGKILL)


def advertised_host() -> str:
    """The name tasks use to reach us: our hostname when it resolves, else loopback."""
    name = socket.gethostname()
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        return "127.0.0.1"
