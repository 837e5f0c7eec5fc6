"""The suite runs alike however it is started: a pytest started with SIGINT
and SIGHUP ignored (``nohup python -m pytest ... &``) still starts every
process at the default dispositions (tests/fixtures/signals.py), and goes on
ignoring those signals itself, in its xdist workers too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

# Run by the inner pytest: a child it starts is stopped by each signal, and
# the pytest process (the worker, under -n) is not.
INNER = """\
import os, signal, subprocess

def test_children_get_the_defaults_and_pytest_keeps_ignoring():
    for signum in (signal.SIGINT, signal.SIGHUP):
        child = subprocess.Popen(["sleep", "30"])
        try:
            child.send_signal(signum)
            assert child.wait(timeout=10) == -signum
        finally:
            child.kill()
            child.wait()
        os.kill(os.getpid(), signum)  # what a hangup or a Ctrl-C would send pytest: it goes on
"""


def started_in_the_background() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.parametrize("workers", ["0", "1"])
def test_a_suite_started_with_sigint_and_sighup_ignored_starts_processes_at_the_defaults(tmp_path, workers):
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    # xdist and the suite's signal plugin, and no other: what else the venv's
    # entry points load costs each pytest (and each worker) seconds here.
    found = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist.plugin",
                            "-p", "fixtures.signals", "-n", workers, str(tmp_path / "test_inner.py")],
                           cwd=tmp_path,
                           env={**os.environ, "PYTHONPATH": str(TESTS), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
                           capture_output=True, text=True, timeout=90, preexec_fn=started_in_the_background)
    assert found.returncode == 0, found.stdout + found.stderr
    assert "1 passed" in found.stdout, found.stdout
