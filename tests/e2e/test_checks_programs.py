"""The default programs check (#47, docs/divergence.md): processes that get
different programs at the same position stop the job in seconds, named at
the line that made each, whatever the stall timeout; programs that agree,
process-local ones that differ, and a warm compile cache beside a cold one
raise nothing.

Real JAX jobs of tests/data/checks_programs_job.py on CPU devices: the
guide's parted matmul (4 processes x 2 devices; process 3 runs ``y @ x``
where the others run ``x @ y``) and a parted matmul in a mesh over the
devices of processes 0-2 only, each locally in both modes and over SSH, and two
runs of an agreeing job that share a compile cache.  And what must not stop
a healthy job (#61): a thread pool's ahead-of-time compiles, each process's
workers taking the programs in another order, and a per-process constant in
a program whose collectives agree (one warning; stopped under strict).
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
from fixtures.jobs import DATA, ROOT, TOKEN

pytestmark = pytest.mark.timeout(120)

SCRIPT = DATA / "checks_programs_job.py"


def line_of(text: str) -> int:
    for number, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if text in line:
            return number
    raise AssertionError(text)


MATMUL, PARTED = line_of("z = x @ y  # the guide's matmul"), line_of("z = y @ x  # ... parted")
SQUARE, SQUARE_PARTED = line_of("# the square matmul"), line_of("# the square one, parted")
CONSTANT = line_of("# the per-process constant")
SUBSET, SUBSET_PARTED = line_of("# the subset's matmul"), line_of("z = jax.jit(matmul)(y, x)  # ... parted")
# Parting to the job's end: well under a second alone once every process has
# posted its entry (the board looks every 20 ms), GATHER_WAIT (3 s) more
# where one has not; 10 s is the bound.
WITHIN = 10.0


def check_parted_matmul(code: int, stdout: str, stderr: str, report_path, host: str = "") -> None:
    """Process 3 failed first, named with its matmul's line and the others' with
    theirs, within WITHIN seconds of the parting by jaxrun's own record."""
    assert code == 1, stderr
    assert f"jaxrun: process 3{host} failed first: exit code 1" in stderr, stderr
    headline = re.search(r"ProgramMismatchError: (.*)", stderr)
    assert headline, stderr
    assert headline[1] == (
        "program 1 of processes 0-3 differs (shapes, shardings): "
        f"process 3 made matmul(f32[4,8], f32[8,4]) sharded P(None, 'b'), P('b', None) "
        f"at checks_programs_job.py:{PARTED}; "
        f"processes 0, 1, 2 made matmul(f32[8,4], f32[4,8]) sharded P('b', None), P(None, 'b') "
        f"at checks_programs_job.py:{MATMUL}"), stderr
    assert "sharded P(None, 'b'), P('b', None)" in stderr, stderr  # each side's shardings, in its log lines
    # The time process 3 parted (the script's clock, just before its matmul)
    # to its end by jaxrun's record, the stall timeout left at its default.
    # The SSH test hosts are this machine: one clock.
    parted = float(re.search(r"process 3 parts at ([\d.]+)", stdout)[1])
    process = json.loads(report_path.read_text())["processes"][3]
    assert process["started_at"] <= parted
    took = process["ended_at"] - parted
    assert took < WITHIN, f"process 3 ended {took:.1f}s after it parted"


@pytest.mark.both_modes
def test_the_guides_parted_matmul_stops_the_job_at_its_line(launch, tmp_path):
    job = launch("-n", 4, "--cpu-devices", 2, "--report", tmp_path / "report.json", SCRIPT, "part", 3)
    code = job.wait(timeout=90)
    check_parted_matmul(code, job.stdout, job.stderr, tmp_path / "report.json")


def test_the_parted_matmul_over_ssh(sshd_hosts, start_job, tmp_path, shared_dir):
    script = shutil.copy(SCRIPT, shared_dir / SCRIPT.name)
    job = start_job("-H", "hostA:2,hostB:2", "--ssh-config", sshd_hosts.config, "-x", f"PYTHONPATH={ROOT}",
                    "-x", TOKEN, "--cpu-devices", 2, "--report", tmp_path / "report.json",
                    "--log-dir", tmp_path / "logs", script, "part", 3, cwd=shared_dir)
    code = job.wait(timeout=90)
    check_parted_matmul(code, job.stdout, job.stderr, tmp_path / "report.json", host=" on hostB")


def check_subset(code: int, stdout: str, stderr: str, host: str = "") -> None:
    assert code == 1, stderr
    assert f"jaxrun: process 2{host} failed first: exit code 1" in stderr, stderr
    assert (f"ProgramMismatchError: program 1 of processes 0-2 differs (shapes, shardings): "
            f"process 2 made matmul(f32[4,6], f32[6,4]) sharded P(None, 'b'), P('b', None) "
            f"at checks_programs_job.py:{SUBSET_PARTED}; "
            f"processes 0, 1 made matmul(f32[6,4], f32[4,6]) sharded P('b', None), P(None, 'b') "
            f"at checks_programs_job.py:{SUBSET}") in stderr, stderr
    assert "process 3: own 360.0" in stdout  # its own program, compared with nobody's


@pytest.mark.both_modes
def test_a_mesh_over_some_processes_compares_among_them_only(launch, tmp_path):
    job = launch("-n", 4, "--cpu-devices", 2, SCRIPT, "subset")
    check_subset(job.wait(timeout=90), job.stdout, job.stderr)


def test_a_mesh_over_some_processes_over_ssh(sshd_hosts, start_job, tmp_path, shared_dir):
    script = shutil.copy(SCRIPT, shared_dir / SCRIPT.name)
    job = start_job("-H", "hostA:2,hostB:2", "--ssh-config", sshd_hosts.config, "-x", f"PYTHONPATH={ROOT}",
                    "-x", TOKEN, "--cpu-devices", 2, "--log-dir", tmp_path / "logs", script, "subset",
                    cwd=shared_dir)
    check_subset(job.wait(timeout=90), job.stdout, job.stderr, host=" on hostB")


def test_a_parting_only_the_shardings_tell_shows_each_sides_shardings(start_job):
    """Square matrices: x @ y and y @ x have the same shapes, so the line
    shows the shardings that differ, each side its own (#56)."""
    job = start_job("-n", 4, "--cpu-devices", 2, SCRIPT, "square", 3)
    code = job.wait(timeout=90)
    assert code == 1, job.stderr
    assert "jaxrun: process 3 failed first: exit code 1" in job.stderr, job.stderr
    assert re.search(r"ProgramMismatchError: (.*)", job.stderr)[1] == (
        "program 1 of processes 0-3 differs (shardings): "
        f"process 3 made matmul(f32[8,8], f32[8,8]) sharded P(None, 'b'), P('b', None) "
        f"at checks_programs_job.py:{SQUARE_PARTED}; "
        f"processes 0, 1, 2 made matmul(f32[8,8], f32[8,8]) sharded P('b', None), P(None, 'b') "
        f"at checks_programs_job.py:{SQUARE}"), job.stderr


def test_a_thread_pools_ahead_of_time_compiles_never_stop_a_healthy_job(start_job):
    """Ten rounds in one job, each a new ThreadPoolExecutor(2) compiling four
    new programs whose collectives differ, process 1's first compile 0.5 s
    late: which worker compiles which program differs between the processes
    in most rounds (main at 1a3dff5 stopped such a job in 2 of 3 runs).
    Every round must pass: ten of ten."""
    job = start_job("-n", 2, "--cpu-devices", 2, SCRIPT, "pool", 10)
    assert job.wait(timeout=110) == 0, job.stderr
    for rank in range(2):
        assert len(re.findall(rf"process {rank}: round \d+ ", job.stdout)) == 10, job.stdout
    assert "Mismatch" not in job.stderr and "warning" not in job.stderr, job.stderr


def test_a_per_process_constant_is_one_warning_and_stopped_only_under_strict(start_job):
    """x * (jax.process_index() + 1): the bodies differ, the collectives agree,
    so the processes do not wait on it differently: the job goes on with one
    warning; --checks strict stops it, showing each side's program."""
    on, strict = (start_job("-n", 2, "--cpu-devices", 2, *mode, SCRIPT, "constant")
                  for mode in ((), ("--checks", "strict")))
    assert on.wait(timeout=90) == 0, on.stderr
    assert on.stdout.count("total 50.0") == 2, on.stdout
    warned = [line for line in on.stderr.splitlines() if "warning" in line]
    assert len(warned) == 1 and "Mismatch" not in on.stderr, on.stderr
    assert re.fullmatch(r"\[0\] jaxrun: warning: program 1 of processes 0,1 differs in its body only, not in its "
                        r"collectives \(a per-process constant, a local operation\): "
                        rf"process 0 made <lambda>\(f32\[8\]\) at checks_programs_job.py:{CONSTANT} \[program \w+\]; "
                        rf"process 1 made <lambda>\(f32\[8\]\) at checks_programs_job.py:{CONSTANT} \[program \w+\]; "
                        r"the processes do not wait on it differently, so the job goes on \(--checks strict stops it\)",
                        warned[0]), warned[0]
    assert strict.wait(timeout=90) == 1, strict.stderr
    assert re.search(rf"ProgramMismatchError: program 1 of processes 0,1 differs \(body\): "
                     rf"process 0 made <lambda>\(f32\[8\]\) \[program (\w+)\] at checks_programs_job.py:{CONSTANT}; "
                     rf"process 1 made <lambda>\(f32\[8\]\) \[program (?!\1)\w+\] at checks_programs_job.py:{CONSTANT}",
                     strict.stderr), strict.stderr


@pytest.mark.timeout(300)
def test_under_strict_a_short_job_is_stopped_however_its_ends_fall_on_a_loaded_machine(start_job):
    """The verdict never depends on timing: four strict jobs at once beside
    four busy loops, each ending right after its one program, are each
    stopped and named (the board once took a peer that posted and finished
    between its two reads for one that never made the program: exit 0, no
    word; tests/unit/test_checks.py pins that order, bench/strict_checks.py
    runs 50)."""
    from fixtures.jobs import overload

    with overload(4):
        jobs = [start_job("-n", 2, "--cpu-devices", 2, "--checks", "strict", SCRIPT, "constant") for _ in range(4)]
        ends = [job.wait(timeout=110) for job in jobs]
    for job, end in zip(jobs, ends):
        assert end == 1, job.stderr
        assert "ProgramMismatchError: program 1 of processes 0,1 differs (body)" in job.stderr, job.stderr


def test_agreeing_programs_a_local_one_that_differs_and_a_warm_cache_beside_a_cold_one(start_job, tmp_path):
    """The first run fills the cache; in the second, process 0 gets every
    program from it and process 1 (an empty cache) compiles them: both must
    count them alike, or the salted program, new to both, would sit at
    different positions and stop the job.  So too process 0's own replicated
    mean (over every device, without a collective) must not be counted."""
    seen = {}
    for run, cold in ((1, -1), (2, 1)):
        job = start_job("-n", 2, "--cpu-devices", 2, SCRIPT, "agree", tmp_path / "cache", cold, run)
        assert job.wait(timeout=90) == 0, job.stderr
        assert "--checks" not in job.stderr and "Mismatch" not in job.stderr, job.stderr
        seen[run] = dict(re.findall(r"process (\d): .* hits (\d+)", job.stdout))
        assert "process 0 logs 4.5" in job.stdout
    assert seen[2]["0"] != "0" and seen[2]["1"] == "0", seen  # process 0 warm, process 1 cold


def test_a_jax_without_the_hook_point_is_said_once_and_refused_only_under_strict(start_job, tmp_path):
    site = tmp_path / "site" / "jax"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text('__version__ = "0.0.1"\n')
    script = tmp_path / "uses_jax.py"
    script.write_text("import jax\nprint('ran on', jax.__version__)\n")
    env = {"PYTHONPATH": str(tmp_path / "site"), "JAXRUN_NO_PRELOAD": "1"}  # the server would import the real one
    on, strict = (start_job("-n", 2, *mode, script, env=env) for mode in ((), ("--checks", "strict")))
    assert on.wait(timeout=60) == 0, on.stderr
    said = [line for line in on.stderr.splitlines() if "programs are not compared" in line]
    assert said == ["[0] jaxrun: --checks: programs are not compared on jax 0.0.1: "
                    "jax._src.interpreters.pxla.UnloadedMeshExecutable.from_hlo not found (tested with jax 0.10.2)"], \
        on.stderr
    assert on.stdout.count("ran on 0.0.1") == 2
    assert strict.wait(timeout=60) == 1, strict.stderr
    assert "ran on" not in strict.stdout
    assert ("RuntimeError: --checks strict cannot compare programs on jax 0.0.1: "
            "jax._src.interpreters.pxla.UnloadedMeshExecutable.from_hlo not found") in strict.stderr, strict.stderr
