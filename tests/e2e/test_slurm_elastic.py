"""Elastic restarts under Slurm, on the one-node test cluster (issue #30).

jaxrun runs inside an allocation (``salloc --no-kill``), as an elastic job
must: before a restart it asks Slurm for the state of the allocation's
nodes and leaves out those down, drained, failing or not responding
(``srun --exclude``).  With one node, losing it is faked the way an admin
would take a node away: ``scontrol update state=drain`` while the job runs.
The node is resumed afterwards, whatever happens, for the other tests.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

FAILS_ONCE = """import os, sys, time
rank = int(os.environ["JAXRUN_PROCESS_ID"])
attempt = int(os.environ["JAXRUN_RESTART_COUNT"])
here = os.path.dirname(os.path.abspath(__file__))
print("attempt", attempt, "process", rank, "of", os.environ["JAXRUN_NUM_PROCESSES"], flush=True)
if attempt == 0:
    open(os.path.join(here, f"started-{rank}"), "w").close()
    if rank == 1:
        while not os.path.exists(os.path.join(here, "go")):
            time.sleep(0.05)
        sys.exit(3)
    time.sleep(60)
"""


def salloc_jaxrun(tmp_path, env, *flags):
    script = tmp_path / "fails_once.py"
    script.write_text(FAILS_ONCE)
    report = tmp_path / "report.json"
    argv = ["salloc", "-N1", "-n2", "--no-kill", "--", sys.executable, "-m", "jaxrun", "--launcher", "slurm", "-n", "2",
            "--max-restarts", "1", "--min-hosts", "1", "--report", str(report), "--log-dir", str(tmp_path / "logs"),
            *flags, str(script)]
    job = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    return job, report


def wait_for(path, job, within=60.0):
    deadline = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < deadline and job.poll() is None, f"no {path.name}: {job.stderr.read()}"
        time.sleep(0.05)


def finish(job, timeout=90) -> tuple[int, str]:
    try:
        _, err = job.communicate(timeout=timeout)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
            job.wait()
    return job.returncode, err


def scontrol(env, *words) -> None:
    subprocess.run(["scontrol", "update", *words], env=env, check=True, capture_output=True, timeout=30)


@pytest.mark.timeout(120)
def test_a_restart_inside_an_allocation_runs_on_its_nodes_that_answer(slurm_cluster, tmp_path):
    node = socket.gethostname()
    job, report = salloc_jaxrun(tmp_path, slurm_cluster)
    wait_for(tmp_path / "started-1", job)
    (tmp_path / "go").touch()
    code, err = finish(job)
    assert code == 0, err
    assert f"jaxrun: restart 1 of 1 on {node}\n" in err, err
    after = json.loads(report.read_text())["attempts"][1]
    assert after["dropped"] == [] and after["num_processes"] == 2 and after["exit_code"] == 0


@pytest.mark.timeout(120)
def test_a_drained_node_is_left_out_and_below_min_hosts_the_run_stops_naming_it(slurm_cluster, tmp_path):
    node = socket.gethostname()
    job, report = salloc_jaxrun(tmp_path, slurm_cluster)
    try:
        wait_for(tmp_path / "started-1", job)
        scontrol(slurm_cluster, f"nodename={node}", "state=drain", "reason=elastic-test")
        (tmp_path / "go").touch()
        code, err = finish(job)
    finally:
        scontrol(slurm_cluster, f"nodename={node}", "state=resume")
    assert code == 3, err
    assert (f"jaxrun: not restarting: 0 hosts left (none), fewer than --min-hosts 1 "
            f"({node} lost: Slurm says draining (elastic-test))") in err, err
    data = json.loads(report.read_text())
    assert data["exit_code"] == 3 and len(data["attempts"]) == 1 and node in data["not_restarted"]
    deadline = time.monotonic() + 30  # the node serves the next test
    while subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], env=slurm_cluster, capture_output=True,
                         text=True).stdout.strip() != "idle":
        assert time.monotonic() < deadline, "the node did not come back to idle"
        time.sleep(0.2)
