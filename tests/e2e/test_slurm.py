"""--launcher slurm: one real srun step on a throwaway Slurm cluster (one node,
and a partition of four for the allocation tests).

Also the batch recipe examples/deploy/slurm.sbatch, submitted with sbatch, a
4-node --export=NONE allocation that jaxrun fills, and srun running jaxrun.
"""

import concurrent.futures
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time

import pytest
from fixtures.engines import (
    check_engine_failure_named_once,
    check_logs_hold_every_byte,
    check_ranks_come_from_the_scheduler,
    check_toy,
)
from fixtures.guide import GUIDE_SHARDS, RESULT
from fixtures.jobs import ROOT
from fixtures.slurm import WIDE, WIDE_NODES

from jaxrun import portable

# This machine has fewer CPUs than processes.
SLURM = ["--launcher", "slurm"]


@pytest.mark.timeout(90)
def test_toy_matches_the_guide(slurm_cluster, run_jaxrun, tmp_path):
    check_toy(run_jaxrun, SLURM, tmp_path)




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
        shown = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=env, capture_output=True, text=True,
                               check=True)
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
    port = portable.free_port(address)  # below the ephemeral range: no outgoing connection takes it first
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


# What each task was told about its devices, as one marked JSON line; it
# imports no jax (this machine has no accelerator: the variable is the check).
DEVICE_PROBE = """\
import json, os
names = ("JAX_LOCAL_DEVICE_IDS", "JAXRUN_PROCESS_ID", "JAXRUN_LOCAL_PROCESS_ID", "JAXRUN_TASK_DEVICES_PER_PROCESS")
print("device-probe " + json.dumps({n: os.environ.get(n) for n in names}))
"""


def devices_seen(logs, ranks: int) -> dict[int, dict]:
    seen = {}
    for rank in range(ranks):
        text = (logs / f"process-{rank}.stdout").read_text()
        (line,) = [line for line in text.splitlines() if line.startswith("device-probe ")]
        seen[rank] = json.loads(line.removeprefix("device-probe "))
    return seen


@pytest.mark.timeout(60)
def test_devices_per_process_come_from_the_local_rank_srun_gives(slurm_cluster, run_jaxrun, tmp_path):
    script = tmp_path / "devices.py"
    script.write_text(DEVICE_PROBE)
    logs = tmp_path / "logs"
    code, _, err, _ = run_jaxrun(*SLURM, "-n", 2, "--devices-per-process", 3, "--log-dir", logs, script)
    assert code == 0, err
    seen = devices_seen(logs, 2)
    # One node: srun's local ranks are 0 and 1, so each task owns its own three devices.
    assert {seen[r]["JAXRUN_LOCAL_PROCESS_ID"]: seen[r]["JAX_LOCAL_DEVICE_IDS"] for r in seen} == \
        {"0": "0,1,2", "1": "3,4,5"}
    assert all(s["JAXRUN_TASK_DEVICES_PER_PROCESS"] is None for s in seen.values())  # the agent's, not the script's


@pytest.mark.timeout(60)
@pytest.mark.parametrize("engine", ["slurm", "mpirun"])
def test_the_nodes_gpus_are_split_by_the_local_rank_the_engine_gives(request, run_jaxrun, tmp_path, monkeypatch,
                                                                     engine):
    """No GPU binding (Open MPI binds none; srun without --gpus-per-task): the
    four GPUs the tasks see are split between the node's two tasks by the
    local rank the engine gave each, never all four in each."""
    if engine == "slurm":
        request.getfixturevalue("slurm_cluster")
    elif not shutil.which("mpirun"):
        pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the node's GPUs, as a step with --gres=gpu:4 sees them
    script = tmp_path / "devices.py"
    script.write_text(DEVICE_PROBE)
    logs = tmp_path / "logs"
    code, _, err, _ = run_jaxrun("--launcher", engine, "-n", 2, "--log-dir", logs, script)
    assert code == 0, err
    seen = devices_seen(logs, 2)
    assert {seen[r]["JAXRUN_LOCAL_PROCESS_ID"]: seen[r]["JAX_LOCAL_DEVICE_IDS"] for r in seen} == \
        {"0": "0,1", "1": "2,3"}, seen


@pytest.mark.timeout(30)
def test_dry_run_claims_no_device_ids_the_scheduler_decides(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    proc = subprocess.run([sys.executable, "-m", "jaxrun", *SLURM, "-n", "2", "--devices-per-process", "2", "--dry-run",
                           str(script)], capture_output=True, text=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert "JAX_LOCAL_DEVICE_IDS" not in proc.stdout, proc.stdout
    assert proc.stdout.count("JAXRUN_TASK_DEVICES_PER_PROCESS=2") == 2, proc.stdout


# The engine's own options, then --scheduler-arg's, then the task agent (which runs the shim).
ENGINE_LINES = {
    "slurm": ["srun", "--kill-on-bad-exit=1", "--ntasks=4", "--export=ALL", "--cpus-per-task=3",
              "--ntasks-per-node=2", "--overcommit"],
    "mpirun": ["mpirun", "-n", "4", "--map-by", "ppr:2:node"],
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("engine", ENGINE_LINES)
def test_the_dry_run_prints_the_engines_command_line(tmp_path, engine):
    script = tmp_path / "t.py"
    script.write_text("")
    # Inside an allocation of 3 CPUs a task (srun names no job of its own there).
    env = {**os.environ, "SLURM_JOB_ID": "7", "SLURM_CPUS_PER_TASK": "3", "XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    proc = subprocess.run([sys.executable, "-m", "jaxrun", "--launcher", engine, "-n", "4", "--ntasks-per-node", "2",
                           "--scheduler-arg=--overcommit", "--dry-run", str(script)],
                          capture_output=True, text=True, timeout=20, env=env)
    assert proc.returncode == 0, proc.stderr
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("# ")]
    program, _, command = line.removeprefix("# ").partition(": ")
    argv = shlex.split(command)
    assert program == argv[0] == ENGINE_LINES[engine][0], line
    agent = argv.index(sys.executable)
    assert argv[agent:agent + 4] == [sys.executable, "-m", "jaxrun.backends.scheduler.task_agent", "--"], argv
    assert argv[-1] == str(script) and argv[agent - 1] == "--overcommit", argv
    if engine == "slurm":
        assert argv[:agent] == ENGINE_LINES[engine], argv
    else:  # then what mpirun must carry to other nodes, by name, and root's permission
        assert argv[:5] == ENGINE_LINES[engine], argv
        named = {argv[i + 1] for i, word in enumerate(argv[:agent]) if word == "-x"}
        assert {"XLA_FLAGS", "PATH", "JAXRUN_TASK_CHANNEL", "JAXRUN_TASK_SECRET", "JAXRUN_NUM_PROCESSES"} <= named, argv


@pytest.mark.timeout(60)
def test_srun_failing_for_all_processes_is_named_once(slurm_cluster, run_jaxrun, tmp_path):
    # A step on a node the cluster does not have: srun fails before any task starts.
    check_engine_failure_named_once(run_jaxrun, [*SLURM, "--scheduler-arg=--nodelist=nosuchnode"], tmp_path,
                                    "srun", 16, "Invalid node name specified")


SAVER = ROOT / "tests" / "data" / "sigterm_saver.py"  # its SIGTERM handler takes 1 s to save


# How a batch job that runs jaxrun is stopped, and what comes of it (docs/backends.md,
# "Stopping a job"): jaxrun's exit status, and the job's state as Slurm records it.
SCANCEL = {
    "the whole job": (["scancel"], 143, "CANCELLED"),
    "the whole job, every process": (["scancel", "--full"], 143, "CANCELLED"),
    "the steps only": (["scancel", "--signal=TERM"], 0, "COMPLETED"),
    "the batch script only": (["scancel", "--batch", "--signal=TERM"], 143, "FAILED"),
    "everything, signal only": (["scancel", "--full", "--signal=TERM"], 143, "FAILED"),
}


def stopped_by_scancel(tmp_path, how: str) -> tuple[dict, set, int, list, str]:
    """One batch job stopped as ``how`` says: its fields as Slurm records
    them, who saved, jaxrun's exit status and each process's end, and the
    job's output."""
    command, _, _ = SCANCEL[how]
    out, report = tmp_path / "out", tmp_path / "report.json"
    out.mkdir()
    batch = tmp_path / "job.sh"
    words = [sys.executable, "-m", "jaxrun", "--launcher", "slurm", "-n", "4", "--grace", "20",
             "--log-dir", tmp_path / "logs", "--report", report, SAVER, out, "{process_id}"]
    batch.write_text("#!/bin/sh\nexec " + shlex.join(map(str, words)) + "\n")
    env = dict(os.environ)
    submitted = subprocess.run(["sbatch", "--parsable", "-n", "4", f"--output={tmp_path / 'job.out'}", str(batch)],
                               env=env, capture_output=True, text=True, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 60
        while len(list(out.glob("running-*"))) < 4:
            assert time.monotonic() < deadline, (how, job_id, sorted(p.name for p in out.iterdir()))
            time.sleep(0.05)
        subprocess.run([*command, job_id], env=env, check=True)
        fields = job_state(job_id, env, within=30)
    finally:
        subprocess.run(["scancel", job_id], env=env, capture_output=True)
    said = (tmp_path / "job.out").read_text(errors="replace") if (tmp_path / "job.out").exists() else ""
    ran = json.loads(report.read_text())
    return (fields, {p.name for p in out.glob("saved-*")}, ran["exit_code"],
            [(p["exit_code"], p["signal"]) for p in ran["processes"]], said)


@pytest.mark.timeout(150)
def test_scancel_gives_every_controller_its_time(slurm_cluster, tmp_path):
    """jaxrun as the batch script (``exec``), its 4 controllers saving for 1 s
    on SIGTERM: however scancel stops the job, every controller saves
    (srun does not cut the step short; KillWait is 2 s here), and jaxrun's
    status says whether it was signalled itself.  One job per way, two side
    by side (each takes 4 of a node's 8 CPUs), each in a folder of its own."""
    folders = {how: tmp_path / f"job-{i}" for i, how in enumerate(SCANCEL)}
    for folder in folders.values():
        folder.mkdir()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        seen = dict(zip(SCANCEL, pool.map(stopped_by_scancel, folders.values(), SCANCEL)))
    for how, (fields, saved, code, ends, said) in seen.items():
        _, status, state = SCANCEL[how]
        assert fields["JobState"] == state, (how, fields, said)
        assert sorted(saved) == [f"saved-{r}" for r in range(4)], (how, said)
        assert code == status, (how, said)
        assert ends == [(0, None)] * 4, (how, said)


# Each process says where Slurm put it.
WHERE_PROBE = """\
import os
print("where", os.environ["JAXRUN_PROCESS_ID"], os.environ["SLURMD_NODENAME"], os.environ.get("JAX_PLATFORMS"))
"""


@pytest.fixture(scope="module")
def wide_allocation(slurm_cluster, tmp_path_factory):
    """One ``sbatch -p wide -N 4 --export=NONE`` job, whose batch script runs
    jaxrun with no -n, twice: a dry run, then the probe.  Slurm sets
    SLURM_NNODES=4 and SLURM_TASKS_PER_NODE=1(x4) there, no SLURM_NTASKS, and
    SLURM_EXPORT_ENV=NONE, which srun would take.  Yields the folder with
    the dry run's output (dry.out), the run's report and logs, job.out, and
    the job's final fields."""
    where = tmp_path_factory.mktemp("wide")
    (where / "where.py").write_text(WHERE_PROBE)
    jaxrun = [sys.executable, "-m", "jaxrun", "--launcher", "slurm"]
    run = [*jaxrun, "--log-dir", where / "logs", "--report", where / "report.json", where / "where.py"]
    # --export=NONE: the batch script gets nothing of this environment (as
    # root, Slurm gives it root's login environment instead).
    (where / "job.sh").write_text(
        "#!/bin/sh\nexport JAX_PLATFORMS=cpu\nenv > batch.env\n"
        f"{shlex.join(map(str, [*jaxrun, '--dry-run', where / 'where.py']))} > dry.out 2>&1\n"
        f"exec {shlex.join(map(str, run))}\n")
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--partition={WIDE}", f"--nodes={WIDE_NODES}", "--export=NONE",
         f"--chdir={where}", f"--output={where / 'job.out'}", str(where / "job.sh")],
        capture_output=True, text=True, check=True)
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        fields = job_state(job_id, dict(os.environ), within=75)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)
    yield where, fields


def said(where) -> str:
    return "\n".join(f"{name}:\n" + (where / name).read_text(errors="replace")
                     for name in ("job.out", "dry.out") if (where / name).exists())


@pytest.mark.timeout(120)
def test_a_four_node_allocation_without_ntasks_runs_four_processes(wide_allocation):
    where, fields = wide_allocation
    batch = dict(line.split("=", 1) for line in (where / "batch.env").read_text().splitlines() if "=" in line)
    # What the allocation told jaxrun: no task count, four nodes of one task, nothing to export.
    assert "SLURM_NTASKS" not in batch, batch
    assert (batch["SLURM_NNODES"], batch["SLURM_TASKS_PER_NODE"], batch["SLURM_EXPORT_ENV"]) == ("4", "1(x4)", "NONE")
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), said(where)
    ran = json.loads((where / "report.json").read_text())
    assert [(p["exit_code"], p["signal"]) for p in ran["processes"]] == [(0, None)] * WIDE_NODES, said(where)
    seen = {}
    for rank in range(WIDE_NODES):
        (line,) = [w for w in (where / "logs" / f"process-{rank}.stdout").read_text().splitlines()
                   if w.startswith("where ")]
        _, process_id, node, platforms = line.split()
        seen[int(process_id)] = node
        assert platforms == "cpu", line  # the batch script's own variable reached the task (--export=ALL)
    assert sorted(seen) == list(range(WIDE_NODES)) and len(set(seen.values())) == WIDE_NODES, seen


@pytest.mark.timeout(120)
def test_the_dry_run_says_what_decided_the_count_and_prints_the_srun_line(wide_allocation):
    where, _ = wide_allocation
    lines = (where / "dry.out").read_text().splitlines()
    assert lines[0] == f"# {WIDE_NODES} processes: SLURM_TASKS_PER_NODE=1(x4)", lines
    assert lines[1].startswith("# srun: srun --kill-on-bad-exit=1 --ntasks=4 --export=ALL "), lines
    srun = shlex.split(lines[1].removeprefix("# srun: "))
    assert srun[4:8] == [sys.executable, "-m", "jaxrun.backends.scheduler.task_agent", "--"], srun
    assert srun[-1] == str(where / "where.py"), srun
    assert sum(line.startswith("process ") for line in lines) == WIDE_NODES, lines


# Each engine running jaxrun as its two tasks, and how each refused task starts its line.
ENGINES_RUNNING_JAXRUN = {
    "slurm": (["srun", "-n", "2", "--"], "jaxrun: error: started as task {task} of 2 of Slurm step ",
              "as 'jaxrun --launcher slurm SCRIPT', and it starts the srun step itself"),
    "mpirun": (["mpirun", "--allow-run-as-root", "--oversubscribe", "-n", "2"],
               "jaxrun: error: started as rank {task} of 2 by mpirun (OMPI_COMM_WORLD_RANK is set)",
               "as 'jaxrun --launcher mpirun SCRIPT', and it starts mpirun itself"),
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("engine", ENGINES_RUNNING_JAXRUN)
def test_jaxrun_run_by_an_engine_is_refused_and_starts_nothing(request, tmp_path, engine):
    if engine == "slurm":
        request.getfixturevalue("slurm_cluster")
    elif not shutil.which("mpirun"):
        pytest.skip("Open MPI is not installed (apt-get install openmpi-bin)")
    prefix, starts, ends = ENGINES_RUNNING_JAXRUN[engine]
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    logs = tmp_path / "logs"
    done = subprocess.run([*prefix, sys.executable, "-m", "jaxrun", "--launcher", engine, "--log-dir", str(logs),
                           str(script)], capture_output=True, text=True, timeout=50)
    assert done.returncode != 0, (done.stdout, done.stderr)
    assert "ran" not in done.stdout and not logs.exists(), (done.stdout, done.stderr)
    # Each task's refusal, from its start to its known end: the engine merges
    # its tasks' stderr, and its own notice (a block of dashes) or another
    # task's line may share a line with one.
    refusals = sorted(re.findall(rf"jaxrun: error: .*?{re.escape(ends)}", done.stderr))
    assert len(refusals) == 2, done.stderr
    for task, line in enumerate(refusals):
        assert line.startswith(starts.format(task=task)), line
    if engine == "slurm":
        assert done.returncode == 2  # srun passes its tasks' status on


@pytest.mark.timeout(60)
def test_the_task_channel_listens_on_the_port_given(slurm_cluster, run_jaxrun, tmp_path):
    """--channel-port, for a firewall: a run with a free port works; one whose
    port is taken stops with one line and exit 2, before srun starts."""
    from jaxrun.backends.scheduler.channel import channel_address

    address = channel_address()  # what jaxrun binds, in this same environment
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    port = portable.free_port(address)
    code, out, err, _ = run_jaxrun(*SLURM, "-n", 2, "--channel-port", port, "--log-dir", tmp_path / "a", script)
    assert code == 0 and out.count("ran") == 2, err
    with socket.create_server((address, 0)) as taken:
        port = taken.getsockname()[1]
        code, out, err, _ = run_jaxrun(*SLURM, "-n", 2, "--channel-port", port, "--log-dir", tmp_path / "b", script)
    assert code == 2 and "ran" not in out, err
    assert err.strip().splitlines()[-1].startswith(f"jaxrun: error: --channel-port {port}: cannot listen on "), err
    assert not (tmp_path / "b" / "engine.log").exists()  # srun never started
