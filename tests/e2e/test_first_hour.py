"""Issue 68, a newcomer's first hour, with real jobs: the ``device_put`` of
per-process arrays named in under 60 lines of output (console and summary
together), a healthy toy under ``-q`` ending with one jaxrun line, the
stall's culprit named alone when the others wait in one collective reached
from different lines, the failure before the goodput line, and
``jaxrun top`` without a terminal printing its table and leaving."""

from __future__ import annotations

import re
import subprocess
import time

import pytest
from fixtures.jobs import DATA, EXAMPLES, JAXRUN, ROOT

LINE = 11  # tests/data/device_put_mistake.py's device_put


def jaxrun_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("jaxrun:")]


def test_the_device_put_mistake_is_named_at_its_line_in_under_60_lines(jaxrun, tmp_path):
    script = DATA / "device_put_mistake.py"
    assert "jax.device_put(local" in script.read_text().splitlines()[LINE - 1]
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, "--log-dir", tmp_path, script)
    assert code == 1, err
    whole = out.splitlines() + err.splitlines()
    assert len(whole) < 60, "\n".join(whole)
    said = jaxrun_lines(err)
    assert re.match(r"jaxrun: process \d failed first: exit code 1", said[0]), err
    assert said[1].startswith("jaxrun:   AssertionError: ") and "not the same on each process" in said[1], err
    assert any(f"raised at {script}:{LINE}; " in line and str(tmp_path) in line for line in said), err
    assert not any("last lines of" in line for line in said), err
    # Each process's traceback reached the console: one whole (JAX's frames
    # folded), the others as a line each that names its own log.
    assert err.count("Traceback (most recent call last):") == 1, err
    assert len(re.findall(rf"^\[\d\] AssertionError at {script}:{LINE}, as process \d's above", err, re.M)) == 3, err
    # Every byte is still in the logs: each holds its whole traceback.
    for rank in range(4):
        log = (tmp_path / f"process-{rank}.stderr").read_text()
        assert "jax/_src/dispatch.py" in log and log.count("\n") > 25


def test_a_healthy_toy_says_nothing_routine_and_under_quiet_ends_with_one_line(jaxrun, tmp_path):
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, "--log-dir", tmp_path / "default", EXAMPLES / "toy.py")
    assert code == 0, err
    said = jaxrun_lines(err)
    assert not [line for line in said if "goodput" in line or "processes joined in 0." in line], err
    assert said[-1] == f"jaxrun: logs in {tmp_path / 'default'}", err
    code, out, err = jaxrun("-q", "-n", 4, "--cpu-devices", 2, "--log-dir", tmp_path / "quiet", EXAMPLES / "toy.py")
    assert code == 0, err
    assert out.count("got result: -0.12398731708526611") == 4, out
    said = jaxrun_lines(err)
    assert len(said) <= 2 and said[-1] == f"jaxrun: logs in {tmp_path / 'quiet'}", err


def test_a_stall_names_the_process_stuck_in_its_own_code_alone(jaxrun, tmp_path):
    """Rank 3 sleeps; ranks 0-2 wait in the step's collective, rank 0
    through print(float(y)), 1 and 2 through jax.device_get(y): process 3
    stands out alone, and the failure comes before the goodput line."""
    script = DATA / "two_culprits.py"
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, "--stall-timeout", 5, "--log-dir", tmp_path, script,
                            timeout=120)
    assert code == 125, err
    said = jaxrun_lines(err)
    culprit = next(line for line in said if "stands out" in line or "stand out" in line)
    assert re.search(r"process 3 stands out, at \S+two_culprits\.py:17 in <module>: time\.sleep\(45\)", culprit), err
    assert culprit.count("stand") == 1 and "process 0 stands out" not in culprit, culprit
    assert "processes 0, 1, 2 wait at" in culprit, culprit
    stalled = next(i for i, line in enumerate(said) if line.startswith("jaxrun: the job stalled"))
    goodput = [i for i, line in enumerate(said) if line.startswith("jaxrun: goodput")]
    assert goodput and goodput[0] > stalled, err  # the run lost time to the stall: said, after it
    assert not re.search(r"joined in 0\.\d s", err), err


@pytest.mark.timeout(120)
def test_top_without_a_terminal_prints_one_table_and_leaves(start_job, tmp_path):
    script, release = tmp_path / "wait.py", tmp_path / "release"
    script.write_text("import os, sys, time\nwhile not os.path.exists(sys.argv[1]):\n    time.sleep(0.1)\n")
    job = start_job("-n", 2, "--stall-timeout", 0, "--log-dir", tmp_path / "logs", script, release,
                    env={"JAXRUN_NO_PRELOAD": "1"})  # plain Python: no jax to preload
    deadline = time.monotonic() + 60
    while True:  # stdout a pipe, as `timeout 4 jaxrun top` in a script has it
        done = subprocess.run([*JAXRUN, "top"], capture_output=True, text=True, timeout=20, cwd=ROOT)
        if done.returncode == 0 or time.monotonic() > deadline:
            break
        assert job.proc.poll() is None, job.proc.communicate()
        time.sleep(0.2)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("jaxrun: run ") and lines[1].split()[:4] == ["RANK", "HOST", "PID", "STATE"], done.stdout
    assert "\x1b" not in done.stdout
    release.write_text("")
    assert job.wait(timeout=30) == 0, job.stderr
