"""The portable paths, proved on Linux: every Linux-only facility turned off.

``JAXRUN_PORTABLE=1`` makes ``jaxrun.portable`` answer "no" for each of them
(no subreaper, no inotify, no pipe resizing, no per-thread priority, no
abstract sockets, no peer credentials, no /proc), as a Mac would.  These
tests run the key local behaviours that way, through the preloading server
(the default) unless they say otherwise: a launch, fail-fast, signals, no
process left behind (a setsid daemon and a SIGKILLed jaxrun included),
byte-exact logs, the console following a quiet process by polling, and an
SSH host's preloading server on a socket file.  The leak guard
(``fixtures.jobs``) checks every test for processes left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from fixtures.jobs import ROOT, still_running, wait_gone

from jaxrun import contract

pytestmark = pytest.mark.timeout(60)

NOTES = (
    "jaxrun: no subreaper on this system",
    "jaxrun: no inotify on this system",
    "jaxrun: no per-thread priority on this system",
    "jaxrun: pipes cannot be enlarged on this system",
)


@pytest.fixture(autouse=True)
def portable_mode(monkeypatch):
    """jaxrun, and everything it starts, takes the portable paths."""
    monkeypatch.setenv(contract.PORTABLE, "1")
    monkeypatch.delenv(contract.NO_PRELOAD, raising=False)


def wait_for(predicate, within: float) -> bool:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_launch_through_the_preloading_server_says_what_it_goes_without(start_job, tmp_path):
    script = tmp_path / "who.py"
    script.write_text(
        "import os, psutil, sys\n"
        "parent = ' '.join(psutil.Process().parent().cmdline())\n"
        "print('rank', os.environ['JAXRUN_PROCESS_ID'], 'of', os.environ['JAXRUN_NUM_PROCESSES'],\n"
        "      'forked' if 'forkserver.server' in parent else 'fresh', sys.argv[1:])\n"
    )
    job = start_job("-v", "-n", 3, script, "a b", "{process_id}")
    assert job.wait(timeout=60) == 0, job.stderr
    for rank in range(3):
        assert f"[{rank}] rank {rank} of 3 forked ['a b', '{rank}']" in job.stdout, job.stdout
    for note in NOTES:  # each said once, under -v
        assert job.stderr.count(note) == 1, job.stderr


def test_without_v_nothing_is_said(start_job, tmp_path):
    script = tmp_path / "quiet.py"
    script.write_text("print('ok')\n")
    job = start_job("-n", 1, "--no-preload", script)
    assert job.wait(timeout=60) == 0, job.stderr
    assert not any(note in job.stderr for note in NOTES), job.stderr


def test_fail_fast(start_job, tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['JAXRUN_PROCESS_ID'] == '1':\n"
        "    time.sleep(0.5)\n"
        "    sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    start = time.monotonic()
    job = start_job("-n", 3, script)
    assert job.wait(timeout=40) == 3, job.stderr
    # 2 s here, start-up included; without fail-fast the others sleep 60 s.
    assert time.monotonic() - start < 20
    assert "process 1 failed first" in job.stderr, job.stderr


def ready_job(start_job, tmp_path, body: str, n: int = 2, *args):
    """A job whose processes each mark a file ``ready-RANK`` and then run ``body``."""
    script = tmp_path / "job.py"
    script.write_text(
        "import os, subprocess, sys, time\n"
        "rank = os.environ['JAXRUN_PROCESS_ID']\n"
        f"state = {str(tmp_path)!r}\n"
        + body +
        "open(os.path.join(state, 'ready-' + rank), 'w').close()\n"
        "time.sleep(60)\n"
    )
    job = start_job("-n", n, *args, script)
    assert wait_for(lambda: all((tmp_path / f"ready-{r}").exists() for r in range(n)), 30), job.proc.poll()
    return job


def test_sigterm_reaches_every_process(start_job, tmp_path, no_leftover_processes):
    job = ready_job(start_job, tmp_path, "", 2, "--grace", "2")
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(timeout=30) == 143, job.stderr
    assert "jaxrun: received SIGTERM; stopped every process" in job.stderr
    assert wait_gone(no_leftover_processes, within=1.0) == []


def test_sigkill_to_jaxrun_leaves_no_child_or_grandchild(start_job, tmp_path, no_leftover_processes):
    body = ("child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
            "open(os.path.join(state, 'grandchild-' + rank), 'w').write(str(child.pid))\n")
    job = ready_job(start_job, tmp_path, body)
    grandchildren = [int((tmp_path / f"grandchild-{r}").read_text()) for r in range(2)]
    job.proc.kill()
    job.proc.wait()
    assert wait_gone(no_leftover_processes, within=5.0) == []
    assert not still_running(grandchildren, no_leftover_processes)


# A daemon: its own session, its parent gone at once (a double fork), so
# without a subreaper it is init's, out of jaxrun's tree.
DAEMON = """\
import os, sys, time
path = sys.argv[1] + "." + os.environ["JAXRUN_PROCESS_ID"]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(path + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.rename(path + ".tmp", path)
        time.sleep(300)
    os._exit(0)
os.wait()
while not os.path.exists(path):
    time.sleep(0.01)
"""


@pytest.mark.parametrize("mode", ["preload", "no-preload"])
def test_setsid_daemons_do_not_survive(start_job, tmp_path, mode):
    script = tmp_path / "daemon.py"
    script.write_text(DAEMON)
    job = start_job("-n", 2, *(["--no-preload"] if mode == "no-preload" else []), script, tmp_path / "daemon")
    assert job.wait(timeout=40) == 0, job.stderr
    pids = [int((tmp_path / f"daemon.{rank}").read_text()) for rank in range(2)]
    alive = still_running(pids)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    assert not alive, f"daemons outlived jaxrun: {alive}"


def test_logs_hold_every_byte(start_job, tmp_path):
    script = tmp_path / "bytes.py"
    script.write_text(
        "import os\n"
        "os.write(1, b'line one\\n\\xff\\xfe not utf8\\nno newline at end')\n"
        "os.write(2, b'err \\x80\\n partial err')\n"
    )
    job = start_job("-n", 2, "--log-dir", tmp_path / "logs", script)
    assert job.wait(timeout=60) == 0, job.stderr
    for rank in range(2):
        assert (tmp_path / "logs" / f"process-{rank}.stdout").read_bytes() == \
            b"line one\n\xff\xfe not utf8\nno newline at end"
        assert (tmp_path / "logs" / f"process-{rank}.stderr").read_bytes() == b"err \x80\n partial err"
    assert "[0] no newline at end" in job.stdout and "[1]  partial err" in job.stderr


def inotify_descriptors(pid: int) -> list[str]:
    found = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify":
                found.append(fd)
        except OSError:
            pass
    return found


def test_the_console_follows_a_quiet_process_by_polling(start_job, tmp_path):
    """A line shows while its process still runs (it waits for the test to
    have seen it), and jaxrun holds no inotify descriptor meanwhile."""
    script = tmp_path / "quiet.py"
    go = tmp_path / "go"
    script.write_text(
        "import os, time\n"
        "print('first', flush=True)\n"
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
        "print('second')\n"
    )
    job = start_job("-n", 1, script)
    seen = threading.Event()

    def read():
        for line in job.proc.stdout:
            if line.startswith(b"[0] first"):
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert seen.wait(30), "the first line never showed while the process ran"
    assert job.proc.poll() is None
    # The process is quiet now: where inotify is used, the pump arms it within
    # a round or two (0.1 s each).
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert inotify_descriptors(job.proc.pid) == [], "jaxrun watches the files with inotify"
        time.sleep(0.05)
    go.write_text("")
    assert job.wait(timeout=30) == 0, job.stderr
    assert "[0] second" in job.stdout


def test_an_ssh_hosts_preloading_server_serves_its_agents_on_a_socket_file(tmp_path):
    """What runs on an SSH host, without sshd: the host's server listens on a
    socket file in a private folder, and an agent's controller is forked by
    it (and ends with its exit code)."""
    name = f"jaxrun-test-{uuid.uuid4().hex}"
    folder = os.path.join(os.environ["TMPDIR"], f"jaxrun-sockets-{os.getuid()}")  # the leak guard's TMPDIR
    server = subprocess.Popen([sys.executable, "-m", contract.FORKSERVER_AGENT_MODULE, "--listen"],
                              env={**os.environ, contract.FORKSERVER_NAME: name},  # never on a command line
                              stdin=subprocess.PIPE, start_new_session=True)
    script = tmp_path / "served.py"
    script.write_text(
        "import psutil, sys\n"
        "print('parent', ' '.join(psutil.Process().parent().cmdline()))\n"
        "sys.exit(5)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAXRUN_COORDINATOR_ADDRESS="127.0.0.1:1",
               JAXRUN_NUM_PROCESSES="1", JAXRUN_PROCESS_ID="0", JAXRUN_LOCAL_PROCESS_ID="0",
               JAXRUN_LOCAL_PROCESS_COUNT="1", **{contract.FORKSERVER_NAME: name})
    try:
        # (Its stdin stays open: EOF there is the connection dropping.)
        agent = subprocess.Popen(
            [sys.executable, "-m", contract.SSH_AGENT_MODULE, "--",
             sys.executable, "-m", contract.SHIM_MODULE, "--", str(script)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out = agent.stdout.read().decode()
        err = agent.stderr.read().decode()
        assert agent.wait(timeout=40) == 5, err[-2000:]
        agent.stdin.close()
        assert "-m jaxrun.backends.forkserver.server" in out and name not in out, out
        sockets = os.listdir(folder)  # the user's private folder, not the open temporary one
        assert len(sockets) == 1 and sockets[0].endswith(".sock"), sockets
        assert os.stat(folder).st_mode & 0o777 == 0o700
    finally:
        server.stdin.close()  # the session's end ends the server
        try:
            server.wait(timeout=20)
        finally:
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
    assert not os.listdir(folder), "the server left its socket file behind"
