"""Checks shared by the tests of launchers other than local: Slurm, Open MPI, SSH.

These launches do not use the preloading fork server, so these tests run
once, not once per ``launch_mode``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from pathlib import Path

import pytest

from conftest import EXAMPLES, Launch
from test_local import check_guide_output

DATA = Path(__file__).resolve().parent / "data"
RANK_PROBE = DATA / "engine_rank_probe.py"
BYTES_PROBE = DATA / "engine_bytes_probe.py"
BYTES_PER_PROCESS = 3 << 20

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


def check_ranks_come_from_the_scheduler(run_jaxrun, engine_args, tmp_path, started_by: str, rank_variable: str) -> None:
    """Each process was started by the scheduler (``started_by`` is set), and
    the rank the scheduler gave it is the one jaxrun's placeholders, its
    variable and its log file name all use."""
    logs = tmp_path / "logs"
    code, _, err, _ = run_jaxrun(*engine_args, "-n", 3, "--cpu-devices", 1, "--log-dir", logs,
                                 RANK_PROBE, "{process_id}", "{num_processes}", "id={process_id}")
    assert code == 0, err
    for rank in range(3):
        text = (logs / f"process-{rank}.stdout").read_text()
        lines = [line for line in text.splitlines() if line.startswith("rank-probe ")]
        assert len(lines) == 1, text
        seen = json.loads(lines[0].removeprefix("rank-probe "))
        assert seen["env"][started_by] is not None, f"process {rank} was not started by the scheduler: {seen}"
        assert seen["env"][rank_variable] == str(rank), seen
        assert seen["argv"] == [str(rank), "3", f"id={rank}"], seen
        assert seen["env"]["JAXRUN_PROCESS_ID"] == str(rank), seen


def bytes_payload(rank: int, size: int) -> tuple[bytes, bytes]:
    """What the bytes probe writes; taken from the probe itself, so the two cannot drift."""
    spec = importlib.util.spec_from_file_location("engine_bytes_probe", BYTES_PROBE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.payload(rank, size)


def check_logs_hold_every_byte(run_jaxrun, launcher_args, tmp_path) -> None:
    """Launchers other than local pass each child's bytes through jaxrun, which
    writes the log files itself: they must still hold exactly what the child
    wrote, unfinished last lines and bytes that are not UTF-8 included."""
    logs = tmp_path / "logs"
    code, out, err, _ = run_jaxrun(*launcher_args, "-n", 2, "--cpu-devices", 1, "--log-dir", logs,
                                   BYTES_PROBE, "{process_id}", BYTES_PER_PROCESS)
    assert code == 0, err[-3000:]
    for rank in range(2):
        for stream, want in zip(("stdout", "stderr"), bytes_payload(rank, BYTES_PER_PROCESS)):
            got = (logs / f"process-{rank}.{stream}").read_bytes()
            # The end first: a lost unfinished line is the likeliest fault, and this says so plainly.
            assert got[-100:] == want[-100:], (rank, stream)
            assert (len(got), hashlib.sha256(got).hexdigest()) == (len(want), hashlib.sha256(want).hexdigest()), (rank, stream)
        # The console shows an unfinished last line too, once its stream ends.
        assert f"[{rank}] unfinished stderr line {rank} \ufffd\n" in err
