"""The command line's guess (``jaxrun.cli.early``): which bare words start a
preloading server before click loads.  A wrong guess costs a server closed
unused; a missed one costs the head start's 90 ms; neither changes what
runs (tests/e2e/test_head_start.py runs them)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jaxrun.cli import early


@pytest.mark.parametrize("argv", [
    ["-n", "4", "--cpu-devices", "2", "toy.py"],
    ["toy.py", "--hosts", "not-ours"],  # after the script: its own words
    ["-n", "2", "-m", "pkg.train", "--lr", "3e-4"],
    ["-n", "2", "--log-dir", "logs", "--stall-timeout", "30", "-q", "train.py"],
])
def test_a_local_run_of_a_script_is_guessed(argv):
    assert early.guesses(argv, environ={})


@pytest.mark.parametrize("argv", [
    [],
    ["--help"],
    ["-n", "2", "--no-preload", "toy.py"],
    ["-n", "2", "--dry-run", "toy.py"],
    ["-H", "a,b", "toy.py"],
    ["--hosts=hosts.txt", "toy.py"],
    ["--launcher", "slurm", "-n", "2", "toy.py"],
    ["-x", "A=1", "toy.py"],
    ["--python", "/opt/py/bin/python", "toy.py"],
    ["--preload-module", "torch", "toy.py"],
    ["-n", "2", "-i"],
    ["top"], ["logs", "run.py"], ["k8s", "job.py"],  # subcommands
    ["-n", "2", "notebook.ipynb"],  # no target the guess can see
])
def test_anything_else_is_not(argv):
    assert not early.guesses(argv, environ={})


def test_no_preload_in_the_environment_is_not_guessed():
    from jaxrun import contract

    assert not early.guesses(["toy.py"], environ={contract.NO_PRELOAD: "1"})
    assert early.guesses(["toy.py"], environ={contract.NO_PRELOAD: "0"})


def test_the_guess_s_subcommands_are_the_command_line_s():
    """Each subcommand the entry dispatches is one the guess leaves alone."""
    import inspect
    import re

    from jaxrun.cli import entry

    source = inspect.getsource(entry._entry)
    for name in early.SUBCOMMANDS:
        assert f'"{name}"' in source, name
    dispatched = set(re.findall(r'\["(\w+)"\]', source))
    assert dispatched <= early.SUBCOMMANDS, dispatched - early.SUBCOMMANDS


def test_the_console_script_guesses_before_click_loads():
    """``import jaxrun.cli`` loads neither click nor the launcher: the entry's
    first step is the guess."""
    loaded = subprocess.run([sys.executable, "-c", "import sys, jaxrun.cli; "
                             "print(sorted(m for m in sys.modules if m == 'click' or m.startswith('jaxrun.')))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['jaxrun.cli']", loaded
