"""Restarts that are not wasted (docs/restarts.md, "The same failure twice"):
an attempt that fails exactly as the one before it (the same error, crash
signal or stall at the same line) is not restarted; any other failure is.
The four jobs run side by side: each attempt is a real
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

# The same stall every attempt: process 1 alive in user code while process 0
# waits for it in a collective.
STALL = '''
import time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))
if jax.process_index() == 1:
    time.sleep(600)
print(float(jnp.sum(x)))
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
    for name, text in (("bug", BUG), ("changing", CHANGING), ("segv", SEGV), ("stall", STALL)):
        script = tmp_path / f"{name}.py"
        script.write_text(textwrap.dedent(text))
        report = tmp_path / f"{name}.json"
        jobs[name] = (launch("-n", 2, "--cpu-devices", 1, "--max-restarts", 5, "--report", report, "--stall-timeout", 2,
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

    job, report, script = jobs["stall"]
    assert codes["stall"] == 125, job.stderr
    line = 1 + next(i for i, text in enumerate(STALL.splitlines()) if "time.sleep(600)" in text)
    # Two processes at two places: neither stands out, so both are named.
    assert (f"not restarting: the same failure as attempt 1 (stalled at {script}:{line + 1} in <module>: "
            f"print(float(jnp.sum(x))); process 1 at {script}:{line} in <module>: time.sleep(600))") in job.stderr, \
        job.stderr
    found = json.loads(report.read_text())
    assert [a["root_cause"]["kind"] for a in found["attempts"]] == ["stall", "stall"]
