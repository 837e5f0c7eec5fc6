"""Restarts that are not wasted (docs/restarts.md, "The same failure twice"):
an attempt that fails exactly as the one before it is not restarted; any
other failure is.  The three jobs run side by side: each attempt is a real
2-process JAX job."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

BUG = '''
import os
import jax

if jax.process_index() == 1:
    raise ValueError("bad shard")  # the same line, the same message, every attempt
print("never here")
'''

# A crash signal at the same line twice, where faulthandler dumps the stack
# (in process 1: process 0's death would also end the others, as the coordinator's).
SEGV = '''
import os, signal
import jax

if jax.process_index() == 1:
    os.kill(os.getpid(), signal.SIGSEGV)
'''

# Each attempt fails differently from the one before, until the fifth succeeds:
# the same message at another line; a SIGKILL (from outside, as far as
# jaxrun can tell), twice; then nothing.
CHANGING = '''
import os, signal
import jax

attempt = int(os.environ["JAXRUN_RESTART_COUNT"])
if jax.process_index() == 1:
    if attempt == 0:
        raise ValueError("bad shard")
    if attempt == 1:
        raise ValueError("bad shard")
    if attempt in (2, 3):
        os.kill(os.getpid(), signal.SIGKILL)
print("done in attempt", attempt)
'''


@pytest.mark.timeout(120)
def test_the_same_failure_twice_stops_the_restarts_and_a_changing_failure_is_restarted(launch, tmp_path):
    jobs = {}
    for name, text in (("bug", BUG), ("changing", CHANGING), ("segv", SEGV)):
        script = tmp_path / f"{name}.py"
        script.write_text(textwrap.dedent(text))
        report = tmp_path / f"{name}.json"
        jobs[name] = (launch("-n", 2, "--cpu-devices", 1, "--max-restarts", 5, "--report", report,
                             "--log-dir", tmp_path / f"{name}-logs", script, env={"PYTHONFAULTHANDLER": "1"}),
                      report, script)
    codes = {name: job.wait(timeout=100) for name, (job, _, _) in jobs.items()}

    job, report, script = jobs["bug"]
    assert codes["bug"] == 1, job.stderr
    line = 1 + next(i for i, text in enumerate(BUG.splitlines()) if "raise ValueError" in text)
    why = f"not restarting: the same failure as attempt 1 (ValueError: bad shard at {script}:{line})"
    assert re.findall(r"^jaxrun: not restarting: .*$", job.stderr, re.M) == [f"jaxrun: {why}"], job.stderr
    assert job.stderr.count("restarting the whole job") == 1  # attempt 2, and no third
    found = json.loads(report.read_text())
    assert len(found["attempts"]) == 2 and found["restarts"] == 1
    assert found["not_restarted"] == why and found["attempts"][-1]["not_restarted"] == why
    assert found["attempts"][0]["not_restarted"] is None
    assert [a["root_cause"]["at"] for a in found["attempts"]] == [f"{script}:{line}"] * 2

    job, report, _ = jobs["changing"]
    assert codes["changing"] == 0, job.stderr
    assert "not restarting" not in job.stderr
    found = json.loads(report.read_text())
    assert len(found["attempts"]) == 5 and found["not_restarted"] is None
    assert [a["root_cause"]["exit"] for a in found["attempts"][:4]] == ["exit code 1"] * 2 + ["killed by SIGKILL"] * 2
    assert "[1] done in attempt 4" in job.stdout

    job, report, script = jobs["segv"]
    assert codes["segv"] == 139, job.stderr
    assert f"not restarting: the same failure as attempt 1 (killed by SIGSEGV at {script}:6)" in job.stderr
    assert len(json.loads(report.read_text())["attempts"]) == 2
