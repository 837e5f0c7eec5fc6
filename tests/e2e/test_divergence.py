"""--flight-recorder and --check-divergence with real multi-process JAX runs.

Four processes with one CPU device each run divergence_train.py's loop; with
``--detour 2`` process 2 runs a different jitted reduction once, on a
rank-dependent branch, which without jaxrun ends in wrong sums and a hang.
"""

from __future__ import annotations

import re
import time

import pytest
from fixtures.jobs import DATA

pytestmark = pytest.mark.timeout(120)

SCRIPT = DATA / "divergence_train.py"
FOUR = ("-n", 4, "--cpu-devices", 1)
# The --timeout runs: the detour reaches its hang about 3 s after jaxrun's
# start, alone; two jobs start side by side (below) on a 2-core machine that
# also runs the other worker's jobs, so the timeout gives them three times that.
TIMEOUT = 10


def line_of(text: str) -> int:
    """The script's line that holds ``text``: the frames the reports must name."""
    for number, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(text)


EVAL_LINE = line_of("eval_step(x).block_until_ready()")
TRAIN_LINE = line_of("w = train_step(w, x)")
EXTRA_LINE = line_of("    train_step(w, x).block_until_ready()")
SUM_LINE = line_of("print(f\"process {rank}")


@pytest.mark.both_modes
def test_check_divergence_stops_the_job_at_the_first_different_call(launch):
    job = launch(*FOUR, "--check-divergence", SCRIPT, "--detour", 2)
    started = time.monotonic()
    code = job.wait(timeout=90)
    took = time.monotonic() - started
    assert code == 1, job.stderr
    assert "process 2 failed first: exit code 1" in job.stderr
    headline = re.search(r"DivergenceError: (.*)", job.stderr)
    assert headline, job.stderr
    # Call 6 among programs that span processes: the make_array of the batch
    # is not one, five train steps are, then the detour.
    assert re.fullmatch(
        rf"call 6 differs across processes: "
        rf"process 2 runs eval_step#1 \[program \w+\] at divergence_train.py:{EVAL_LINE}; "
        rf"processes 0, 1, 3 run train_step#6 \[program \w+\] at divergence_train.py:{TRAIN_LINE}", headline[1])
    assert "process 2: eval_step#1, program" in job.stderr and f"{SCRIPT}:{EVAL_LINE}" in job.stderr
    # One diagnosis for the job, in the summary, however many processes judged (issue 74).
    assert job.stderr.count("stopping the job before that call runs") == 1, job.stderr
    assert not re.search(r"^\[\d\] jaxrun: --check-divergence", job.stderr, re.M), job.stderr
    assert "sum" not in job.stdout  # nobody went on to a wrong result
    # From the start, the processes' own start included: 2-4 s alone, and a
    # job left to itself hangs until JAX's heartbeat timeout (100 s).  30 s
    # holds a start slowed several times over on a loaded 2-core machine.
    assert took < 30, f"the check took {took:.1f}s to stop the job"


def test_check_divergence_notices_a_process_that_runs_on_after_the_others_finished(start_job):
    job = start_job(*FOUR, "--check-divergence", SCRIPT, "--extra", 2)
    assert job.wait(timeout=90) == 1, job.stderr
    found = re.search(rf"DivergenceError: call (\d+) differs across processes: process 2 runs train_step#21 "
                      rf"\[program \w+\] at divergence_train.py:{EXTRA_LINE}; "
                      rf"processes 0, 1, 3 had finished the script after (\d+) calls", job.stderr)
    assert found, job.stderr
    assert int(found[2]) == int(found[1]) - 1
    # The check's own word on who had finished, once; the dumps' line would
    # only repeat it (issue 74: "no line contradicts another").
    assert job.stderr.count("processes 0, 1, 3: finished the script after") == 1, job.stderr
    assert "had finished the script and were waiting" not in job.stderr, job.stderr


# The two --timeout runs of the detour, with --flight-recorder and with no
# flag, spend their time waiting for the timeout (with --checks off: the
# default programs check would stop the detour once the others compile their
# next program, and these tests are about the hang's record): they run side by side,
# started by whichever of their two tests comes first, which waits for both
# (its leak guard sees them end); each test checks its own run, as
# test_transparency.py's patterns do.  conftest keeps the module in one worker.
_timed_out: dict[str, object] = {}


def timed_out(start_job, tmp_path_factory) -> dict:
    if not _timed_out:
        logs = tmp_path_factory.mktemp("flight") / "logs"
        jobs = {"flight": start_job(*FOUR, "--checks", "off", "--flight-recorder", "--timeout", TIMEOUT,
                                    "--log-dir", logs, SCRIPT, "--detour", 2),
                "plain": start_job(*FOUR, "--checks", "off", "--timeout", TIMEOUT, SCRIPT, "--detour", 2)}
        for job in jobs.values():
            job.wait(timeout=90)
        _timed_out.update(jobs, logs=logs)
    return _timed_out


def test_flight_recorder_lines_up_the_processes_last_programs_on_timeout(start_job, tmp_path_factory):
    runs = timed_out(start_job, tmp_path_factory)
    job, logs = runs["flight"], runs["logs"]
    assert job.proc.returncode == 124, job.stderr
    summary = job.stderr[job.stderr.index("jaxrun: --timeout expired"):]
    assert ("jaxrun: processes 0, 1, 3 had finished the script and were waiting in JAX's shutdown; "
            "process 2 was still in the script") in summary
    assert (f"jaxrun: the processes parted at call 6: process 2 ran eval_step#1 (divergence_train.py:{EVAL_LINE}); "
            f"processes 0, 1, 3 ran train_step#6 (divergence_train.py:{TRAIN_LINE})") in summary
    last = re.search(r"jaxrun: process 2 last ran call \d+ (\S+) \(divergence_train.py:(\d+)\); "
                     r"processes 0, 1, 3 last ran call \d+ (\S+) \(divergence_train.py:(\d+)\)", summary)
    assert last, summary
    assert last[1].startswith("train_step#") and int(last[2]) == TRAIN_LINE  # stuck in its loop
    assert last[3].startswith("_reduce_sum#") and int(last[4]) == SUM_LINE  # done with it
    for rank in range(4):  # each block is in its process's log, after the stack dump
        text = (logs / f"process-{rank}.stderr").read_text()
        assert text.index("most recent call first") < text.index(f"jaxrun: flight[{rank}] begin: the last ")
        assert f"jaxrun: flight[{rank}] end\n" in text
    # ... and only there: the console hides the blocks as it hides the dumps.
    assert "flight[" not in job.stderr and "most recent call first" not in job.stderr


def test_timeout_without_flags_tells_finished_processes_from_stuck_ones(start_job, tmp_path_factory):
    job = timed_out(start_job, tmp_path_factory)["plain"]
    assert job.proc.returncode == 124, job.stderr
    assert ("jaxrun: processes 0, 1, 3 had finished the script and were waiting in JAX's shutdown; "
            "process 2 was still in the script") in job.stderr
    assert "last ran" not in job.stderr and "flight[" not in job.stderr  # no recorder, no hook


def test_without_divergence_both_flags_change_nothing_but_the_cost(launch):
    # Side by side: two jobs on their own ports and log folders.
    plain = launch(*FOUR, SCRIPT)
    checked = launch(*FOUR, "--flight-recorder", "--check-divergence", SCRIPT)
    assert plain.wait(timeout=90) == 0, plain.stderr
    assert checked.wait(timeout=90) == 0, checked.stderr
    results = sorted(line for line in plain.stdout.splitlines() if "sum" in line)
    assert len(results) == 4
    assert sorted(line for line in checked.stdout.splitlines() if "sum" in line) == results
    assert jaxrun_lines(checked.stderr) == jaxrun_lines(plain.stderr)


def jaxrun_lines(stderr: str) -> list[str]:
    """The console's stderr, less what differs between any two runs: the log
    folder, the goodput (which losses are largest) and measured figures
    (memory, CPU time) in jaxrun's own lines."""
    return [re.sub(r"\d+(?:\.\d+)?", "N", line) if line.startswith("jaxrun: ") else line
            for line in stderr.splitlines() if not line.startswith(("jaxrun: logs in", "jaxrun: goodput "))]


@pytest.mark.both_modes
def test_a_jax_without_the_hook_stops_at_start_up_naming_its_version(launch, tmp_path):
    fake = tmp_path / "site" / "jax"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.0.1"\n')
    script = tmp_path / "uses_jax.py"
    script.write_text("import jax\nprint('ran on', jax.__version__)\n")
    job = launch("-n", 2, "--flight-recorder", script, env={"PYTHONPATH": str(tmp_path / "site")})
    assert job.wait(timeout=60) == 1, job.stderr
    assert "ran on" not in job.stdout
    message = re.search(r"\[\d\] (jaxrun: --flight-recorder cannot hook jax 0\.0\.1: .*)", job.stderr)
    assert message, job.stderr
    assert "jax._src.pjit._get_fastpath_data" in message[1] and "tested with jax 0.10.2" in message[1]
    assert "Traceback" not in job.stderr
