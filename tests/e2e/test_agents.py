"""The far-end agents driven directly over their real channels, as the backends drive them."""

import os
import socket
import subprocess
import sys
import time

import pytest

from jaxrun import contract
from jaxrun.wire import encoding, forkserver, ssh, tasks

pytestmark = pytest.mark.timeout(60)

# Records each signal it gets (by name) on stdout, then keeps running.
RECORDER = """
import signal, sys, time
def note(signum, frame):
    print(signal.Signals(signum).name, flush=True)
for s in (signal.SIGTERM, signal.SIGUSR2):
    signal.signal(s, note)
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def read_line(stream, within: float = 20.0) -> str:
    deadline = time.monotonic() + within
    line = stream.readline()
    assert time.monotonic() < deadline
    return line.decode().strip()


def test_ssh_agent_relays_signals_to_the_group_and_kills_it_at_eof():
    agent = subprocess.Popen(
        [sys.executable, "-m", contract.SSH_AGENT_MODULE, "--", sys.executable, "-c", RECORDER],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )
    try:
        assert read_line(agent.stdout) == "ready"
        for signum in (15, 12):  # SIGTERM, SIGUSR2: the agent must pass on each by name
            agent.stdin.write(ssh.Signal.of(signum).line())
            agent.stdin.flush()
            assert read_line(agent.stdout) == ssh.Signal.of(signum).name
        agent.stdin.write(b"a line from a newer launcher\n")  # ignored, not fatal
        agent.stdin.close()  # the connection dropped: the whole group dies
        assert agent.wait(timeout=20) == contract.exit_status(-9)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, 9)
            agent.wait()


def test_fork_server_forks_on_request_and_reports_the_exit(tmp_path):
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    server = subprocess.Popen(
        [sys.executable, "-m", contract.FORKSERVER_AGENT_MODULE, str(theirs.fileno())],
        pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, start_new_session=True,
    )
    theirs.close()
    script = tmp_path / "s.py"
    script.write_text("import os, sys\nprint('hello from', os.getpid(), sys.argv[1:])\nsys.exit(3)\n")
    out = os.open(tmp_path / "out", os.O_WRONLY | os.O_CREAT)
    err = os.open(tmp_path / "err", os.O_WRONLY | os.O_CREAT)
    lifeline_r, lifeline_w = os.pipe()
    try:
        # A child without a coordinator stops at the shim's bootstrap: enough to
        # see the server fork it with our fds and report its exit status.
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
        request = forkserver.ForkRequest(["--", str(script), "x y"], env)
        encoding.send_frame(ours, request.encode(), [out, err, lifeline_r])
        assert isinstance(encoding.decode(encoding.recv_frame(ours)[0]), forkserver.Ready)
        started = encoding.decode(encoding.recv_frame(ours)[0])
        assert isinstance(started, forkserver.Started) and started.pid > 0
        ours.settimeout(30)
        exited = encoding.decode(encoding.recv_frame(ours)[0])
        heard_at = time.time()
        assert (exited.pid, exited.returncode) == (started.pid, 1)
        # When the server reaped it, by this machine's clock: for the root cause.
        assert heard_at - 10 < exited.reaped_at <= heard_at, exited
        used = contract.Resources.from_dict(exited.resources)  # measured by the server as it reaped it
        assert used is not None and used.peak_rss_bytes > 1 << 20 and used.cpu_seconds > 0, exited
        assert f"{contract.COORDINATOR_ADDRESS} is not set" in (tmp_path / "err").read_text()
    finally:
        ours.close()  # EOF: the server exits
        for fd in (out, err, lifeline_r, lifeline_w):
            os.close(fd)
        try:
            server.wait(timeout=20)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, 9)
                server.wait()


# Marks its join as the shim does, between two lines of its own on stderr.
JOINS = """
import os, sys, time
from jaxrun import contract
path = os.environ[contract.JOINED_FILE]
print(os.path.dirname(path), flush=True)
sys.stderr.write("before\\n"); sys.stderr.flush()
contract.mark_joined(path)
time.sleep(1.0)
sys.stderr.write("after\\n"); sys.stderr.flush()
"""


def test_ssh_agent_reports_the_join_once_on_stderr_and_leaves_no_file():
    agent = subprocess.Popen(
        [sys.executable, "-m", contract.SSH_AGENT_MODULE, "--", sys.executable, "-c", JOINS],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )
    try:
        agent.wait(timeout=30)  # stdin stays open: its end would mean a dropped connection
        out, err = agent.stdout.read(), agent.stderr.read()
        agent.stdin.close()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, 9)
            agent.wait()
    assert agent.returncode == 0, err
    # The join, once, where it happened; last, what comes home (no record, the resources).
    assert err.startswith(b"before\n" + ssh.JOINED_MARKER + b"after\n" + ssh.HOME_REPORT_MARK), err
    error, used, facts = ssh.parse_home_report(err[len(b"before\n" + ssh.JOINED_MARKER + b"after\n"):])
    assert error is None and contract.Resources.from_dict(used).cpu_seconds > 0, err
    # The controller's own pid (not the agent's), and when its end was seen here.
    assert facts["pid"] != agent.pid and facts["clock"] == socket.gethostname(), facts
    assert time.time() - 30 < facts["reaped_at"] <= time.time(), facts
    folder = out.decode().strip()
    assert folder and not os.path.exists(folder)  # the agent's private folder, removed


# -- an SSH host's agent, with the launcher's end of its channels ----------------------

HOST_AGENT = """
import sys
from jaxrun.backends.ssh.host_agent import HostAgent
agent = HostAgent()
print(agent.start(), flush=True)
sys.stdin.read()  # the session's end
agent.stop()
"""


@pytest.fixture
def host_agent():
    """A host agent as the preflight session runs it; its socket's path.
    (A process of its own: it claims its descendants as their subreaper.)"""
    proc = subprocess.Popen([sys.executable, "-c", HOST_AGENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            start_new_session=True)
    try:
        yield proc, read_line(proc.stdout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()


def spawn(path: str, code: str, env: dict | None = None):
    from jaxrun.backends.ssh.children import ChannelChild

    spawn_line = ssh.Spawn([sys.executable, "-c", code], env or {}, os.getcwd(), "")
    return ChannelChild(path, spawn_line, os.getpid(), "here")


def test_host_agent_runs_a_process_over_three_channels(host_agent):
    from jaxrun.backends.ssh.connections import ping

    _, path = host_agent
    assert ping(path)
    child = spawn(path, "import os, sys\nprint('out', os.environ['SECRET_X'], sys.argv[1:], os.getpid(), flush=True)\n"
                        "print('to stderr', file=sys.stderr)\nsys.exit(3)", {"SECRET_X": "tok-123"})
    end = child.wait()
    assert (end.returncode, end.lost) == (3, None)
    words = child.stdout.read().split()
    assert words[:3] == [b"out", b"tok-123", b"[]"]
    # The controller's own pid, from the agent's Started line (the child's own
    # pid is the launcher's handle; no stream filter read the report home here).
    assert end.pid == int(words[3]) != child.pid
    err = child.stderr.read()
    assert err.startswith(b"to stderr\n")
    report = ssh.parse_home_report(err[err.index(ssh.HOME_REPORT_MARK):])  # the resources came home after it
    assert report is not None and report[1]["cpu_seconds"] > 0


def test_host_agent_relays_signals_and_kills_at_eof_and_at_its_end(host_agent):
    proc, path = host_agent
    first = spawn(path, RECORDER)
    assert read_line(first.stdout) == "ready"
    first.send(15)
    assert read_line(first.stdout) == "SIGTERM"
    first.send(9)  # SIGKILL, then EOF on the control channel
    assert first.wait().returncode == -9
    second = spawn(path, RECORDER)
    assert read_line(second.stdout) == "ready"
    proc.stdin.close()  # the session ends: the agent kills what still runs
    assert second.wait().returncode == -9
    assert proc.wait(timeout=20) == 0


def test_a_lost_host_agent_is_the_helper_end_not_the_controller(host_agent):
    """The agent dies (its host vanished): no Exit line ever comes, and the
    exit says the connection's end stood in for the controller's."""
    proc, path = host_agent
    child = spawn(path, "import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(60)")
    controller = int(read_line(child.stdout))
    os.killpg(proc.pid, 9)  # nothing is left to say how the controller ended
    os.kill(controller, 9)  # a plain script has no lifeline to end it with its agent
    end = child.wait()
    assert (end.returncode, end.lost, end.reaped_at) == (255, "the connection to here", None)


def test_host_agent_hangs_up_on_a_stranger(host_agent):
    _, path = host_agent
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)
        sock.connect(path)
        sock.sendall(b"GET / HTTP/1.0\n\n")
        assert sock.recv(64) == b""


# -- a scheduler's task agent, with the launcher's end of its task channel ----------------

class TaskLauncher:
    """The launcher's side of one task's three connections: each Hello with
    the secret is answered with an Ack, as the task channel does."""

    def __init__(self, secret: str):
        self.secret = secret
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(20)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"

    def accept(self) -> dict:
        streams = {}
        while len(streams) < 3:
            sock, _ = self.listener.accept()
            sock.settimeout(20)
            hello = encoding.decode(sock.makefile("rb").readline())
            assert isinstance(hello, tasks.TaskHello) and hello.secret == self.secret, hello
            sock.sendall(tasks.Ack().line())
            streams[hello.kind] = sock
        return streams


def test_task_agent_forwards_the_schedulers_signals_and_the_launchers_then_waits_for_the_ack():
    launcher = TaskLauncher("s3cret")
    env = dict(os.environ, **{contract.TASK_CHANNEL: launcher.address, contract.TASK_SECRET: launcher.secret,
                              contract.PROCESS_ID: "0", contract.NUM_PROCESSES: "1",
                              contract.LOCAL_PROCESS_ID: "0"})
    env.pop(contract.RANK_SOURCE, None)
    agent = subprocess.Popen([sys.executable, "-m", contract.SCHEDULER_AGENT_MODULE, "--", sys.executable, "-c",
                              RECORDER], env=env, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        streams = launcher.accept()
        control = streams[tasks.CONTROL].makefile("rb")
        coordinator = encoding.decode(control.readline())  # task 0 picks it
        assert isinstance(coordinator, tasks.Coordinator), coordinator
        streams[tasks.CONTROL].sendall(tasks.Start(coordinator.address).line())
        out = streams[tasks.STDOUT].makefile("rb")
        assert read_line(out) == "ready"
        agent.send_signal(15)  # as the scheduler signals its task: the child's to get
        assert read_line(out) == "SIGTERM"
        streams[tasks.CONTROL].sendall(tasks.Signal.of(12).line())  # the launcher's
        assert read_line(out) == "SIGUSR2"
        streams[tasks.CONTROL].sendall(tasks.Signal.of(9).line())
        exited = encoding.decode(control.readline())
        assert isinstance(exited, tasks.Exit) and exited.returncode == -9, exited
        assert contract.Resources.from_dict(exited.resources) is not None, exited
        time.sleep(0.3)
        assert agent.poll() is None  # it waits for the launcher to have the code
        streams[tasks.CONTROL].sendall(tasks.Ack().line())
        assert agent.wait(timeout=20) == contract.exit_status(-9)
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, 9)
            agent.wait()
        launcher.listener.close()
