"""--launcher slurm: one real srun step on a throwaway one-node Slurm cluster.

Also the batch recipe examples/deploy/slurm.sbatch, submitted with sbatch.
"""

import os
import shlex
import socket
import subprocess
import sys
import time

import pytest
from fixtures.engines import (
    check_crash_in_task_3,
    check_logs_hold_every_byte,
    check_ranks_come_from_the_scheduler,
    check_timeout_stops_the_step,
    check_toy,
)
from fixtures.guide import GUIDE_SHARDS, RESULT
from fixtures.jobs import ROOT

# This machine has fewer CPUs than processes.
SLURM = ["--launcher", "slurm"]


@pytest.mark.timeout(90)
def test_toy_matches_the_guide(slurm_cluster, run_jaxrun, tmp_path):
    check_toy(run_jaxrun, SLURM, tmp_path)


@pytest.mark.timeout(60)
def test_crash_in_task_3_ends_the_step_and_is_named(slurm_cluster, run_jaxrun, tmp_path):
    check_crash_in_task_3(run_jaxrun, SLURM, tmp_path)


@pytest.mark.timeout(60)
def test_timeout_dumps_stacks_and_stops_the_step(slurm_cluster, run_jaxrun, tmp_path):
    check_timeout_stops_the_step(run_jaxrun, SLURM, tmp_path)


@pytest.mark.timeout(60)
def test_each_task_takes_its_rank_from_srun(slurm_cluster, run_jaxrun, tmp_path):
    check_ranks_come_from_the_scheduler(run_jaxrun, SLURM, tmp_path, "SLURM_STEP_ID", "SLURM_PROCID")


@pytest.mark.timeout(60)
def test_logs_hold_every_byte(slurm_cluster, run_jaxrun, tmp_path):
    check_logs_hold_every_byte(run_jaxrun, SLURM, tmp_path)


def job_state(job_id: str, env: dict, within: float) -> dict[str, str]:
    """The job's fields once it has ended, as ``scontrol show job`` gives them."""
    deadline = time.monotonic() + within
    while True:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True, check=True)
        fields = dict(word.split("=", 1) for word in shown.stdout.split() if "=" in word)
        if fields["JobState"] not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return fields
        assert time.monotonic() < deadline, f"job {job_id} still {fields['JobState']} after {within} s"
        time.sleep(0.2)


@pytest.mark.timeout(90)
def test_batch_recipe_runs_the_toy_under_sbatch(slurm_cluster, tmp_path):
    # The recipe runs `python` from PATH, as users' jobs do.  A wrapper that
    # execs this interpreter (a symlink would lose a virtual environment)
    # makes that `python` the one under test on any machine.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    # The recipe's coordinator is the first node's name, as scontrol gives it.
    # Bind it to what that name resolves to, never all interfaces (JAX's
    # default): on this machine and most others, a loopback address.
    address = socket.gethostbyname(socket.gethostname())
    with socket.socket() as probe:
        probe.bind((address, 0))
        port = probe.getsockname()[1]
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": "2",
        "JAXRUN_PORT": str(port),
        "JAXRUN_COORDINATOR_BIND_ADDRESS": f"{address}:{port}",
    }
    job_out = tmp_path / "job.out"
    # The cluster has one node: the command line overrides the recipe's #SBATCH --nodes=2.
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=4", f"--output={job_out}", f"--chdir={ROOT}",
         str(ROOT / "examples" / "deploy" / "slurm.sbatch"), "examples/toy.py"],
        env=env, capture_output=True, text=True, check=True,
    )
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        # Polled here: sbatch --wait checks only every few seconds, up to 10.
        state = job_state(job_id, env, within=75)
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True)  # still running when the test failed
    out = job_out.read_text() if job_out.exists() else ""
    assert (state["JobState"], state["ExitCode"]) == ("COMPLETED", "0:0"), (state, out)
    for rank, shards in GUIDE_SHARDS.items():
        # srun --label: each line starts with the task that wrote it.
        mine = "\n".join(line.split(": ", 1)[1] for line in out.splitlines() if line.startswith(f"{rank}: "))
        # Substrings, not whole lines: Gloo's C++ threads write their noise
        # between a print's text and its newline when the machine is busy.
        for expected in [*shards, f"process={rank} {RESULT}"]:
            assert expected in mine, (rank, expected, out)
