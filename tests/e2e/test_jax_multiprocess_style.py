"""A test in the style of JAX's own multi-process tests, launched JAX's way and by jaxrun.

``tests/data/jax_style_suite.py`` uses ``jax._src.test_multiprocess``: run as
``python FILE --num_processes=4`` it starts four workers itself, each with
``--multiprocess_test_worker_id=I --multiprocess_test_controller_address=...``,
and writes their output to ``$TEST_UNDECLARED_OUTPUTS_DIR/jax_I_std{out,err}.log``.
jaxrun can start those workers instead, giving each its id and the address
through placeholders.  Every worker must then run, skip and fail the same
tests as when JAX starts them.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.jobs import DATA

pytestmark = pytest.mark.timeout(180)

SCRIPT = DATA / "jax_style_suite.py"
N = 4

# jax._src.test_multiprocess falls back to the fixed port 9876 without
# portpicker, and two runs at once on one machine would then collide.  This
# stand-in, first on the path, hands out ports the kernel knows to be free.
PORTPICKER_STANDIN = '''\
from jaxrun import portable


def pick_unused_port():  # below the ephemeral range: no outgoing connection takes it before it listens
    return portable.free_port("127.0.0.1")
'''


def result_counts(stderr: str) -> dict:
    """What unittest's summary says: tests run, and the verdict with its counts."""
    ran = re.findall(r"^Ran (\d+) tests? in ", stderr, re.MULTILINE)
    verdict = re.findall(r"^(OK|FAILED)(?: \((.*)\))?$", stderr, re.MULTILINE)
    if len(ran) != 1 or len(verdict) != 1:
        return {"summary": "missing or repeated", "ran": ran, "verdict": verdict}
    status, details = verdict[0]
    counts = {"ran": int(ran[0]), "status": status, "skipped": 0, "failures": 0, "errors": 0}
    for item in filter(None, (part.strip() for part in details.split(","))):
        key, value = item.split("=")
        counts[key] = int(value)
    return counts


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("JAX_", "XLA_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")


# The JAX-way run is the reference for both jaxrun modes: run it once.
_reference: dict[str, list[dict]] = {}


def jax_way(folder: Path) -> tuple[int, str, list[dict], list[str]]:
    outputs = folder / "outputs"
    outputs.mkdir(parents=True)
    standin = folder / "standin"
    standin.mkdir()
    (standin / "portpicker.py").write_text(PORTPICKER_STANDIN)
    env = dict(os.environ, TEST_UNDECLARED_OUTPUTS_DIR=str(outputs), PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(standin), env.get("PYTHONPATH", "")) if p)
    # The workers stay in the parent's process group: killing the group takes them too.
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), f"--num_processes={N}"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=150)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    stderrs = [(outputs / f"jax_{i}_stderr.log").read_text(errors="replace") for i in range(N)]
    return proc.returncode, out.decode(errors="replace"), [result_counts(s) for s in stderrs], stderrs


def reference(tmp_path_factory) -> list[dict]:
    if "counts" not in _reference:
        code, out, counts, stderrs = jax_way(tmp_path_factory.mktemp("jax-way"))
        assert code == 0, out
        # What this test file defines: four tests, one of them skipped.
        expected = {"ran": 4, "status": "OK", "skipped": 1, "failures": 0, "errors": 0}
        assert counts == [expected] * N, "\n".join(stderrs)
        # The parent reports each worker in its summary, read from the same logs.
        for i in range(N):
            assert re.search(rf"^Process {i}, ret: 0, .*; Ran 4 tests in [\d.]+s; OK \(skipped=1\)$", out,
                             re.MULTILINE), out
        _reference["counts"] = counts
    return _reference["counts"]


def test_jax_way_starts_its_own_workers(tmp_path_factory):
    reference(tmp_path_factory)


@pytest.mark.both_modes
def test_jaxrun_starts_the_workers_with_the_same_results(jaxrun, launch_mode, tmp_path, tmp_path_factory):
    want = reference(tmp_path_factory)
    logs = tmp_path / "logs"
    # The worker command line that test_multiprocess builds, with jaxrun's
    # placeholders where it puts its own worker id and address.
    code, _, err = jaxrun(
        "-n", N, "--log-dir", logs, SCRIPT,
        f"--num_processes={N}",
        "--multiprocess_test_worker_id={process_id}",
        "--multiprocess_test_controller_address={coordinator}",
        "--logtostderr",
        timeout=150,
    )
    stderrs = [(logs / f"process-{i}.stderr").read_text(errors="replace") for i in range(N)]
    got = [result_counts(s) for s in stderrs]
    detail = f"jaxrun exit {code}\n{err}\n" + "\n".join(f"--- process {i}\n{s}" for i, s in enumerate(stderrs))
    assert got == want, detail
    assert code == 0, detail
