"""The far end of the scheduler backend: what ``srun``/``mpirun`` start on each node.

Started as ``python -m jaxrun.backends.scheduler.task_agent -- python -m jaxrun.shim ...``.
The scheduler gives us a rank; we give the launcher back what a local child
would:

- three TCP connections to the launcher's task channel (see
  :mod:`jaxrun.backends.scheduler.channel`): the child's stdout and stderr go
  straight into two of them, byte for byte, so per-process logs stay exact;
  the third carries :mod:`jaxrun.wire.tasks` messages both ways.  Each connection
  counts once the launcher has answered its ``TaskHello`` with an ``Ack``; one
  it closed instead (too many strangers connecting at once) is made again;
- the child's ``JAX_LOCAL_DEVICE_IDS``, from the GPUs the engine bound to
  this task, else from the local rank it gave us
  (:mod:`jaxrun.contract.devices`);
- task 0 picks the coordinator's port on its own node and reports it; every
  task waits for the launcher's ``Start`` before starting the shim;
- ``Signal`` messages are delivered to the child's process group, so the
  supervisor can dump stacks or kill one rank like a local child;
- when the child arrives at the job's rendezvous (its joined file appears in
  our private folder), a ``TaskJoined`` message says so, for the start-up progress;
- the child's exit code (Popen style) and its error record come back as
  ``Error`` and ``Exit``, and this wrapper exits with the same status, so the
  scheduler's own fail-fast (``--kill-on-bad-exit``) fires too; except in a
  recoverable job, where a task other than 0 exits 0 and the others go on.

When the control connection drops (the launcher died), the child's group is
killed; when this wrapper dies, the shim's lifeline pipe kills the child.
The agent is a child subreaper (see :mod:`jaxrun.core.reaper`): a daemon
the script starts with ``setsid()`` stays its descendant, and is killed with
whatever else is left once the shim ends.  The child is run by
:func:`jaxrun.backends.far_end.run`, as every far end runs its controller;
:class:`TaskHome` is this agent's side of it.  This module never imports jax.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import sys
import threading
import time

from jaxrun import contract, portable
from jaxrun.backends import far_end
from jaxrun.contract import devices
from jaxrun.contract.devices import local_count_from_env
from jaxrun.core import reaper
from jaxrun.wire import encoding, tasks

USAGE = f"usage: python -m {contract.SCHEDULER_AGENT_MODULE} -- COMMAND..."
CONNECT_TIMEOUT = 30.0  # per connection, retries included
RETRY_PAUSE = (0.05, 1.0)  # first and longest pause between tries
ACK_TIMEOUT = 5.0
# Signals a scheduler may send the task; the child gets them instead of us.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


class TaskChannel:
    def __init__(self, address: str, secret: str, rank: int):
        host, port = address.rsplit(":", 1)
        self.address = (host.strip("[]"), int(port))  # an IPv6 address comes in brackets
        self.secret = secret
        self.rank = rank
        self.send_lock = threading.Lock()
        self.ctrl = self.connect(tasks.CONTROL)
        self.ctrl_file = self.ctrl.makefile("rb")

    def connect(self, kind: str) -> socket.socket:
        """A connection the launcher has accepted as ours (it sent its Ack).
        The launcher closes connections it cannot take yet, so try again
        until CONNECT_TIMEOUT has passed."""
        deadline = time.monotonic() + CONNECT_TIMEOUT
        pause = RETRY_PAUSE[0]
        while True:
            try:
                return self._try_connect(kind, deadline)
            except OSError:
                if time.monotonic() + pause > deadline:
                    raise
            time.sleep(pause)
            pause = min(2 * pause, RETRY_PAUSE[1])

    def _try_connect(self, kind: str, deadline: float) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=max(0.1, deadline - time.monotonic()))
        try:
            sock.sendall(tasks.TaskHello(self.secret, self.rank, kind).line())
            if _read_line(sock) != tasks.Ack().line():
                raise ConnectionResetError("the launcher closed the connection")
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        return sock

    def send(self, msg: encoding.Message) -> None:
        with self.send_lock:
            self.ctrl.sendall(msg.line())

    def read(self) -> encoding.Message | None:
        """The next control message; None when the launcher is gone."""
        while True:
            try:
                line = self.ctrl_file.readline()
            except OSError:
                line = b""
            if not line:
                return None
            try:
                return encoding.decode(line)
            except encoding.WireError:
                continue  # from a newer launcher: not ours to act on


def _read_line(sock: socket.socket, limit: int = 64) -> bytes:
    """One short line, byte by byte: nothing after it may be taken from the
    socket (on ``ctrl``, the launcher's next message may follow at once)."""
    line = b""
    while not line.endswith(b"\n") and len(line) < limit:
        byte = sock.recv(1)
        if not byte:
            break
        line += byte
    return line


def pick_coordinator(channel: TaskChannel) -> str:
    """A free port on this node, on the address that reaches the launcher:
    that interface is the one the other nodes can reach too."""
    ip = channel.ctrl.getsockname()[0]
    return contract.join_address(ip, portable.free_port(ip))


def device_env(local: int, local_count: int, environ=os.environ) -> dict[str, str]:
    """The child's devices among those this task sees (:mod:`gpus`), when
    the launcher asks (``contract.TASK_DEVICES_PER_PROCESS``: K, or "auto"
    for the engine's binding or an even split)."""
    given = environ.get(contract.TASK_DEVICES_PER_PROCESS)
    if not given:
        return {}
    per_process = None if given == devices.AUTO else int(given)
    ids, _ = devices.task_device_ids(local, local_count, per_process, environ, devices.node_gpus(environ))
    return {} if ids is None else {contract.JAX_LOCAL_DEVICE_IDS: ",".join(map(str, ids))}


# The launcher's words to this agent: the child runs as it would under a plain launch.
AGENT_ONLY = (contract.TASK_SECRET, contract.TASK_CHANNEL, contract.TASK_DEVICES_PER_PROCESS)


def child_env(coordinator: str, rank: int, local: int = 0) -> dict[str, str]:
    """The child's environment; ``far_end.run`` adds its lifeline, error and
    joined files."""
    env = {k: v for k, v in os.environ.items() if k not in AGENT_ONLY}
    env[contract.COORDINATOR_ADDRESS] = env[contract.JAX_COORDINATOR_ADDRESS] = coordinator
    if rank == 0:
        # Bind exactly the address we advertise, never all interfaces.
        env.update(contract.bind_env(coordinator))
    local_count = local_count_from_env()
    env[contract.LOCAL_PROCESS_COUNT] = str(local_count)
    env.update(device_env(local, local_count))
    if env.get(contract.PROFILE_DIR):  # the attempt's trace folder, on the launcher's machine: this rank's in it
        env[contract.PROFILE_DIR] = contract.process_trace_folder(env[contract.PROFILE_DIR], rank)
    return env


class SchedulerSignals:
    """The signals the scheduler sends this task, which are the child's.
    Before the child exists, one ends the task at once (SIGUSR1 aside: there
    is no stack to dump yet); after, it is queued, and relayed to the child
    from a thread.  A handler only queues: it runs in the main thread, which
    may hold the child's group's lock at that very moment."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.child_started = False

    def install(self) -> None:
        for signum in FORWARDED:
            signal.signal(signum, self.handle)

    def started(self, _controller: far_end.Controller) -> None:
        self.child_started = True

    def handle(self, signum: int, _frame=None) -> None:
        if self.child_started:
            self.queue.put(signum)
        elif signum != signal.SIGUSR1:
            os._exit(128 + signum)

    def relay(self, controller: far_end.Controller) -> None:
        while True:
            controller.signal(self.queue.get())


class TaskHome:
    """The task agent's side of the launcher: its control connection, both
    ways, and the scheduler's own signals.  ``err``: the child's stderr
    connection, for a child that never starts."""

    def __init__(self, channel: TaskChannel, rank: int, err: int, scheduler: SchedulerSignals):
        self.channel, self.rank, self.err, self.scheduler = channel, rank, err, scheduler
        self.acked = threading.Event()
        self.told_recoverable = False  # the launcher decided that the job is recoverable

    def listen(self, controller: far_end.Controller) -> None:
        """Deliver the launcher's signals until its Ack; a lost launcher means SIGKILL."""
        threading.Thread(target=self.scheduler.relay, args=(controller,), name="task-signals", daemon=True).start()
        while True:
            msg = self.channel.read()
            if msg is None:
                controller.lost()
                break
            if isinstance(msg, tasks.Signal):
                controller.signal(msg.signum)
            elif isinstance(msg, tasks.JobRecoverable):
                self.told_recoverable = True
            elif isinstance(msg, tasks.Ack):
                break
        self.acked.set()

    def joined(self, recoverable: bool) -> None:
        self.channel.send(tasks.TaskJoined(recoverable))

    def activity(self, state: str) -> None:
        self.channel.send(tasks.TaskActivity(state))

    def cannot_start(self, command: list[str], error: OSError) -> None:
        try:
            far_end.write_all(self.err, f"jaxrun task {self.rank}: cannot start {command[0]}: {error}\n".encode())
            self.channel.send(tasks.Exit(far_end.CANNOT_START))
        except OSError:
            pass  # the launcher is gone: the scheduler ends the step

    def report(self, code: int, record: contract.ErrorRecord | None, used: contract.Resources | None,
               reaped: far_end.Reaped) -> None:
        exit_msg = tasks.Exit(code, used.to_dict() if used else None, reaped.at, reaped.clock, reaped.pid,
                              reaped.marks.to_dict() if reaped.marks else None)
        for msg in ([tasks.Error(record.to_json())] if record else []) + [exit_msg]:
            try:
                self.channel.send(msg)
            except OSError:
                pass
        # Wait until the launcher has the code: once we exit, the scheduler kills
        # the other tasks, and their losses must not reach the launcher first.
        self.acked.wait(ACK_TIMEOUT)


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        rank, count, local = contract.identity_from_env()
    except ValueError as e:
        print(f"jaxrun task: {e}", file=sys.stderr)
        return 2
    scheduler = SchedulerSignals()
    scheduler.install()
    try:
        channel = TaskChannel(os.environ[contract.TASK_CHANNEL], os.environ[contract.TASK_SECRET], rank)
        out, err = channel.connect(tasks.STDOUT), channel.connect(tasks.STDERR)
    except (KeyError, OSError) as e:
        print(f"jaxrun task {rank}: cannot reach the launcher's task channel: {e}", file=sys.stderr)
        return 1
    if rank == 0:
        channel.send(tasks.Coordinator(pick_coordinator(channel)))
    coordinator = wait_for_start(channel)
    if coordinator is None:
        return 1
    values = contract.placeholder_values(rank, count, local, coordinator)
    command = [contract.substitute(a, values) for a in argv[1:]]
    reaper.become_subreaper()
    fds = (out.detach(), err.detach())  # the child's alone once it has them: far_end closes ours
    home = TaskHome(channel, rank, fds[1], scheduler)
    code = far_end.run(command, child_env(coordinator, rank, local), home, fds=fds, give_fds=True,
                       on_start=scheduler.started)
    if rank != 0 and spares_the_others(os.environ.get(contract.RECOVERABLE_MODE), home.told_recoverable):
        return 0  # the launcher has the real status; the scheduler's fail-fast must leave the others be
    return contract.exit_status(code)


def spares_the_others(mode: str | None, told: bool) -> bool:
    """Whether this task's end must not end the step: in a recoverable job,
    the others go on without a process other than 0.  The launcher decides
    that, once: ``--recoverable`` ("on") or ``--no-recoverable`` ("off") in
    the environment, or, by default, its word on the control connection
    that every process announced it (``told``)."""
    return mode == "on" or (mode != "off" and told)


def wait_for_start(channel: TaskChannel) -> str | None:
    while True:
        msg = channel.read()
        if msg is None:
            return None
        if isinstance(msg, tasks.Start):
            return msg.address
        if isinstance(msg, tasks.Signal) and msg.signum != signal.SIGUSR1:
            os._exit(128 + msg.signum)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
