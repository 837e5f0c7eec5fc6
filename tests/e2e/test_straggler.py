"""The straggler named (#57): a real 4-process JAX job whose process 2 is the
one the others wait for, run locally, over SSH (real sshd hosts) and under
Slurm; ``jaxrun top --once`` marks it while the job runs, and the live line,
the summary and the report name it, with its host and what it spends its
time on.  A clean job with +-10% jitter names nobody.

Two shapes (``tests/data/straggler_job.py``: 60 ms of Python input a step,
one jitted program with a collective, ``block_until_ready``):

- host: process 2's input takes three times as long; its programs do not;
- throttled: the same input everywhere, process 2 held from outside to a
  twentieth of a core (a CPU quota on its own cgroup, ``fixtures.throttle``):
  everything it does is slower, its programs too.

Each handicap is larger than what a loaded machine does to a healthy process
of the job on its own.  Over SSH, each test host's processes run in a session
of their own, and with the kernel's autogroups on, a session shares the CPU
with every other busy session as one: on a loaded CI machine hostA's two
processes each had less than the quarter of a core that process 2 was held
to then, and it was not the slowest (CI: hostA's processes waited 28% of their
time, process 2 46%; here, with 4 busy loops each in a session of its own, the
same).  The bench (``bench/straggler.py``) keeps the milder handicaps that
docs/time.md's figures come from.

Each job steps until the test has seen ``top`` mark the straggler, then is
told to stop (every process stops after the same step), so that a job lasts
as long as the rule needs (its second window, about 6 s after the join) and
no longer.  Suite time: the pairs in ``IN_SUITE`` (each backend and each
shape at least once); ``STRAGGLER_ALL=1`` runs every pair.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time

import pytest
from fixtures.jobs import DATA, JAXRUN, ROOT, TOKEN
from fixtures.throttle import can_throttle, find_process, throttled

JOB = DATA / "straggler_job.py"
IN_SUITE = {("local", "host"), ("ssh", "throttled"), ("slurm", "host")}
PAIRS = [(backend, shape) for backend in ("local", "ssh", "slurm") for shape in ("host", "throttled")]
# Steps at most: the test stops the job long before (the rule needs about 6 s).
MAX_STEPS = 250
# How long top may take to mark the straggler: the rule's second window
# closes about 6 s after the join; a loaded CI machine and an SSH or Slurm
# start-up take their share on top.
NAMED_WITHIN = 60
# A throttled straggler's programs against the others' median: above 1x, since
# the time its quota held it back is its programs' (a host-shaped one's read
# 0.4-0.6x in docs/time.md, 0.52-1.19 under 4 busy loops here).  The others'
# programs wait for a CPU on a loaded machine too, which narrows the ratio.
PROGRAMS_SLOWER = 1.15
# A host-shaped straggler's own work (its input) against the others' median.
WORK_SLOWER = 1.2


def backend_args(request, backend: str) -> tuple[list[str], str]:
    """(jaxrun's flags for the backend, the host process 2 runs on)."""
    if backend == "ssh":
        hosts = request.getfixturevalue("sshd_hosts")
        return ["-H", "hostA:2,hostB:2", "--ssh-config", hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN], \
            "hostB"
    if backend == "slurm":
        request.getfixturevalue("slurm_cluster")
        return ["--launcher", "slurm"], None
    return [], "localhost"


def top_once(run_id: str) -> str:
    done = subprocess.run([*JAXRUN, "top", "--once", "--run", run_id], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_id_of(logs) -> str:
    path = logs / "process-0.stdout"
    deadline = time.monotonic() + 120
    while not (path.exists() and path.read_text().startswith("run ")):
        assert time.monotonic() < deadline, "process 0 never printed the run's id"
        time.sleep(0.2)
    return path.read_text().split()[1]


def top_until_named(job, run_id: str) -> str:
    deadline = time.monotonic() + NAMED_WITHIN
    while True:
        if job.proc.poll() is not None:
            pytest.fail(f"the job ended before top marked a straggler: {job.proc.communicate()[1][-2000:]}")
        out = top_once(run_id)
        if "straggler" in out or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("backend, shape", [
    pytest.param(b, s, marks=() if (b, s) in IN_SUITE or os.environ.get("STRAGGLER_ALL") else
                 pytest.mark.skip(reason="one pair per backend and shape in the suite; STRAGGLER_ALL=1 runs it"))
    for b, s in PAIRS])
def test_the_straggler_is_named_with_its_host_in_top_the_summary_and_the_report(request, start_job, shared_dir,
                                                                                backend, shape):
    if shape == "throttled" and not can_throttle():
        pytest.skip("needs root and cgroup v1's cpu controller")
    flags, host = backend_args(request, backend)
    logs, report, release = shared_dir / "logs", shared_dir / "report.json", shared_dir / "release"
    job_args = [MAX_STEPS, 60, *(["2", "3"] if shape == "host" else ["--turns"]), "--until", release]
    job = start_job(*flags, "-n", 4, "--cpu-devices", 1, "--log-dir", logs, "--report", report, JOB, *job_args,
                    env={TOKEN: shared_dir.name})
    run_id = run_id_of(logs)
    if shape == "throttled":
        with throttled(find_process(f"jaxrun: process 2/4 {JOB.name}", f"{TOKEN}={shared_dir.name}", within=60), 0.05):
            shown = top_until_named(job, run_id)
            release.write_text("")
            assert job.wait(timeout=120) == 0, job.stderr
    else:
        shown = top_until_named(job, run_id)
        release.write_text("")
        assert job.wait(timeout=120) == 0, job.stderr
    data = json.loads(report.read_text())
    host = host or data["processes"][2]["host"]  # Slurm's node name for the task

    # top --once: each process's share of waiting, process 2 marked, and the line under the table.
    rows = {int(line.split()[0]): line for line in shown.splitlines()[2:] if line[:1].isdigit()}
    assert "straggler" in rows[2] and not any("straggler" in rows[r] for r in (0, 1, 3)), shown
    # Each one's share of waiting; a row ends there where its process has printed no line yet.
    assert all(re.search(r"\s\d+%(?:\s|$)", rows[r]) for r in range(4)), shown
    assert f"jaxrun: process 2 on {host} is the straggler" in shown, shown

    # While it ran, one line; the summary says it again.
    named = f"jaxrun: process 2 on {host} is the straggler"
    said = [line for line in job.stderr.splitlines() if line.startswith(named)]
    assert len(said) == 2, job.stderr

    # The report: rank, host, the others' loss, and what it spends its time on.
    found = data["straggler"]
    assert (found["rank"], found["host"]) == (2, host), found
    assert found["lost"] >= 0.10, found  # the rule's GAP: every other waited at least that much more
    shares = {p["process_id"]: p["time"]["waiting"] / p["time"]["covered"] for p in data["processes"]}
    assert shares[2] < min(shares[r] for r in (0, 1, 3)), shares
    if shape == "host":  # its input is the slow part; its programs run as fast as the others'
        # Its input takes 3x the others' wall time (1.6x read 1.44-1.58 under 4 busy loops).
        assert found["work_ratio"] > WORK_SLOWER and found["programs_ratio"] < found["work_ratio"], found
    else:  # throttled: its programs are slower too (its quota's held-back time is its programs')
        # At a quarter of a core, under 4 busy loops: 1.53, 1.58, 2.26; CI: 1.29.  With the held-back
        # time left out of the account (the rule this checks): 0.94, 1.04, 1.06.
        assert found["programs_ratio"] > PROGRAMS_SLOWER, found


def test_a_clean_job_with_ordinary_jitter_names_no_straggler(start_job, tmp_path):
    """Every process's input varies +-10% a step: each is last now and then,
    nobody is late window after window (bench/straggler.py: 10 of 10 runs)."""
    report = tmp_path / "report.json"
    job = start_job("-n", 4, "--cpu-devices", 1, "--report", report, JOB, 70, 60, "--jitter", 0.1)
    assert job.wait(timeout=120) == 0, job.stderr
    data = json.loads(report.read_text())
    # The straggler's line, not the job's file name (the host's line names straggler_job.py:59).
    assert data["straggler"] is None and "is the straggler" not in job.stderr, job.stderr
    assert len(data["attempts"][-1]["windows"]) >= 2, data["attempts"][-1]  # judged, and found nobody
    assert all(p["time"] is not None for p in data["processes"]), data["processes"]
