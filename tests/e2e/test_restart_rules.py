"""Restarts that are not wasted (docs/restarts.md, "The same failure twice"):
an attempt that fails exactly as the one before it (the same error, crash
signal or stall at the same line) is not restarted; any other failure is.
A run whose every script returned before a process failed (an abort in an
exit hook) is not restarted at all ("A finished run is not run again"); the
same abort before the script returns is, once: the same crash signal in the
same process and phase, with no line dumped, is the same failure.
The jobs run side by side: each attempt is a real 2- or 3-process JAX job."""

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


# Every process finishes its work; 2 s later process 1 aborts in an exit hook
# (registered after jax's own, so it runs first), faulthandler on.
TEARDOWN = '''
import atexit, os, time
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))
if jax.process_index() == 1:
    atexit.register(lambda: (time.sleep(2), os.abort()))
print("done", float(jnp.sum(x)))
'''

# The control: the same abort while the script runs, and no stack dumped.
ABORT = '''
import os
import jax

if jax.process_index() == 1:
    os.abort()
print("never here")
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
    for name, text, count, env in (("teardown", TEARDOWN, 3, {"PYTHONFAULTHANDLER": "1"}), ("abort", ABORT, 2, {})):
        script = tmp_path / f"{name}.py"
        script.write_text(textwrap.dedent(text))
        report = tmp_path / f"{name}.json"
        jobs[name] = (launch("-n", count, "--cpu-devices", 1, "--max-restarts", 2, "--report", report,
                             "--log-dir", tmp_path / f"{name}-logs", script, env=env), report, script)
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

    job, report, script = jobs["teardown"]
    assert codes["teardown"] == 134, job.stderr
    assert job.stdout.count("done 12.0") == 3, job.stdout
    assert re.search(r"^jaxrun: the work finished \(every process's script returned\); then process 1 failed at "
                     r"teardown: killed by SIGABRT \(pid \d+\)$", job.stderr, re.M), job.stderr
    why = ("not restarting: the work finished (every process's script returned) before process 1 failed at "
           "teardown")
    assert f"jaxrun: {why}" in job.stderr and "restarting the whole job" not in job.stderr, job.stderr
    found = json.loads(report.read_text())
    hook = 1 + next(i for i, text in enumerate(TEARDOWN.splitlines()) if "os.abort()" in text)
    # Its stack, where it aborted: in the exit hook, not at the script's last line.
    assert f'File "{script}", line {hook} in <lambda>' in "\n".join(found["root_cause"]["stderr_tail"]), \
        found["root_cause"]
    assert f"line {hook} in <lambda>" in job.stderr.split("failed at teardown")[1], job.stderr
    assert len(found["attempts"]) == 1 and found["not_restarted"] == why
    assert [p["finished_then_failed"] for p in found["processes"]] == [False, True, False]
    assert all(p["finished_at"] and p["joined_at"] <= p["finished_at"] for p in found["processes"])

    job, report, script = jobs["abort"]
    assert codes["abort"] == 134, job.stderr
    assert "jaxrun: not restarting: the same failure as attempt 1 (killed by SIGABRT)" in job.stderr, job.stderr
    found = json.loads(report.read_text())
    assert len(found["attempts"]) == 2
    assert [p["finished_then_failed"] for p in found["processes"]] == [False, False]
    assert found["processes"][1]["finished_at"] is None
