"""Shared test helpers: run the real jaxrun binary, and prove nothing outlives a test.

Every test gets a unique ``JAXRUN_TEST_TOKEN`` in its environment, which every
process it starts inherits.  After the test, any process still carrying that
token is a leak: it is killed and the test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
JAXRUN = [sys.executable, "-m", "jaxrun"]
TOKEN = "JAXRUN_TEST_TOKEN"

pytest_plugins = []


def processes_with_token(token: str) -> list[psutil.Process]:
    found = []
    me = os.getpid()
    for proc in psutil.process_iter(["pid"]):
        if proc.pid == me:
            continue
        try:
            if proc.environ().get(TOKEN) == token:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            pass
    return found


def is_running(proc: psutil.Process) -> bool:
    """Alive and not a zombie; a process may vanish between listing and asking."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def wait_gone(token: str, within: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within
    while True:
        alive = [p for p in processes_with_token(token) if is_running(p)]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


@pytest.fixture(autouse=True)
def no_leftover_processes(monkeypatch, tmp_path_factory):
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN, token)
    # jaxrun's default log folder is $TMPDIR/jaxrun-logs/RUN_ID: without this,
    # every run without --log-dir would leave a folder in the machine's shared
    # temporary directory.  Children (and the preload server) inherit TMPDIR;
    # tempfile.tempdir covers the code that runs inside pytest itself.
    tmpdir = str(tmp_path_factory.mktemp("tmpdir"))
    monkeypatch.setenv("TMPDIR", tmpdir)
    monkeypatch.setattr(tempfile, "tempdir", tmpdir)
    # jaxrun groups output and annotates when it runs on GitHub Actions; the
    # tests that want that set it themselves.
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    yield token
    alive = wait_gone(token, within=5.0)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    assert not alive, f"processes outlived the test: {[describe(p) for p in alive]}"


def describe(proc: psutil.Process) -> tuple:
    try:
        return proc.pid, proc.cmdline()
    except psutil.Error:
        return proc.pid, "(gone)"


class Launch:
    """A jaxrun started in the background, killed with its group if the test fails."""

    def __init__(self, args, cwd=None, env=None, **kw):
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(
            JAXRUN + [str(a) for a in args],
            cwd=cwd,
            env=full_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            **kw,
        )
        self.stdout = self.stderr = ""

    def wait(self, timeout=120) -> int:
        out, err = self.proc.communicate(timeout=timeout)
        self.stdout, self.stderr = out.decode(errors="replace"), err.decode(errors="replace")
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


@pytest.fixture(params=["preload", "no-preload"])
def launch_mode(request, monkeypatch):
    """Every test that launches jobs runs twice: with the preloading fork
    server (the default for local runs) and with a fresh interpreter per process."""
    if request.param == "no-preload":
        monkeypatch.setenv("JAXRUN_NO_PRELOAD", "1")
    else:
        monkeypatch.delenv("JAXRUN_NO_PRELOAD", raising=False)
    return request.param


@pytest.fixture
def launch(launch_mode):
    started: list[Launch] = []

    def start(*args, **kw) -> Launch:
        job = Launch(list(args), **kw)
        started.append(job)
        return job

    yield start
    for job in started:
        job.kill()


@pytest.fixture
def jaxrun(launch):
    """Run jaxrun to completion: returns (returncode, stdout, stderr)."""

    def run(*args, timeout=120, **kw):
        job = launch(*args, **kw)
        code = job.wait(timeout=timeout)
        return code, job.stdout, job.stderr

    return run
