"""JAX's preemption sync point under jaxrun: a SIGTERM to jaxrun reaches
every controller as a preemption notice, every one saves at the same step
and exits 0, and jaxrun still exits 143 (an interrupted run, for a
Kubernetes Job or a Slurm requeue).  docs/backends.md has the recipe with
orbax; the marker file stands in for its save here."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from fixtures.jobs import ROOT, TOKEN

JOB = Path(ROOT) / "tests" / "data" / "preemption_job.py"


def wait_for(folder: Path, prefix: str, count: int, job, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while len(list(folder.glob(prefix + "*"))) < count:
        assert job.proc.poll() is None, job.wait()
        assert time.monotonic() < deadline, f"no {count} {prefix} files in {folder}"
        time.sleep(0.05)


def check_saved(folder: Path, report: Path, count: int) -> None:
    steps = {(folder / f"saved-{rank}").read_text() for rank in range(count)}
    assert len(steps) == 1, steps  # one step, the same on every process
    processes = json.loads(report.read_text())["processes"]
    assert [(p["exit_code"], p["signal"]) for p in processes] == [(0, None)] * count


@pytest.mark.timeout(120)
def test_every_process_saves_at_the_same_step_locally(launch, tmp_path):
    out, report = tmp_path / "out", tmp_path / "r.json"
    out.mkdir()
    job = launch("-n", 2, "--cpu-devices", 1, "--grace", 20, "--report", report, JOB, out)
    wait_for(out, "running-", 2, job)
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(timeout=60) == 143, job.stderr
    check_saved(out, report, 2)
    assert "jaxrun: stopped on SIGTERM; every process exited 0 within" in job.stderr


@pytest.mark.timeout(120)
def test_every_process_saves_at_the_same_step_over_ssh(sshd_hosts, start_job, tmp_path, shared_dir):
    out, report = shared_dir / "out", tmp_path / "r.json"
    out.mkdir()
    job = start_job("-H", "hostA,hostB", "--ssh-config", sshd_hosts.config, "-x", f"PYTHONPATH={ROOT}",
                    "-x", TOKEN, "--cpu-devices", 1, "--grace", 20, "--report", report, JOB, out, cwd=shared_dir)
    wait_for(out, "running-", 2, job)
    job.proc.send_signal(signal.SIGTERM)
    assert job.wait(timeout=60) == 143, job.stderr
    check_saved(out, report, 2)
