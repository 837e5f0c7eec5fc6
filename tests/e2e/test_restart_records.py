"""A restart that never starts: the exit status, the JSON report, JUnit and
``jaxrun logs`` give one and the same status, and the report lists the
attempt with why it did not start (issue #32).

Locally the first attempt is a real job whose process 1 fails; the restart
is then made to fail at each stage of its start-up (tests/data/restart_probe.py).
Over SSH the host itself dies: its sshd and every process on it are killed,
and the restart's preflight cannot reach it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fixtures.jobs import ROOT, TOKEN

PROBE = os.path.join(ROOT, "tests", "data", "restart_probe.py")
FAILS_ONCE = ("import os, sys\n"
              "rank = int(os.environ['JAXRUN_PROCESS_ID'])\n"
              "print('attempt', os.environ['JAXRUN_RESTART_COUNT'], 'process', rank, flush=True)\n"
              "sys.exit(7 if rank == 1 else 0)\n")


def logs_listing(base: Path, run: Path) -> str:
    """What ``jaxrun logs`` says of the run: its line in the list of runs."""
    done = subprocess.run([sys.executable, "-m", "jaxrun", "logs", "--log-dir", str(base)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    line = [x for x in done.stdout.splitlines() if x.startswith(run.name + " ")]
    assert len(line) == 1, done.stdout
    return line[0]


def check_records_agree(code: int, base: Path, run: Path, report: Path, junit: Path | None, reason: str) -> dict:
    data = json.loads(report.read_text())
    assert data["exit_code"] == code
    assert re.search(rf"  exit {code}  ", logs_listing(base, run))
    assert json.loads((run / "run.json").read_text())["exit_code"] == code
    assert data["restarts"] == 1 and len(data["attempts"]) == 2, data
    first, second = data["attempts"]
    assert first["not_started"] is None and first["root_cause"]["process_id"] == 1
    assert second["processes"] == [] and second["exit_code"] == code
    assert reason in second["not_started"], second
    if junit is not None:
        error = ET.parse(junit).getroot().find("testsuite/testcase/error")
        assert error is not None and reason in error.get("message"), junit.read_text()
    return data


STAGES = [  # (stage, the reason it gives, the status it ends with)
    ("plan", "cannot be split evenly", 2),
    ("preflight", "hostB: no answer while checking", 2),
    ("spawn", "cannot start python3 there", 2),
    ("interrupt", "stopped during start-up: SIGINT", 130),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("stage, reason, status", STAGES, ids=[s[0] for s in STAGES])
def test_a_restart_that_fails_in_its_start_up_gives_one_status_everywhere(stage, reason, status, tmp_path):
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    base, report, junit = tmp_path / "logs", tmp_path / "r.json", tmp_path / "j.xml"
    run = base / "the-run"
    job = subprocess.run([sys.executable, PROBE, "-n", "2", "--no-preload", "--max-restarts", "1",
                          "--log-dir", str(run), "--report", str(report), "--junit-xml", str(junit), str(script)],
                         capture_output=True, text=True, timeout=100, env={**os.environ, "PROBE_STAGE": stage})
    assert job.returncode == status, job.stderr
    assert "restarting the whole job (restart 1 of 1)" in job.stderr
    assert reason in job.stderr.splitlines()[-2], job.stderr  # the summary says why, before the folder
    assert job.stderr.rstrip().endswith(f"jaxrun: logs in {run}"), job.stderr
    check_records_agree(status, base, run, report, junit, reason)


STEPS = """import os, sys, time
rank = int(os.environ["JAXRUN_PROCESS_ID"])
attempt = os.environ["JAXRUN_RESTART_COUNT"]
for step in range(600):
    print("step", step, flush=True)
    if step == 6:
        open(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"reached-{attempt}-{rank}"), "w").close()
    time.sleep(0.1)
"""


@pytest.mark.timeout(120)
def test_a_restart_on_a_host_that_died_gives_one_status_everywhere(mortal_hosts, start_job, tmp_path, shared_dir):
    """The scenario of issue #32: 2 processes on hostE and hostF, hostF dies
    after step 6; the restart stops in its preflight (exit 2), and the
    report, JUnit, run.json and ``jaxrun logs`` say 2 as well."""
    script = shared_dir / "steps.py"
    script.write_text(STEPS)
    base, report, junit = tmp_path / "logs", tmp_path / "r.json", tmp_path / "j.xml"
    run = base / "the-run"
    job = start_job("-H", "hostE,hostF", "--ssh-config", mortal_hosts.config, "-x", f"PYTHONPATH={ROOT}",
                    "-x", TOKEN, "--max-restarts", 1,
                    "--log-dir", run, "--report", report, "--junit-xml", junit, script, cwd=shared_dir)
    deadline = time.monotonic() + 60
    while not (shared_dir / "reached-0-1").exists():
        assert time.monotonic() < deadline and job.proc.poll() is None, "process 1 never reached step 6"
        time.sleep(0.05)
    mortal_hosts.power_off("hostF")
    code = job.wait(timeout=90)
    assert code == 2, job.stderr
    assert "restarting the whole job (restart 1 of 1)" in job.stderr
    data = check_records_agree(2, base, run, report, junit, "hostF")
    assert data["attempts"][0]["root_cause"]["host"] == "hostF"
    assert not (shared_dir / "reached-1-0").exists()  # no process of the restart ran
