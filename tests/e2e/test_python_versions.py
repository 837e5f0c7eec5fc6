"""The toy runs under every Python that requires-python admits and this machine has.

The main interpreter runs the whole suite; each other admitted version runs
the guide's toy from its own venv, which ``python tests/pythons.py`` builds
(``.ci/run`` does, and fails when a build fails).  A version the machine lacks
is skipped with the reason, as is one whose venv was never built (a local
run without .ci/run).  The newest version below the bound must be refused by
pip with its own clear message.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess

import pytest
import pythons
from fixtures.guide import check_guide_output
from fixtures.jobs import EXAMPLES, ROOT

OTHERS = [v for v in pythons.admitted() if v != pythons.MAIN]
BELOW = pythons.newest_below()


def run(argv: list, timeout: float) -> subprocess.CompletedProcess:
    """Run to the end; on a timeout, kill the whole group (jaxrun and its controllers)."""
    proc = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{argv} took over {timeout} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def venv_for(version: str):
    if pythons.interpreter(version) is None:
        pytest.skip(f"no Python {version} on this machine (looked in {pythons.PYENV_ROOT}/versions and for "
                    f"python{version} on PATH)")
    python = pythons.venv_python(version)
    if not python.exists():
        pytest.skip(f"Python {version} is here but its venv is not: run `python tests/pythons.py` (.ci/run does)")
    return python


def test_the_versions_come_from_requires_python():
    assert pythons.MAIN in pythons.admitted(), f"the main interpreter {pythons.MAIN} is not admitted by requires-python"
    assert BELOW is not None and BELOW not in pythons.admitted()


@pytest.mark.timeout(150)
@pytest.mark.parametrize("version", OTHERS)
def test_the_toy_runs_under(version, tmp_path):
    python = venv_for(version)
    # The venv runs this checkout, with the main interpreter's jax and jaxlib.
    probe = ("import sys, importlib.metadata as m, jaxrun; "
             "print(f'{sys.version_info[0]}.{sys.version_info[1]}', m.version('jax'), m.version('jaxlib'), "
             "jaxrun.__file__)")
    seen = run([python, "-c", probe], timeout=60)
    assert seen.returncode == 0, seen.stderr
    got_version, jax, jaxlib, where = seen.stdout.split()
    assert got_version == version
    assert (jax, jaxlib) == (importlib.metadata.version("jax"), importlib.metadata.version("jaxlib"))
    assert where.startswith(str(ROOT / "jaxrun")), where
    done = run([python, "-m", "jaxrun", "-n", 4, "--cpu-devices", 2, "--log-dir", tmp_path, EXAMPLES / "toy.py"],
               timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    check_guide_output(done.stdout)


@pytest.mark.timeout(60)
def test_pip_refuses_a_python_below_the_bound():
    if BELOW is None or pythons.interpreter(BELOW) is None:
        pytest.skip(f"no Python {BELOW} on this machine")
    # Metadata only (--dry-run, --no-deps): nothing is installed anywhere.
    done = run([pythons.interpreter(BELOW), "-m", "pip", "install", "--dry-run", "--no-deps",
                "--disable-pip-version-check", ROOT], timeout=50)
    assert done.returncode != 0
    spec = str(pythons.requires_python())
    assert f"requires a different Python: {BELOW}." in done.stderr and f"not in '{spec}'" in done.stderr, done.stderr
