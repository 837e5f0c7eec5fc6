"""The SSH preflight's far end, run on this machine as ssh would run it (the
stub, the environment on stdin), and read by the launcher's own code."""

from __future__ import annotations

import ast
import io
import os
import platform
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import jaxrun
from jaxrun import __version__
from jaxrun.backends.ssh import commands, preflight as checks
from jaxrun.backends.ssh.connections import Connections, ping, read_answer, read_reply
from jaxrun.backends.ssh.options import SshOptions
from jaxrun.core.spec import Host
from jaxrun.wire import preflight, ssh, tasks
from jaxrun.wire.preflight import PreflightKey as Key

ROOT = str(Path(jaxrun.__file__).parent.parent)
WAIT = 60  # for the far end's answer: an interpreter start on a loaded machine
# As sshd sets it: the client's address and port, then the server's.
SSH_CONNECTION = "127.0.0.1 50000 127.0.0.1 22"


def start(words: list[str], env: dict, cwd, python=(sys.executable,)) -> subprocess.Popen:
    """The words ssh would hand to the host's shell, run here with the
    environment frame first on stdin, as the launcher sends it."""
    assert words[:2] == ["/opt/py", "-c"]
    proc = subprocess.Popen([*python, *words[1:]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=cwd,
                            start_new_session=True, bufsize=0)
    proc.stdin.write(ssh.env_frame(env))
    return proc


def answer_of(proc: subprocess.Popen) -> dict:
    answers: dict[str, bytes] = {}
    read_answer(proc.stdout, answers, "here")
    return preflight.parse_preflight_answer(answers["here"])


def settings(tmp_path, **kw) -> SshOptions:
    return SshOptions(python="/opt/py", chdir=str(tmp_path), **kw)


@pytest.fixture
def far_end(tmp_path):
    """The preflight of one host that holds the coordinator's port, with
    its answer; it ends at EOF."""
    (tmp_path / "main.py").write_text("")
    words = commands.preflight_words(settings(tmp_path, script="main.py"), hold=True)
    proc = start(words, {"PYTHONPATH": ROOT, "SSH_CONNECTION": SSH_CONNECTION}, "/")
    try:
        yield proc, answer_of(proc)
    finally:
        proc.stdin.close()
        try:
            assert proc.wait(WAIT) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            proc.stdout.close()


def test_what_this_host_has_passes_the_launchers_checks(far_end):
    _, info = far_end
    assert commands.check_preflight({"here": info}, "/opt/py") == []
    assert info[Key.JAXRUN] == __version__ and info[Key.PYTHON] == platform.python_version()
    assert info[Key.JAX] == metadata.version("jax") and info[Key.JAXLIB] == metadata.version("jaxlib")
    assert info[Key.ADDRESS] == "127.0.0.1" and isinstance(info[Key.PORT], int)
    assert info[Key.MACHINE].startswith(platform.node()) and isinstance(info[Key.RSYNC], bool)
    assert Key.CHDIR_ERROR not in info and Key.SCRIPT_MISSING not in info and Key.CHANNELS_ERROR not in info
    table = commands.preflight_table({"here": info})
    assert table[1].split() == ["jaxrun:", "here", "127.0.0.1", platform.python_version(),
                                metadata.version("jax"), metadata.version("jaxlib"), __version__]


def test_the_session_is_the_host_agent(far_end):
    proc, info = far_end
    assert ping(info[Key.CHANNELS])  # the launcher's own check, over the agent's socket
    with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
        title = b" ".join(w for w in f.read().split(b"\0") if w).decode().split()
    pytest.importorskip("setproctitle")
    assert title[1:3] == ["-m", "jaxrun.backends.ssh.host_agent"]


def test_the_launchers_requests_are_answered(far_end, tmp_path):
    proc, info = far_end
    with Connections(settings(tmp_path), [Host("here")]) as connections:
        connections.masters["here"] = proc  # what ssh's master would be: a pipe each way
        connections.results["here"] = dict(info)
        # The port held since the answer is the coordinator's; nobody else to reach it.
        assert connections.choose_coordinator(None) == (f"127.0.0.1:{info[Key.PORT]}",) * 2
        assert Key.PORT not in connections.results["here"]  # taken: a restart asks again
        listening = connections.ask({"here": preflight.Listen("127.0.0.1", 0)}, WAIT)["here"]
        assert isinstance(listening, preflight.Listening)
        with socket.create_connection(("127.0.0.1", listening.port), timeout=WAIT):
            pass  # held until the next request
        # That request lets it go first: nothing listens there any more.
        refused = connections.ask({"here": preflight.Connect("127.0.0.1", listening.port, 5.0)}, WAIT)["here"]
        assert isinstance(refused, preflight.Failed) and "refused" in refused.reason.lower()
        with socket.create_server(("127.0.0.1", 0)) as server:
            reached = connections.ask({"here": preflight.Connect("127.0.0.1", server.getsockname()[1], 5.0)}, WAIT)
        assert reached == {"here": preflight.Reached()}
        assert connections.ask({"here": tasks.Ack()}, WAIT) == {"here": preflight.Failed("unknown request 'ack'")}
        connections.tell("here", preflight.Unlisten())  # its reply is skipped by the next ask
        assert connections.ask({"here": preflight.Unlisten()}, WAIT) == {"here": preflight.Closed()}
        connections.masters.clear()  # the fixture ends it


def test_every_request_is_answered_in_order():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        lines = [preflight.Listen("127.0.0.1", 0), preflight.Connect("127.0.0.1", port, 5.0), preflight.Unlisten(),
                 preflight.Listen("no such address", 0), tasks.Ack()]
        out = io.BytesIO()
        checks.serve(io.BytesIO(b"".join(m.line() for m in lines) + b"nonsense\n"), out)
    replies = [read_reply(line) for line in out.getvalue().splitlines(keepends=True)]
    assert all(line.startswith(preflight.PREFLIGHT_REPLY) for line in out.getvalue().splitlines())
    assert isinstance(replies[0], preflight.Listening) and replies[0].port > 0
    assert replies[1:3] == [preflight.Reached(), preflight.Closed()]
    assert isinstance(replies[3], preflight.Failed) and replies[3].reason
    assert replies[4:] == [preflight.Failed("unknown request 'ack'"), preflight.Failed("unknown message 'nonsense'")]


def test_a_missing_folder_or_script_is_named_and_sync_checks_neither(tmp_path):
    missing = tmp_path / "gone"
    found = {}
    checks.enter_folder(str(missing), "main.py", found)
    assert found == {Key.CHDIR_ERROR: f"cannot change to {str(missing)!r}: No such file or directory"}
    here = os.getcwd()
    try:
        checks.enter_folder(str(tmp_path), "main.py", found)
    finally:
        os.chdir(here)
    assert found[Key.SCRIPT_MISSING] == str(tmp_path / "main.py")
    args = checks.parse_args(commands.preflight_words(settings(missing, script="main.py", sync=True))[5:])
    assert args.sync and args.chdir == str(missing) and args.script == "main.py"


def run_stub(tmp_path, env: dict, python=(sys.executable,)) -> tuple[dict, int]:
    """The preflight's stub where it cannot run the module: its one answer,
    and its exit status (it ends by itself)."""
    proc = start(commands.preflight_words(settings(tmp_path), hold=True), env, tmp_path, python)
    try:
        info = answer_of(proc)
        return info, proc.wait(WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def test_a_host_without_jaxrun_is_one_clear_line(tmp_path):
    info, code = run_stub(tmp_path, {}, (sys.executable, "-S", "-E"))  # no site-packages, no PYTHONPATH: no jaxrun
    assert code == 0
    assert info == {Key.PYTHON: platform.python_version(), Key.EXECUTABLE: sys.executable, Key.JAXRUN: None,
                    Key.JAXRUN_ERROR: "ModuleNotFoundError: No module named 'jaxrun'"}
    good = {**info, Key.JAX: "0.10.2", Key.JAXLIB: "0.10.2", Key.JAXRUN: __version__}
    assert commands.check_preflight({"a": good, "b": info}, "/opt/py") == [
        "b: cannot import jaxrun with /opt/py (ModuleNotFoundError: No module named 'jaxrun')"]


def test_a_host_with_another_jaxrun_is_refused_by_version(tmp_path):
    other = tmp_path / "other" / "jaxrun"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text('__version__ = "9.9"\n')
    info, code = run_stub(tmp_path, {"PYTHONPATH": str(other.parent)})
    assert code == 0
    assert info == {Key.PYTHON: platform.python_version(), Key.EXECUTABLE: sys.executable, Key.JAXRUN: "9.9"}
    assert commands.check_preflight({"b": info}, "/opt/py") == [f"b: jaxrun 9.9 there, {__version__} here"]


def test_a_jaxrun_that_breaks_on_import_says_why(tmp_path):
    broken = tmp_path / "broken" / "jaxrun"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text('raise RuntimeError("half installed")\n')
    info, _ = run_stub(tmp_path, {"PYTHONPATH": str(broken.parent)})
    assert info[Key.JAXRUN] is None and info[Key.JAXRUN_ERROR] == "RuntimeError: half installed"


def test_the_far_end_imports_only_what_a_host_has():
    """The standard library, the contract and the wire: never launcher code."""
    tree = ast.parse(Path(checks.__file__).read_text())
    ours = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            ours.update(a.name for a in node.names if a.name.split(".")[0] == "jaxrun")
        elif isinstance(node, ast.ImportFrom) and node.module == "jaxrun":
            ours.update(f"jaxrun.{a.name}" for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.level or node.module.split(".")[0] == "jaxrun"):
            ours.add("." * node.level + (node.module or ""))
    assert {m for m in ours if not m.startswith("jaxrun.wire.")} <= {"jaxrun", "jaxrun.contract", "jaxrun.wire"}, ours
