"""Task side of a scheduler launch: what ``srun``/``mpirun`` start on each node.

Started as ``python -m jaxrun.task -- python -m jaxrun.shim ...``.  The
scheduler gives us a rank; we give the launcher back what a local child would:

- three TCP connections to the launcher's task channel (see
  :mod:`jaxrun.taskchannel`): the child's stdout and stderr go straight into
  two of them, byte for byte, so per-process logs stay exact; the third is
  for control lines in both directions;
- task 0 picks the coordinator's port on its own node and reports it; every
  task waits for the launcher's ``start ADDRESS`` before starting the shim;
- ``signal N`` lines are delivered to the child's process group, so the
  supervisor can dump stacks or kill one rank like a local child;
- the child's exit code (Popen style) and its error record come back as
  ``error JSON`` and ``exit CODE``, and this wrapper exits with the same
  status, so the scheduler's own fail-fast (``--kill-on-bad-exit``) fires too.

When the control connection drops (the launcher died), the child's group is
killed; when this wrapper dies, the shim's lifeline pipe kills the child.
This module never imports jax.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading

from jaxrun import contract
from jaxrun.bootstrap import BootstrapError, identity_from_env
from jaxrun.plan import substitute

CHANNEL = "JAXRUN_TASK_CHANNEL"  # host:port of the launcher's task channel
SECRET = "JAXRUN_TASK_SECRET"  # proves a connection belongs to this run
CONNECT_TIMEOUT = 30.0
ACK_TIMEOUT = 5.0
# Signals a scheduler may send the task; the child gets them instead of us.
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


def local_count_from_env(environ=os.environ) -> int:
    """How many tasks of this step share our node."""
    source = environ.get(contract.RANK_SOURCE)
    if source == "mpi":
        return int(environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1"))
    if source == "slurm":
        return tasks_on_node(environ.get("SLURM_STEP_TASKS_PER_NODE", ""), int(environ.get("SLURM_NODEID", "0")))
    return 1


def tasks_on_node(per_node: str, node_index: int) -> int:
    """Slurm's compressed list, e.g. "2(x3),1": node 3 has 1 task."""
    counts: list[int] = []
    for part in filter(None, per_node.split(",")):
        count, _, repeat = part.partition("(x")
        counts.extend([int(count)] * (int(repeat.rstrip(")")) if repeat else 1))
    return counts[node_index] if node_index < len(counts) else 1


class Channel:
    def __init__(self, address: str, secret: str, rank: int):
        host, port = address.rsplit(":", 1)
        self.address = (host, int(port))
        self.secret = secret
        self.rank = rank
        self.send_lock = threading.Lock()
        self.ctrl = self.connect("ctrl")
        self.ctrl_file = self.ctrl.makefile("rb")

    def connect(self, kind: str) -> socket.socket:
        sock = socket.create_connection(self.address, timeout=CONNECT_TIMEOUT)
        sock.settimeout(None)
        sock.sendall(f"{self.secret} {self.rank} {kind}\n".encode())
        return sock

    def send(self, line: str) -> None:
        with self.send_lock:
            self.ctrl.sendall(line.encode() + b"\n")

    def read(self) -> list[str] | None:
        """The next control line as words; None when the launcher is gone."""
        try:
            line = self.ctrl_file.readline()
        except OSError:
            line = b""
        return line.decode().split() if line else None


def pick_coordinator(channel: Channel) -> str:
    """A free port on this node, on the address that reaches the launcher:
    that interface is the one the other nodes can reach too."""
    ip = channel.ctrl.getsockname()[0]
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return f"{ip}:{s.getsockname()[1]}"


def child_env(coordinator: str, rank: int, error_file: str, lifeline: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (SECRET, CHANNEL)}
    env[contract.COORDINATOR_ADDRESS] = env[contract.JAX_COORDINATOR_ADDRESS] = coordinator
    if rank == 0:
        # Bind exactly the address we advertise, never all interfaces.
        env[contract.COORDINATOR_BIND_ADDRESS] = env[contract.JAX_COORDINATOR_BIND_ADDRESS] = coordinator
    env[contract.LOCAL_PROCESS_COUNT] = str(local_count_from_env())
    env[contract.ERROR_FILE] = error_file
    env[contract.LIFELINE_FD] = str(lifeline)
    return env


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "--" or len(argv) < 2:
        print("usage: python -m jaxrun.task -- COMMAND...", file=sys.stderr)
        return 2
    try:
        rank, count, local = identity_from_env()
    except BootstrapError as e:
        print(f"jaxrun task: {e}", file=sys.stderr)
        return 2
    child: list[subprocess.Popen] = []

    def forward(signum, _frame):
        if child:
            _killpg(child[0].pid, signum)
        elif signum != signal.SIGUSR1:
            os._exit(128 + signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        channel = Channel(os.environ[CHANNEL], os.environ[SECRET], rank)
        out, err = channel.connect("stdout"), channel.connect("stderr")
    except (KeyError, OSError) as e:
        print(f"jaxrun task {rank}: cannot reach the launcher's task channel: {e}", file=sys.stderr)
        return 1
    if rank == 0:
        channel.send(f"coordinator {pick_coordinator(channel)}")
    coordinator = wait_for_start(channel)
    if coordinator is None:
        return 1
    values = {"process_id": rank, "num_processes": count, "local_process_id": local, "coordinator": coordinator}
    command = [substitute(a, values) for a in argv[1:]]
    error_file = os.path.join(tempfile.mkdtemp(prefix="jaxrun-task-"), "error.json")
    lifeline_r, lifeline_w = os.pipe()
    try:
        child.append(subprocess.Popen(
            command, env=child_env(coordinator, rank, error_file, lifeline_r),
            stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            pass_fds=(lifeline_r,), start_new_session=True,
        ))
    except OSError as e:
        err.sendall(f"jaxrun task {rank}: cannot start {command[0]}: {e}\n".encode())
        channel.send("exit 127")
        return 127
    finally:
        os.close(lifeline_r)
        out.close()
        err.close()
    acked = threading.Event()
    threading.Thread(target=obey, args=(channel, child[0], acked), daemon=True).start()
    code = child[0].wait()
    _killpg(child[0].pid, signal.SIGKILL)  # grandchildren left in its group
    report_exit(channel, code, error_file)
    # Wait until the launcher has the code: once we exit, the scheduler kills
    # the other tasks, and their losses must not reach the launcher first.
    acked.wait(ACK_TIMEOUT)
    os.close(lifeline_w)
    return code if code >= 0 else 128 - code


def wait_for_start(channel: Channel) -> str | None:
    while True:
        words = channel.read()
        if words is None:
            return None
        if words[0] == "start":
            return words[1]
        if words[0] == "signal" and int(words[1]) != signal.SIGUSR1:
            os._exit(128 + int(words[1]))


def obey(channel: Channel, child: subprocess.Popen, acked: threading.Event) -> None:
    """Deliver the launcher's signals; a lost launcher means SIGKILL."""
    while True:
        words = channel.read()
        if words is None:
            _killpg(child.pid, signal.SIGKILL)
            break
        if words[0] == "signal":
            _killpg(child.pid, int(words[1]))
        elif words[0] == "ack":
            break
    acked.set()


def report_exit(channel: Channel, code: int, error_file: str) -> None:
    try:
        with open(error_file) as f:
            channel.send("error " + json.dumps(json.load(f)))
        os.unlink(error_file)
    except (OSError, ValueError):
        pass
    try:
        os.rmdir(os.path.dirname(error_file))
    except OSError:
        pass
    try:
        channel.send(f"exit {code}")
    except OSError:
        pass


def _killpg(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
