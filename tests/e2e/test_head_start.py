"""A local run's preloading server starts as soon as the command line is
known good, before the launcher loads (#46's start-up goal): its ``import
jax`` then runs beside the launcher's own start.  An audit hook in every
process of the run (a ``sitecustomize`` on PYTHONPATH) writes down when the
launcher loads click and the run loop, and each start of a server."""

from __future__ import annotations

import socket

import pytest
from fixtures.audit import audit_every_process, lines_by_pid
from fixtures.jobs import is_running, processes_with_token

AUDIT = '''
import os, sys

_LOG = os.environ.get("HEAD_START_LOG")


def _hook(event, args):
    if event == "import" and args[0] in ("click", "jaxrun.launcher.run"):
        what = "import " + args[0]
    elif event == "subprocess.Popen" and "jaxrun.backends.forkserver.server" in [str(a) for a in args[1] or ()]:
        what = "server"
    else:
        return
    with open(_LOG, "a") as f:
        f.write(f"{os.getpid()} {what}\\n")


if _LOG:
    sys.addaudithook(_hook)
'''


@pytest.fixture
def audited(tmp_path, monkeypatch):
    """The events of a process of the run, in order, by its pid."""
    log = audit_every_process(tmp_path, monkeypatch, AUDIT, "HEAD_START_LOG")
    return lambda pid: lines_by_pid(log).get(str(pid), [])


def test_the_server_starts_once_the_options_are_read_and_before_the_launcher_loads(start_job, audited, tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import jax\nprint('devices', jax.device_count(), flush=True)\n")
    job = start_job("-n", 2, "--cpu-devices", 2, script)
    assert job.wait(timeout=60) == 0, job.stderr
    assert job.stdout.count("devices 4") == 2, job.stdout  # --cpu-devices reached jax, read again after the fork
    # One server for the run: the first attempt took the one begun early.
    assert audited(job.proc.pid) == ["import click", "server", "import jaxrun.launcher.run"]


@pytest.mark.parametrize("args", [("--dry-run",), ("--no-preload",)], ids=["dry-run", "no-preload"])
def test_no_server_where_the_run_needs_none(start_job, audited, tmp_path, args):
    script = tmp_path / "job.py"
    script.write_text("print('hello', flush=True)\n")
    job = start_job("-n", 2, *args, script)
    assert job.wait(timeout=60) == 0, job.stderr
    assert "server" not in audited(job.proc.pid)


def test_bad_input_found_after_the_server_started_ends_it(start_job, audited, tmp_path, no_leftover_processes):
    # The coordinator's port is checked by the run loop, after the head start:
    # the server was started, and is gone when jaxrun exits 2.
    script = tmp_path / "job.py"
    script.write_text("open('ran', 'w').close()\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        job = start_job("-n", 2, "--coordinator", f"127.0.0.1:{port}", script, cwd=tmp_path)
        assert job.wait(timeout=60) == 2, job.stderr
        # Gone at once, not only once it notices that jaxrun is (its import
        # of jax would take most of a second more).
        assert [p for p in processes_with_token(no_leftover_processes) if is_running(p)] == []
    lines = job.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("jaxrun: error: --coordinator 127.0.0.1:"), job.stderr
    assert audited(job.proc.pid) == ["import click", "server", "import jaxrun.launcher.run"]
    assert not (tmp_path / "ran").exists()
