"""Agreement on what runs (issue 74, docs/divergence.md): before a process
first runs a program that spans processes, its whole group comes to the same
program, so the commonest mistake is stopped before any of the odd program's
collectives runs, named at its line, and a healthy job is never stopped.

Real jobs of tests/data/meeting_job.py (a user's training loop: batches from
``make_array_from_process_local_data``, a jitted step), with CPU devices, on
both local modes and under mpirun, every job of a backend at once (one wait
for all): process 0 alone evaluates in the middle of training, on 2 and on 4
processes; process 0 alone reads an element of a result op by op (indexing,
a sum, a transfer) while the other finishes; every process but 0 evaluates;
one process skips a step; and one healthy job with every shape that must
not stop it (every process evaluates, process 0 alone on its own data,
process 0 alone compiles ahead and never runs it, a program compiled ahead
by a thread pool in another order on each process and run later by all, a
background thread that reads shards back and runs programs while the main
thread trains).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from fixtures.jobs import DATA

pytestmark = pytest.mark.timeout(300)

SCRIPT = DATA / "meeting_job.py"
STEPS, PART = 8, 3
# From the last process's part to the job's stop by jaxrun's record: the bound.  What it
# takes: the others' wait (3 s, the parting check's) and two looks 0.5 s apart, on a loaded machine.
WITHIN = 10.0


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


LOSS, EVAL0 = line_of("loss = float(loss)"), line_of("# process 0 alone evaluates")
EVALN, ELEMENT = line_of("# every process but 0 evaluates"), line_of("# process 0 alone reads an element")
BEFORE = "(stopped before it ran: none of its collectives ran)"
TAIL = "(a program that spans processes runs on every one of them, or on none)"
def met(group: str, came: str, fn: str, line: int, lacking: str, rest: str) -> str:
    """The headline of a parting at a meeting: who came to run what, where; who never did; where the rest are."""
    return (f"processes {group} parted: {came} came to run {fn} (spanning {group}) at meeting_job.py:{line}, "
            f"which {lacking} never reached {BEFORE}; {rest} {TAIL}")


STOPPED = {  # job -> (processes, shape, the process named first, its headline)
    "eval-2": (2, "eval", 0, met("0,1", "process 0", "evaluate", EVAL0, "process 1",
                                 f"process 1 waits at meeting_job.py:{LOSS}")),
    "eval-4": (4, "eval", 0, met("0-3", "process 0", "evaluate", EVAL0, "processes 1, 2, 3",
                                 f"processes 1, 2, 3 wait at meeting_job.py:{LOSS}")),
    "element": (2, "element", 0, met("0,1", "process 0", "gather", ELEMENT, "process 1",
                                     "process 1 finished its script")),
    "all-but-0": (2, "all-but-0", 0, met("0,1", "process 1", "evaluate", EVALN, "process 0",
                                         f"process 0 waits at meeting_job.py:{LOSS}")),
    "skip": (2, "skip", 0, f"processes 0,1 parted: process 0 waits at meeting_job.py:{LOSS}; process 1 finished its "
                           f"script {TAIL}"),
}


def flags(backend: str, monkeypatch, count: int) -> list:
    if backend == "mpirun":
        if not shutil.which("mpirun"):
            pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
        monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")  # 4 processes on 2 cores
        return ["--launcher", "mpirun", "-n", count]
    if backend == "no-preload":
        monkeypatch.setenv("JAXRUN_NO_PRELOAD", "1")
    else:
        monkeypatch.delenv("JAXRUN_NO_PRELOAD", raising=False)
    return ["-n", count]


def check_stopped(name: str, code: int, stdout: str, stderr: str, report_path) -> None:
    """Named first with its headline, within WITHIN seconds of the last part;
    where the odd program is new, stopped before it ran: no step after the
    part, and no process that still trained finished."""
    count, shape, first, headline = STOPPED[name]
    assert code == 1, stderr
    assert f"jaxrun: process {first} failed first: exit code 1" in stderr, stderr
    said = re.search(r"PartedProgramError: (.*)", stderr)
    assert said and said[1] == headline, stderr
    parted = max(float(t) for t in re.findall(r"process \d parts at ([\d.]+)", stdout))
    took = json.loads(report_path.read_text())["processes"][first]["ended_at"] - parted
    assert took < WITHIN, f"{name}: process {first} ended {took:.1f}s after the last part"
    if shape in ("eval", "all-but-0"):
        assert not re.search(rf"step {PART + 1} |^\[\d\] eval |done", stdout, re.M), stdout
    if shape == "element":
        assert "element" not in stdout and "process 0 done" not in stdout, stdout


def check_healthy(code: int, stdout: str, stderr: str, count: int) -> None:
    assert code == 0, stderr
    assert "parted" not in stderr and "differs" not in stderr, stderr
    for rank in range(count):
        for said in ("eval", "later", "warmed", f"process {rank} done", f"process {rank} background"):
            assert re.search(rf"^\[{rank}\] {said}", stdout, re.M), stdout
    assert "[0] analysis True True" in stdout and "[0] local 84.0" in stdout, stdout


BACKENDS = ["preload", "no-preload", "mpirun"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_program_some_never_come_to_is_stopped_before_it_runs_named_at_its_line(monkeypatch, start_job, tmp_path,
                                                                                  backend):
    jobs = {name: start_job(*flags(backend, monkeypatch, count), "--cpu-devices", 2, "--report",
                            tmp_path / f"{name}.json", SCRIPT, shape, STEPS, cwd=tmp_path)
            for name, (count, shape, _, _) in STOPPED.items()}
    codes = {name: job.wait(timeout=240) for name, job in jobs.items()}
    for name, job in jobs.items():
        check_stopped(name, codes[name], job.stdout, job.stderr, tmp_path / f"{name}.json")


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiles_ahead_pools_and_a_background_thread_never_stop_a_healthy_job(monkeypatch, start_job, tmp_path,
                                                                               backend):
    healthy = start_job(*flags(backend, monkeypatch, 2), "--cpu-devices", 2, SCRIPT, "healthy", STEPS, cwd=tmp_path)
    check_healthy(healthy.wait(timeout=240), healthy.stdout, healthy.stderr, 2)
