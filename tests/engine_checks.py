"""Checks shared by the scheduler-engine tests (Slurm, Open MPI).

Scheduler launches do not use the preloading fork server, so these tests run
once, not once per ``launch_mode``.
"""

from __future__ import annotations

import time

import pytest

from conftest import EXAMPLES, Launch
from test_local import check_guide_output

# Task 3 fails after initialize() while the others wait in a collective: a bare
# JAX job would sit out its heartbeat timeout (about 100 s) here.
CRASH_IN_TASK_3 = """\
import jax
from jax.experimental import multihost_utils
if jax.process_index() == 3:
    raise RuntimeError("task 3 broke")
multihost_utils.sync_global_devices("never reached by task 3")
"""


@pytest.fixture
def run_jaxrun():
    started: list[Launch] = []

    def run(*args, timeout=90):
        job = Launch([str(a) for a in args])
        started.append(job)
        start = time.monotonic()
        code = job.wait(timeout=timeout)
        return code, job.stdout, job.stderr, time.monotonic() - start

    yield run
    for job in started:
        job.kill()


def check_toy(run_jaxrun, engine_args, tmp_path) -> None:
    code, out, err, _ = run_jaxrun(*engine_args, "-n", 4, "--cpu-devices", 2, "--log-dir", tmp_path, EXAMPLES / "toy.py")
    assert code == 0, err
    check_guide_output(out)
    for rank in range(4):  # every byte of each task in its own log
        log = (tmp_path / f"process-{rank}.stdout").read_text()
        assert f"process={rank} got result: -0.12398731708526611" in log
        assert "[Gloo]" in log


def check_crash_in_task_3(run_jaxrun, engine_args, tmp_path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(CRASH_IN_TASK_3)
    code, out, err, elapsed = run_jaxrun(*engine_args, "-n", 4, "--cpu-devices", 1, "--log-dir", tmp_path / "logs", script)
    assert code == 1, err
    assert "process 3 failed first: exit code 1" in err
    assert "RuntimeError: task 3 broke" in err
    assert elapsed < 20, f"the step took {elapsed:.1f} s to end after task 3 failed"
    assert "task 3 broke" in (tmp_path / "logs" / "process-3.stderr").read_text()


def check_timeout_stops_the_step(run_jaxrun, engine_args, tmp_path) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import time\nwhile True:\n    time.sleep(0.1)\n")
    code, _, err, elapsed = run_jaxrun(*engine_args, "-n", 2, "--cpu-devices", 1, "--timeout", 2, "--log-dir", tmp_path / "logs", script)
    assert code == 124, err
    assert elapsed < 15, f"took {elapsed:.1f} s"
    # The stack dump asked for over the task channel reached the log.
    assert "most recent call first" in (tmp_path / "logs" / "process-0.stderr").read_text()
