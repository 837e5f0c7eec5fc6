"""The scheduler step: one ``srun``/``mpirun`` run for all ranks of an attempt.

A ``Step`` hands the supervisor one ``RankChild``
(:mod:`jaxrun.backends.scheduler.child`) per rank, so the summary, the
report and the per-process logs work as for any backend.  The first
``spawn`` starts the whole step.  Each task runs the task agent
(:mod:`jaxrun.backends.scheduler.task_agent`), which connects back to this step's
task channel (:mod:`jaxrun.backends.scheduler.channel`).

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

Stopping a step that Slurm still queues needs care: ``srun`` withdraws its
pending job on SIGTERM or SIGINT, but after SIGKILL the job stays in the
queue.  ``Step.kill`` therefore sends SIGTERM first while no task has reached
us, and the job id ``srun`` reported as queued is cancelled with ``scancel``
if ``srun`` ended without withdrawing it.

Threads are started through ``start_thread``, so one that dies is reported
to the run; the step's own are ``step-watcher`` and ``step-kill``.
"""

from __future__ import annotations

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

from jaxrun import contract, wire
from jaxrun.backends.scheduler.channel import TaskListener, channel_address
from jaxrun.backends.scheduler.child import RankChild
from jaxrun.backends.shield import shielded
from jaxrun.core import reaper
from jaxrun.core.backend import RunHooks, start_thread
from jaxrun.core.spec import ProcessSpec

# After the step exits, how long ranks may still report their exit codes.
LATE_REPORT_WAIT = 3.0
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

    def spawn(self, spec: ProcessSpec, extra_env: Mapping[str, str], on_join: Callable[[], None]) -> RankChild:
        child = self.children[spec.rank]
        child.error_file = extra_env.get(contract.ERROR_FILE)
        child.on_join = on_join
        if self.popen is None:
            self._start_step()
        return child

    def _start_step(self) -> None:
        env = dict(self.step_env)
        env[contract.TASK_CHANNEL] = self.channel
        env[contract.TASK_SECRET] = self.secret
        os.makedirs(self.log_dir, exist_ok=True)
        # mpirun keeps the stop signals blocked, so a SIGTERM sent to the whole
        # tree leaves it running (it would SIGKILL its job a second after
        # forwarding it); srun unblocks them, and cannot be shielded.
        with shielded():
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
            self._copy_scheduler_output(log_path)
        finally:
            # Whatever happened above, every rank ends once the step has.
            self.popen.stdout.close()  # nobody reads it any more: srun must not block on it
            code = self.popen.wait()
            self._withdraw_queued_job()
            deadline = time.monotonic() + LATE_REPORT_WAIT
            for child in self.children.values():
                child.wait_reported(max(0.0, deadline - time.monotonic()))
            # Every rank still unreported ends with the same scheduler failure.
            # Each one's stderr log records it; the console leaves those lines
            # out, and the summary names the failure once for all of them.
            note = contract.EngineNote.of(self.command, code, self.reached, log_path).line()
            for child in self.children.values():
                child.finish(code or 1, note)

    def _copy_scheduler_output(self, log_path: str) -> None:
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

    def control_connected(self, child: RankChild) -> None:
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
        # Popen sets returncode as it reaps: no group is signalled after that.
        if self.popen is not None and self.popen.returncode is None:
            reaper.kill_group(self.popen.pid, signum)

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
