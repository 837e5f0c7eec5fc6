"""``jaxrun -i``: a console over every process, driven through a real
pseudo-terminal (pexpect), locally and over SSH on the namespaced hosts.

One local session serves the tests in order: the guide's toy typed line by
line, identical output, an exception in one process, Ctrl-C in a long
statement, and last Ctrl-D, which ends it.  Each test sets up what it uses
(the session starts with ``import jax`` done), so that it passes alone or in
another order; a test that finds the session ended (by Ctrl-D's test) gets a
new one.  Sessions run outside the per-test leak guard, so each carries a
token of its own and checks it itself.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pexpect
import pytest
from fixtures.jobs import EXAMPLES, JAXRUN, ROOT, TOKEN, wait_gone

PROMPT = ">>> "
MORE = "... "
RESULT = "got result: -0.12398731708526611"
# The seconds a session may take to its first prompt (jax imported), which a
# test of the shared session spends when it is the first to ask (alone, say).
SESSION = 60


def toy_lines() -> list[str]:
    """examples/toy.py as a person types it: no docstring or comments, and an
    empty line after the indented block, as Python's console needs."""
    source = (EXAMPLES / "toy.py").read_text()
    body = source.split('"""', 2)[2]
    lines = [line for line in body.splitlines() if line.strip() and not line.startswith("#")]
    typed = []
    for line, after in zip(lines, lines[1:] + [""]):
        typed.append(line)
        if line.startswith(" ") and not after.startswith(" "):
            typed.append("")
    return typed


class Console:
    """A jaxrun -i in a pseudo-terminal."""

    def __init__(self, args, env, cwd=ROOT):
        self.child = pexpect.spawn(sys.executable, ["-m", "jaxrun", *map(str, args)], env=env, cwd=str(cwd),
                                   encoding="utf-8", timeout=60, dimensions=(50, 300))
        self.started = time.monotonic()

    def first_prompt(self, within: float = 60) -> str:
        self.child.expect_exact(PROMPT, timeout=within)
        return self.child.before

    def type(self, line: str, expect: str = PROMPT, within: float = 60) -> str:
        """Type one line; what came back before the next prompt (the echo and output)."""
        self.child.sendline(line)
        self.child.expect_exact(expect, timeout=within)
        return self.child.before.replace("\r\n", "\n")

    def run(self, lines: list[str], within: float = 60) -> str:
        seen = ""
        for line, after in zip(lines, lines[1:] + [None]):
            block = line.startswith(" ") or line.endswith(":") or (after or "").startswith(" ")
            seen += self.type(line, MORE if block and after is not None else PROMPT, within)
        return seen

    def end(self, within: float = 30) -> int:
        self.child.sendeof()
        self.child.expect(pexpect.EOF, timeout=within)
        self.child.close()
        return self.child.exitstatus

    def kill(self) -> None:
        if self.child.isalive():
            self.child.terminate(force=True)


def guarded(token: str) -> None:
    leftover = wait_gone(token, within=5.0)
    for proc in leftover:
        proc.kill()
    assert not leftover, f"processes outlived the session: {leftover}"


def local_session(tmp_path_factory, started: list[Console]) -> Console:
    """A session of 4 processes at its prompt, jax imported in each."""
    token = uuid.uuid4().hex
    state, logs = tmp_path_factory.mktemp("state"), tmp_path_factory.mktemp("logs") / "run"
    env = {**os.environ, TOKEN: token, "XDG_STATE_HOME": str(state), "TERM": "xterm"}
    session = Console(["-n", "4", "--cpu-devices", "2", "--log-dir", logs, "-i"], env)
    started.append(session)
    session.state, session.logs = state, logs
    session.first_prompt(within=SESSION)
    session.prompted = time.monotonic() - session.started
    seen = session.type("import jax", within=SESSION)
    assert "Error" not in seen, seen
    return session


@pytest.fixture(scope="module")
def sessions(tmp_path_factory):
    """The module's session: started by the first test that asks, and again
    only for a test that comes after one that ended it."""
    started: list[Console] = []

    def current() -> Console:
        if not started or not started[-1].child.isalive():
            local_session(tmp_path_factory, started)
        return started[-1]

    try:
        yield current
    finally:
        for session in started:
            session.kill()
        for session in started:
            guarded(session.child.env[TOKEN])


@pytest.fixture
def console(sessions) -> Console:
    return sessions()


@pytest.mark.timeout(90)
def test_the_toy_typed_line_by_line_gives_its_result(console):
    seen = console.run(toy_lines())
    for rank in range(4):
        assert f"[{rank}] process={rank} {RESULT}" in seen, seen
    assert "[0] device cpu:0 has local data [[0 1 2 3]]" in seen
    assert "[3] device cpu:6145 has local data [[28 29 30 31]]" in seen
    assert "Traceback" not in seen


@pytest.mark.timeout(SESSION + 30)
def test_identical_output_appears_once_with_the_ranks(console):
    seen = console.type("print('the same', jax.process_count())")
    assert re.findall(r"^.*the same 4$", seen, re.M) == ["[0-3] the same 4"]
    seen = console.type("jax.process_index() * 10")  # a value, as Python's console shows it
    assert [line for line in seen.splitlines()[1:]] == ["[0] 0", "[1] 10", "[2] 20", "[3] 30"]


@pytest.mark.timeout(SESSION + 30)
def test_an_exception_in_one_process_is_named_and_the_session_goes_on(console):
    seen = console.run(["if jax.process_index() == 2:", "    raise ValueError('only in two')", ""])
    assert "[2] ValueError: only in two" in seen and "[2] Traceback (most recent call last):" in seen
    assert not re.search(r"^\[[013]", seen, re.M), seen
    assert console.type("print('after', jax.process_count())").count("[0-3] after 4") == 1


@pytest.mark.timeout(SESSION + 30)
def test_ctrl_c_interrupts_a_long_statement_everywhere_and_returns_to_the_prompt(console):
    console.child.sendline("import time; time.sleep(120)")
    time.sleep(1.5)
    interrupted = time.monotonic()
    console.child.sendintr()
    console.child.expect_exact(PROMPT, timeout=10)
    took = time.monotonic() - interrupted
    assert "[0-3] KeyboardInterrupt" in console.child.before, console.child.before
    # 0.1-0.2 s here (Ctrl-C to 4 processes, their results merged, a prompt);
    # a session that lost it would sit in time.sleep(120).  5 s holds a
    # loaded 2-core machine.
    assert took < 5, took
    assert "[0-3] still 4" in console.type("print('still', jax.process_count())")


@pytest.mark.timeout(SESSION + 30)
def test_an_empty_line_or_a_comment_at_the_prompt_does_nothing(console):
    """As at Python's own prompt: no output, no error, the prompt again."""
    for line in ("", "   ", "# only a note"):
        assert console.type(line).strip() == line.strip()  # the echo, nothing more
    assert "[0-3] 4" in console.type("print(jax.process_count())")  # the session goes on


@pytest.mark.timeout(SESSION + 60)
def test_ctrl_d_exits_0_and_leaves_no_process_and_the_logs_and_history_hold_the_session(console):
    assert "[0-3] last 4" in console.type("print('last', jax.process_count())")
    assert "[1] ZeroDivisionError" in console.type("1 / (jax.process_index() - 1)")
    code = console.end()
    assert code == 0
    guarded(console.child.env[TOKEN])
    for rank in range(4):
        log = (console.logs / f"process-{rank}.stdout").read_text()
        assert ">>> print('last', jax.process_count())" in log and "last 4" in log
    errors = (console.logs / "process-1.stderr").read_text()  # the process's own text, no console prefix
    assert "ZeroDivisionError" in errors and "[1] Traceback" not in errors, errors
    history = (console.state / "jaxrun" / "history").read_text()
    assert "print('last', jax.process_count())" in history and "import jax" in history
    print(f"first prompt after {console.prompted:.2f} s")


@pytest.mark.timeout(60)
def test_a_process_that_dies_ends_the_session_with_the_usual_summary(tmp_path):
    session = Console(["-n", "2", "--cpu-devices", "1", "--log-dir", tmp_path / "logs", "-i"],
                      {**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    try:
        session.first_prompt()
        session.child.sendline("import os, time, jax; os._exit(7) if jax.process_index() == 1 else time.sleep(60)")
        session.child.expect(pexpect.EOF, timeout=30)
        session.child.close()
        out = session.child.before.replace("\r\n", "\n")
        assert session.child.exitstatus == 7, out
        assert re.search(r"^jaxrun: process 1 failed first: exit code 7", out, re.M), out
        assert re.search(r"^jaxrun: process 0 stopped by jaxrun$", out, re.M), out
        assert not out.rstrip().endswith(PROMPT.rstrip()), out  # no prompt after the summary
    finally:
        session.kill()


@pytest.mark.timeout(90)
def test_the_console_over_ssh_on_two_hosts(sshd_hosts, tmp_path):
    (first, _), (second, _) = sshd_hosts.addresses.items()
    hosts = tmp_path / "hosts.txt"
    hosts.write_text(f"{first} slots=2\n{second} slots=2\n")
    flags = ["--ssh-config", sshd_hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN]
    session = Console(["--hosts", hosts, *flags, "--cpu-devices", "2", "--log-dir", tmp_path / "logs", "-i"],
                      {**os.environ, "XDG_STATE_HOME": str(tmp_path)})
    try:
        session.first_prompt()
        seen = session.run(toy_lines())
        for rank in range(4):
            assert f"[{rank}] process={rank} {RESULT}" in seen, seen
        assert "[0-3] 4" in session.type("print(jax.process_count())")
        seen = session.type("import socket; socket.gethostname()")  # each host's own name
        assert "[0-1] 'node-a'" in seen and "[2-3] 'node-b'" in seen, seen
        seen = session.type("1 / (jax.process_index() - 3)")
        assert "[3] ZeroDivisionError: division by zero" in seen
        session.child.sendline("import time; time.sleep(120)")
        time.sleep(1.5)
        session.child.sendintr()
        session.child.expect_exact(PROMPT, timeout=10)
        assert "[0-3] KeyboardInterrupt" in session.child.before
        assert session.end() == 0
    finally:
        session.kill()
    assert Path(tmp_path / "jaxrun" / "history").exists()


# -- the same session over the engines, through the kernel's pipe frontend ----------------
ENGINES = {
    "slurm": ("slurm_cluster", "srun", lambda _: ["--launcher", "slurm"], {}),
    "mpirun": (None, "mpirun", lambda _: ["--launcher", "mpirun"], {"OMPI_MCA_rmaps_base_oversubscribe": "1"}),
    "ray": ("ray_cluster", None, lambda cluster: ["--launcher", "ray", "--ray-address", cluster.address],
            {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}),
}


def ask(job, code: str) -> tuple:
    """Every process's ``Result`` of one statement, through the pipe frontend."""
    from jaxrun.wire import console, encoding  # the module's ``console`` is its fixture

    job.stdin.write(console.Execute(code, console.SINGLE).line())
    job.stdin.flush()
    line = job.stdout.readline()
    assert line, job.stderr.read().decode(errors="replace")
    return encoding.decode(line).results


@pytest.mark.timeout(90)
@pytest.mark.parametrize("name", ENGINES)
def test_a_session_over_each_engine(request, name, tmp_path):
    fixture, program, flags, env = ENGINES[name]
    if program and not shutil.which(program):
        pytest.skip(f"{program} is not installed")
    engine = request.getfixturevalue(fixture) if fixture else None
    job = subprocess.Popen([*JAXRUN, *flags(engine), "-n", "2", "--cpu-devices", "1", "--log-dir", tmp_path / "logs",
                            "--kernel-pipe"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env={**os.environ, **env}, start_new_session=True)
    try:
        from jaxrun.wire import console, encoding

        assert encoding.decode(job.stdout.readline()) == console.SessionReady()
        results = ask(job, "import jax, os; print(jax.process_count(), os.environ['JAXRUN_PROCESS_ID'])")
        assert [r.out for r in results] == ["2 0\n", "2 1\n"]
        threading.Timer(1.5, job.send_signal, (signal.SIGINT,)).start()  # what the kernel's interrupt does
        results = ask(job, "import time; time.sleep(120)")
        assert [r.error_name for r in results] == ["KeyboardInterrupt"] * 2
        job.stdin.close()
        assert job.wait(30) == 0, job.stderr.read().decode(errors="replace")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


@pytest.mark.timeout(60)
def test_a_script_named_kernel_still_runs(jaxrun, tmp_path):
    (tmp_path / "kernel").write_text("print('a script named kernel')\n")
    code, out, err = jaxrun("kernel", cwd=tmp_path)
    assert code == 0 and "[0] a script named kernel" in out, err
