"""The scheduler step: one engine process (``srun``, ``mpirun``, a Ray driver) for all ranks of an attempt.

A ``Step`` hands the supervisor one ``RankChild``
(:mod:`jaxrun.backends.scheduler.child`) per rank, so the summary, the
report and the per-process logs work as for any backend.  The first
``spawn`` starts the step's process.  Each task runs the task agent
(:mod:`jaxrun.backends.scheduler.task_agent`), which connects back to this step's
task channel (:mod:`jaxrun.backends.scheduler.channel`).

Why a channel instead of demultiplexing ``srun --label`` / ``mpirun
--tag-output``: those prefix whole lines only, so partial last lines, bytes
without a newline and the exact byte stream would be lost or altered, and
neither reports per-task exit codes or lets us signal one task.  The cost is
one TCP listener per run: compute nodes must be able to reach the launcher's
host (which ``srun`` and ``mpirun`` already require for their own I/O).
Whatever the engine itself prints (allocation errors, its own failure
notes) goes to ``engine.log`` in the log folder and to the console.  When the
step ends before some tasks reported back, each of those ranks ends with the
step's code and one note (``contract.EngineNote``) in its stderr log; the
console leaves those notes out, and the summary names the failure once.

The ``Step`` knows no engine: what differs between them (the command line,
how to stop one that is still queued, what to clean up once it ended) is
its ``StepProcess``, one implementation per engine beside its backend.

Threads are started through ``start_thread``, so one that dies is reported
to the run; the step's own is ``step-watcher``.
"""

from __future__ import annotations

import abc
import os
import re
import secrets
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO

from jaxrun import contract
from jaxrun.backends.scheduler.channel import TaskListener, channel_address
from jaxrun.backends.scheduler.child import RankChild
from jaxrun.backends.shield import shielded
from jaxrun.core import reaper
from jaxrun.core.backend import News, RunHooks, start_thread
from jaxrun.core.config import LaunchError
from jaxrun.core.spec import ProcessSpec
from jaxrun.wire import tasks

# After the step exits, how long ranks may still report their exit codes.
LATE_REPORT_WAIT = 3.0
# After the task channel closes, how long the tasks get to end their step.
CLOSE_WAIT = 10.0

Say = Callable[[str], bool]  # one line for the console; False once it cannot take more


class StepProcess(abc.ABC):
    """The one process a step is, as the ``Step`` drives it: started once
    with the channel's environment, its output copied until it ends, stopped
    by the engine's own rule, and cleaned up after."""

    program: str = ""  # how messages and the EngineNote name it
    popen: subprocess.Popen | None = None  # set by ``start``
    # Words of the engine's own notices that only repeat how the job ended,
    # which the summary says better (mpirun's "a process exited with non-zero
    # status" boxes): such a notice stays in engine.log, off the console.
    repeats: tuple[bytes, ...] = ()

    @abc.abstractmethod
    def start(self, env: Mapping[str, str], hooks: RunHooks) -> None:
        """Start it; ``env`` holds the task channel's address and secret."""

    def copy_output(self, log_path: str, say: Say) -> None:
        """Its output into ``log_path`` and onto the console, until it ends;
        neither a full disk nor a console that went away stops the copying
        (the engine would block on its output)."""
        try:
            log = open(log_path, "wb")
        except OSError as e:
            log = None
            say(f"[{self.program}] jaxrun: cannot write {log_path}: {e}")
        notices = Notices(self.repeats)
        console = True
        try:
            for line in self.popen.stdout:
                self.heard(line)
                if log is not None:
                    try:
                        log.write(line)
                        log.flush()
                    except OSError:
                        log.close()
                        log = None
                for shown in notices.passing(line):
                    if console:
                        console = say(f"[{self.program}] {shown.decode(errors='replace').rstrip()}")
            for shown in notices.held():
                if console:
                    console = say(f"[{self.program}] {shown.decode(errors='replace').rstrip()}")
        finally:
            if log is not None:
                try:
                    log.close()
                except OSError:
                    pass

    def heard(self, line: bytes) -> None:
        """One line of its output, as it passes."""

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen else 0

    @property
    def started(self) -> bool:
        return self.popen is not None

    @property
    def ended(self) -> bool:
        return self.popen is not None and self.popen.returncode is not None

    def reap(self) -> int:
        """Once its output has ended: its exit status."""
        self.popen.stdout.close()  # nobody reads it any more: it must not block on it
        return self.popen.wait()

    def wait(self, timeout: float) -> None:
        """Wait for its end; SIGKILL once ``timeout`` has passed."""
        try:
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait()

    def signal(self, signum: int) -> None:
        # Popen sets returncode as it reaps: no group is signalled after that.
        if self.popen is not None and self.popen.returncode is None:
            reaper.kill_group(self.popen.pid, signum)

    def stop(self, reached: bool, hooks: RunHooks) -> None:
        """End it now, from any thread, without waiting (``reached``: a task
        has attached, so the step runs)."""
        self.signal(signal.SIGKILL)

    def cleanup(self, timeout: float | None = None) -> None:
        """After it ended: undo what it may have left behind."""

    def settle(self) -> None:
        """The watchdog's last resort is about to SIGKILL what is left: wait
        (briefly) for whatever must come first."""


class Notices:
    """An engine's output on its way to the console: a notice boxed between
    ruler lines (``-----``) is held until its box closes, then shown, or left
    to engine.log alone when it holds one of ``repeats``."""

    def __init__(self, repeats: tuple[bytes, ...]):
        self.repeats = repeats
        self.box: list[bytes] | None = None  # the open box's lines, ruler first

    def passing(self, line: bytes) -> list[bytes]:
        """The lines to show now, ``line`` among them or held."""
        ruler = bool(self.repeats) and _RULER.match(line) is not None
        if self.box is None:
            if not ruler:
                return [line]
            self.box = [line]
            return []
        self.box.append(line)
        if not ruler:
            return []
        box, self.box = self.box, None
        return [] if any(word in part for part in box for word in self.repeats) else box

    def held(self) -> list[bytes]:
        """At the output's end: a box that never closed, shown as it is."""
        box, self.box = self.box or [], None
        return box


_RULER = re.compile(rb"^-{20,}\s*$")


class Command(StepProcess):
    """A step that is one program on this machine, started from its argv."""

    @abc.abstractmethod
    def argv(self, env: Mapping[str, str]) -> list[str]:
        """Its command line, for the environment ``env`` it starts with."""

    def start(self, env: Mapping[str, str], hooks: RunHooks) -> None:
        # mpirun keeps the stop signals blocked, so a SIGTERM sent to the whole
        # tree leaves it running (it would SIGKILL its job a second after
        # forwarding it); srun unblocks them, and cannot be shielded.
        with shielded():
            self.popen = subprocess.Popen(self.argv(env), env=dict(env), stdin=subprocess.DEVNULL,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


class Step:
    """One scheduler step for all ranks; see the module docstring."""

    def __init__(
        self,
        process: StepProcess,
        specs: Sequence[ProcessSpec],
        step_env: Mapping[str, str],
        log_dir: str,
        console: TextIO,
        fixed_coordinator: str | None = None,
        channel_host: str | None = None,
        hooks: RunHooks | None = None,
        channel_port: int = 0,
    ):
        self.process = process
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
        host = channel_host or channel_address()
        try:
            self.listener = TaskListener(host, self.secret, 3 * len(self.children), self._wanted, self._attach,
                                         self.hooks, channel_port)
        except OSError as e:  # a port the user chose (--channel-port), taken
            raise LaunchError(f"--channel-port {channel_port}: cannot listen on "
                              f"{contract.join_address(host, channel_port)}: {e.strerror or e}") from None
        self.channel = contract.join_address(host, self.listener.port)

    @property
    def pid(self) -> int:
        return self.process.pid

    def spawn(self, spec: ProcessSpec, extra_env: Mapping[str, str], news: News) -> RankChild:
        child = self.children[spec.rank]
        child.error_file = extra_env.get(contract.ERROR_FILE)
        child.news = news
        if not self.process.started:
            env = dict(self.step_env)
            env[contract.TASK_CHANNEL] = self.channel
            env[contract.TASK_SECRET] = self.secret
            if contract.PROFILE_DIR in extra_env:  # the attempt's trace folder: each task agent takes its own in it
                env[contract.PROFILE_DIR] = os.path.dirname(extra_env[contract.PROFILE_DIR])
            os.makedirs(self.log_dir, exist_ok=True)
            self.process.start(env, self.hooks)
            start_thread("step-watcher", self._watch_step, hooks=self.hooks)
        return child

    # -- the step process ------------------------------------------------------
    def _watch_step(self) -> None:
        log_path = os.path.join(self.log_dir, "engine.log")
        try:
            self.process.copy_output(log_path, self._say)
        finally:
            # Whatever happened above, every rank ends once the step has.
            code = self.process.reap()
            self.process.cleanup()
            deadline = time.monotonic() + LATE_REPORT_WAIT
            for child in self.children.values():
                child.wait_reported(max(0.0, deadline - time.monotonic()))
            # Every rank still unreported ends with the same engine failure.
            # Each one's stderr log records it; the console leaves those lines
            # out, and the summary names the failure once for all of them.
            note = contract.EngineNote.of(self.process.program, code, self.reached, log_path).line()
            for child in self.children.values():
                child.finish(code or 1, note)

    def _say(self, text: str) -> bool:
        try:
            print(text, file=self.console, flush=True)
            return True
        except (OSError, ValueError):
            return False

    # -- the channel -------------------------------------------------------------
    def _wanted(self, hello: tasks.TaskHello) -> bool:
        child = self.children.get(hello.rank)
        return child is not None and child.wants(hello.kind)

    def _attach(self, hello: tasks.TaskHello, sock: socket.socket) -> None:
        self.reached = True
        self.children[hello.rank].attach(hello.kind, sock, self.hooks)

    def control_connected(self, child: RankChild) -> None:
        with self.lock:
            self.connected.append(child)
            coordinator = self.coordinator
        if coordinator:
            child.tell(tasks.Start(coordinator))

    def job_is_recoverable(self) -> None:
        """Tell every task agent that the launcher decided the job is recoverable."""
        with self.lock:
            ready = list(self.connected)
        for child in ready:
            child.tell(tasks.JobRecoverable())

    def set_coordinator(self, address: str) -> None:
        with self.lock:
            if self.coordinator:
                return  # --coordinator was given; task 0's choice is not needed
            self.coordinator = address
            ready = list(self.connected)
        for child in ready:
            child.tell(tasks.Start(address))

    # -- stopping --------------------------------------------------------------
    def kill(self) -> None:
        """End the step now, from any thread, without waiting, as its engine
        must be stopped (a queued srun job is withdrawn first)."""
        if self.process.started and not self.process.ended:
            self.process.stop(self.reached, self.hooks)

    def close(self) -> None:
        """Closing the channel makes every task kill its child; then the step
        ends.  A step no task has reached is stopped (a queued job withdrawn)."""
        self.listener.close()
        for child in self.children.values():
            child.hang_up()
        if self.process.started:
            if not self.reached:
                self.kill()
            self.process.wait(CLOSE_WAIT)
            self.process.cleanup()
        for child in self.children.values():
            child.finish(-signal.SIGKILL)

    def abort(self) -> None:
        """The watchdog's last resort: hang up on every task and end the step,
        waiting only for what its process must do before the SIGKILL that
        comes next (a queued srun job withdrawn, briefly)."""
        self.listener.stop()
        for child in self.children.values():
            child.hang_up()
        self.kill()
        if self.process.started:
            self.process.settle()
