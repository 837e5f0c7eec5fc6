"""The parting check (issue 68, docs/divergence.md): a program that spans
processes, run where its peers never come, stops the job by default within
seconds, named at its lines, on every backend that runs JAX's CPU
collectives; a healthy job with a sub-mesh program and a process-local one
runs clean (bench/parting.py repeats it 20 times).

Real jobs of tests/data/parting_job.py, 3 processes x 2 CPU devices, the
stall timeout at its default (600 s): process 0 alone evaluates; every
process but 0 does; process 2 skips a step; process 0 alone gathers the
weights (multihost_utils.process_allgather, a checkpoint's way); process 0
alone evaluates again a program every process ran once, whose collective's
size differs from the step's (agreed on, it runs with no meeting and Gloo
aborts: the summary's first line is the parting, at each side's line).
Since issue 74 a program's first run waits until its whole group comes to
it: the shapes whose odd program is new are named at that meeting, before
the program ran.
Each backend's five jobs run at once (one wait for all).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from fixtures.jobs import DATA, ROOT, TOKEN

pytestmark = pytest.mark.timeout(240)

SCRIPT = DATA / "parting_job.py"
PROCESSES = 3  # the shapes need process 0, process 2 and one more
WITHIN = 15.0  # the bound, from the last process's part to the job's stop, by jaxrun's record


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(SCRIPT.read_text().splitlines(), 1) if text in line)


LOSS = line_of("loss = float(jnp.sum(w))")
EVAL0 = line_of("# process 0 alone evaluates")
EVALN = line_of("# every process but 0 evaluates")
GATHER = line_of("# process 0 alone gathers")
COLUMNS = line_of("# process 0 alone evaluates each column")
TAIL = "(a program that spans processes runs on every one of them, or on none)"
BEFORE = "(stopped before it ran: none of its collectives ran); "  # the meeting before a first run (issue 74)
TRAIN = line_of("w = train_step(w)")
# Where the processes that went on wait: in the next step's loss, or in the step itself, where
# the CPU client ran it in the calling thread (seen once under load, for process 0 of all-but-0).
WAIT = (rf"(_reduce_sum \(spanning 0-2\) at parting_job\.py:{LOSS}"
        rf"|train_step \(spanning 0-2\) at parting_job\.py:{TRAIN}) {re.escape(TAIL)}")
NAMED = {  # shape -> (the process named first, a pattern of what the headline says)
    "eval": (0, re.escape(f"process 0 came to run eval_step (spanning 0-2) at parting_job.py:{EVAL0}, which "
                          f"processes 1, 2 never reached {BEFORE}processes 1, 2 wait in ") + WAIT),
    "all-but-0": (0, re.escape(f"processes 1, 2 came to run eval_step (spanning 0-2) at parting_job.py:{EVALN}, "
                               f"which process 0 never reached {BEFORE}process 0 waits in ") + WAIT),
    "skip": (0, re.escape("process 2 finished its script; processes 0, 1 wait in ") + WAIT),
    "gather": (0, re.escape(f"process 0 came to run _identity_fn (spanning 0-2) at parting_job.py:{GATHER}, which "
                            f"processes 1, 2 never reached {BEFORE}processes 1, 2 wait in ") + WAIT),
    "columns": (0, re.escape(f"process 0 came to run eval_columns (spanning 0-2) at parting_job.py:{COLUMNS}, "
                             f"which processes 1, 2 never reached {BEFORE}processes 1, 2 wait in ") + WAIT),
}


# Where Gloo aborts on the size that differs (the columns' 1 KiB against the step's 4 bytes):
# process 0 at its line, the survivors among 1-2 at theirs (fail-fast's stack dumps).
ABORTED = (f"jaxrun: the processes parted: process 0 at parting_job.py:{COLUMNS}: print(\"eval\", "
           f"float(eval_columns(wide).sum()), flush=True)  # process 0 alone evaluates each column; ")
ABORTED_OTHERS = f" at parting_job.py:{LOSS}: loss = float(jnp.sum(w))"


def backend_flags(request, backend: str, monkeypatch) -> list:
    if backend == "no-preload":
        monkeypatch.setenv("JAXRUN_NO_PRELOAD", "1")
    elif backend == "ssh":
        hosts = request.getfixturevalue("sshd_hosts")
        return ["-H", "hostA:2,hostB:1", "--ssh-config", hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN]
    elif backend == "slurm":
        request.getfixturevalue("slurm_cluster")
        return ["--launcher", "slurm", "-n", PROCESSES]
    elif backend == "mpirun":
        if not shutil.which("mpirun"):
            pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
        monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")  # 3 processes on 2 cores
        return ["--launcher", "mpirun", "-n", PROCESSES]
    else:
        monkeypatch.delenv("JAXRUN_NO_PRELOAD", raising=False)
    return ["-n", PROCESSES]


def check_named(shape: str, code: int, stdout: str, stderr: str, report_path, host) -> None:
    """The job failed, its first process named with the parting at its lines,
    within WITHIN seconds of the last process's part (the SSH and Slurm test
    hosts are this machine: one clock)."""
    first, headline = NAMED[shape]
    aborted = re.search(r"^jaxrun: process (\d)\S* (?:on \S+ )?failed first: killed by SIGABRT", stderr, re.M)
    if aborted:  # Gloo aborted: the summary's first line is the parting, at each side's line
        first = int(aborted[1])
        assert code == 128 + 6, stderr
        summary = stderr[stderr.index("jaxrun: the processes parted: "):]
        assert summary.startswith(ABORTED), stderr
        others = [str(r) for r in range(1, PROCESSES) if r != first]
        who = f"process {others[0]}" if len(others) == 1 else f"processes {', '.join(others)}"
        assert summary.startswith(f"{ABORTED}{who}{ABORTED_OTHERS}"), stderr
        assert summary.splitlines()[1].startswith(f"jaxrun: process {first}"), stderr
    else:
        assert code == 1, stderr
        assert f"jaxrun: process {first}{host(first)} failed first: exit code 1" in stderr, stderr
        said = re.search(r"PartedProgramError: processes 0-2 parted: (.*)", stderr)
        assert said and re.fullmatch(headline, said[1]), stderr
        assert said[1].endswith(TAIL), stderr
    parted = max(float(t) for t in re.findall(r"process \d parts at ([\d.]+)", stdout))
    process = json.loads(report_path.read_text())["processes"][first]
    took = process["ended_at"] - parted
    assert took < WITHIN, f"{shape}: process {first} ended {took:.1f}s after the last part"


@pytest.mark.parametrize("backend", ["preload", "no-preload", "ssh", "slurm", "mpirun"])
def test_each_shape_of_the_parting_is_named_at_its_lines_within_seconds(request, monkeypatch, start_job,
                                                                        shared_dir, backend):
    flags = backend_flags(request, backend, monkeypatch)
    script = shutil.copy(SCRIPT, shared_dir / SCRIPT.name)
    jobs = {shape: start_job(*flags, "--cpu-devices", 2, "--report", shared_dir / f"{shape}.json",
                             "--log-dir", shared_dir / f"logs-{shape}", script, shape, cwd=shared_dir)
            for shape in NAMED}
    codes = {shape: job.wait(timeout=200) for shape, job in jobs.items()}
    host = (lambda rank: " on hostA" if rank < 2 else " on hostB") if backend == "ssh" else (lambda rank: "")
    for shape, job in jobs.items():
        check_named(shape, codes[shape], job.stdout, job.stderr, shared_dir / f"{shape}.json", host)


def test_a_sub_mesh_program_and_a_process_local_one_run_clean(start_job, tmp_path):
    job = start_job("-n", 4, "--cpu-devices", 2, SCRIPT, "healthy", cwd=tmp_path)
    assert job.wait(timeout=120) == 0, job.stderr
    assert "parted" not in job.stderr, job.stderr
    assert all(f"process {r} done" in job.stdout for r in range(4)), job.stdout
