"""One rank of a scheduler step, as the supervisor's Child.

A ``RankChild`` stands for the controller one task of the scheduler step
runs.  The task's three connections to the task channel
(:mod:`jaxrun.backends.scheduler.channel`) are attached to it as they arrive:

- ``tasks.STDOUT`` and ``tasks.STDERR`` carry the controller's bytes
  unchanged; a forwarder thread copies them into the pipe the supervisor's
  pump already reads, so the streams hold only the process's own bytes and
  ``stream_filter`` takes nothing out;
- ``tasks.CONTROL`` carries :mod:`jaxrun.wire.tasks` messages.  Out:
  ``Start`` with the coordinator address, ``Signal``, and the ``Ack`` of an
  exit.  In: task 0's ``Coordinator``, and the facts the Child contract
  passes on one way for every backend: ``TaskJoined`` calls the spawn's
  ``on_join``, ``Error`` is written to the error file the supervisor named,
  and ``Exit`` (its code, the resources the task agent measured, when its
  node's clock saw the end, and the controller's own pid there) is what
  ``wait`` returns.  A rank that
  ends without an ``Exit`` (its task agent, or the whole step, ended first)
  says so: ``ChildExit.lost``.

Every thread is started through ``start_thread``, so one that dies is
reported to the run instead of leaving a rank that never ends; their names
(what ``contract.INJECT_THREAD_FAULT`` matches) are ``rank-N-`` and the
connection's kind, for rank N.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Protocol

from jaxrun import contract
from jaxrun.core.backend import NO_NEWS, ChildExit, News, RunHooks, start_thread
from jaxrun.core.events import Stream
from jaxrun.wire import encoding, tasks

CHUNK = 1 << 16
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)


class StepSide(Protocol):
    """What a rank needs from its scheduler step (``step.Step``)."""

    pid: int
    reached: bool  # a task has attached: the step runs, it is not queued

    def kill(self) -> None: ...

    def control_connected(self, child: RankChild) -> None: ...

    def set_coordinator(self, address: str) -> None: ...


class RankChild:
    """One rank of the step, seen through its task's channel connections."""

    reports_joins = True  # TaskJoined and TaskActivity messages tell the spawn's News; no file is watched

    def __init__(self, rank: int, step: StepSide):
        self.rank = rank
        self.step = step
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        self.stdout = os.fdopen(out_r, "rb", buffering=0)
        self.stderr = os.fdopen(err_r, "rb", buffering=0)
        self.error_file: str | None = None  # the launcher's, where the task's error record goes
        self.news: News = NO_NEWS
        self._resources: contract.Resources | None = None  # measured by the task agent
        self._end: tasks.Exit | None = None  # the task agent's report of its controller's end
        self._lost = "its task agent"  # what ended instead, if no Exit comes
        self._unattached = {tasks.STDOUT: out_w, tasks.STDERR: err_w}  # write ends no task holds yet
        self._control: socket.socket | None = None
        self._pending: list[int] = []  # signals sent before the task connected
        self._lock = threading.Lock()
        # Held while a message is written to the task, and while its exit is
        # taken in: no Signal can follow the exit it crossed, and two threads'
        # messages never interleave on the connection.
        self._write_lock = threading.RLock()
        self._done = threading.Event()
        self._code: int | None = None

    @property
    def pid(self) -> int:
        return self.step.pid

    def send(self, signum: int) -> None:
        with self._write_lock:
            with self._lock:
                if self._done.is_set():
                    return
                attached = self._control is not None
                if not attached:
                    self._pending.append(signum)
            if attached:
                self.tell(tasks.Signal.of(signum))
                return
        if signum == signal.SIGKILL or (signum in ENDING_SIGNALS and not self.step.reached):
            # The task has not reached us (still queued or starting): only
            # ending the whole step can stop it.  A step no task has reached
            # yet has nothing to stop gracefully, and may be queued: end it now.
            self.step.kill()

    def wait(self) -> ChildExit:
        self._done.wait()
        end = self._end
        if end is None:
            return ChildExit(self._code, self._resources, lost=self._lost)
        pid = end.pid if isinstance(end.pid, int) else None
        reaped_at = float(end.reaped_at) if isinstance(end.reaped_at, (int, float)) else None
        return ChildExit(self._code, self._resources, reaped_at, end.clock if isinstance(end.clock, str) else None,
                         pid, marks=contract.Marks.from_dict(end.marks))

    def stream_filter(self, stream: Stream) -> None:
        return None  # the task channel carries the process's bytes and nothing else

    # -- connections, offered by the listener's thread ----------------------
    def wants(self, kind: str) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
            return self._control is None if kind == tasks.CONTROL else kind in self._unattached

    def attach(self, kind: str, sock: socket.socket, hooks: RunHooks) -> None:
        """Take a connection that showed the secret; serve it in its own thread."""
        with self._lock:
            if self._done.is_set():
                target = None
            elif kind == tasks.CONTROL:
                target = None if self._control is not None else self._serve_control
                if target:
                    self._control = sock
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

    def _serve_control(self) -> None:
        sock = self._control
        try:
            with self._lock:
                pending, self._pending = self._pending, []
            for signum in pending:
                self.tell(tasks.Signal.of(signum))
            self.step.control_connected(self)
            self._read_control(sock)
        finally:
            # No exit line: the task agent itself was killed (usually by the
            # scheduler ending the step after another task failed).  Also when
            # this thread fails: the rank must end either way.
            self.finish(-signal.SIGKILL)
            sock.close()

    def _read_control(self, sock: socket.socket) -> None:
        lines = sock.makefile("rb")
        try:
            for raw in lines:
                msg = encoding.decode(raw)
                if isinstance(msg, tasks.Coordinator):
                    self.step.set_coordinator(msg.address)
                elif isinstance(msg, tasks.TaskJoined):
                    self.news.joined(bool(msg.recoverable))
                elif isinstance(msg, tasks.TaskActivity):
                    self.news.activity(msg.state)
                elif isinstance(msg, tasks.Error) and self.error_file:
                    record = contract.ErrorRecord.from_json(msg.record)
                    if record:
                        record.dump(self.error_file)
                elif isinstance(msg, tasks.Exit):
                    with self._write_lock:
                        self._resources = contract.Resources.from_dict(msg.resources)
                        self.finish(msg.returncode, end=msg)
                        self.tell(tasks.Ack())
        except (OSError, ValueError):
            pass

    def tell(self, msg: encoding.Message) -> None:
        try:
            with self._write_lock:
                self._control.sendall(msg.line())
        except OSError:
            pass

    def wait_reported(self, timeout: float) -> None:
        self._done.wait(timeout)

    def hang_up(self) -> None:
        """Close the control connection: the task then kills its child.
        Never blocks (the watchdog calls it through ``abort``)."""
        if self._control is not None:
            try:
                self._control.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def finish(self, code: int, note: str | None = None, end: tasks.Exit | None = None) -> None:
        """The rank ended: its task agent's ``end``, or, without one, ``code``
        stands in (``note``: the step's own end, written to its stderr log)."""
        with self._lock:
            if self._done.is_set():
                return
            self._code, self._end = code, end
            if note:  # the step ended under it: the scheduler's end stands in for it
                self._lost = "the scheduler step"
            leftovers, self._unattached = self._unattached, {}
            self._done.set()
        for kind, fd in leftovers.items():
            if note and kind == tasks.STDERR:
                try:
                    os.write(fd, note.encode())
                except OSError:
                    pass
            os.close(fd)
