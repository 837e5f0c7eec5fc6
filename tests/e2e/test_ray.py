"""--launcher ray: real jobs on a real two-node Ray cluster on this machine (``ray_cluster``).

The jobs run the command a user types, ``jaxrun --launcher ray ...``, with
the cluster's address in ``RAY_ADDRESS`` as on a Ray node (one test passes
``--ray-address`` instead).  Without ray, and for ``--help``, the last tests
need no cluster.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.engines import BYTES_PROBE, bytes_payload, check_toy
from fixtures.jobs import JAXRUN, Launch, processes_with_token, wait_gone

RAY = ["--launcher", "ray"]
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
NODE = re.compile(r"^[0-9a-f]{8}@127\.0\.0\.1$")  # a Ray node as the report names it
# How long the cluster may still show a SIGKILLed run's actors or placement
# group: Ray ends them within a second or two of the driver's death, but each
# look (``ray_cluster.state``) starts a Ray client, 2-3 s of CPU, and three
# times that on a loaded 2-core machine.  Ray's own record times the actors.
RAY_LOOKS = 30.0
BYTES_PER_PROCESS = 1 << 20

# Process 3 fails after initialize() while the others wait in a collective,
# and first notes when (the test measures from there to jaxrun's end).
CRASH = """\
import sys, time
import jax
from jax.experimental import multihost_utils
if jax.process_index() == 3:
    open(sys.argv[1], "w").write(repr(time.time()))
    raise RuntimeError("process 3 broke")
multihost_utils.sync_global_devices("never reached by process 3")
"""
# Every process joins, says so, and waits for its end.
IDLE = """\
import sys, time
import jax
jax.distributed.initialize()
open(f"{sys.argv[1]}/up-{jax.process_index()}", "w").close()
while True:
    time.sleep(0.1)
"""
# What a controller was told, and what of a Ray worker's environment it has.
PROBE = """\
import json, os
names = ("JAXRUN_PROCESS_ID", "JAXRUN_LOCAL_PROCESS_ID", "JAXRUN_LOCAL_PROCESS_COUNT", "RAY_JOB_ID",
         "PYTHONBREAKPOINT", "JAX_LOCAL_DEVICE_IDS", "JAXRUN_TASK_DEVICES_PER_PROCESS")
print("probe " + json.dumps({"env": {n: os.environ.get(n) for n in names}, "cwd": os.getcwd()}))
"""


@pytest.fixture
def on_ray(ray_cluster, monkeypatch):
    """A shell on a node of the cluster: RAY_ADDRESS names it."""
    monkeypatch.setenv("RAY_ADDRESS", ray_cluster.address)
    for name, value in ray_cluster.env.items():
        monkeypatch.setenv(name, value)
    return ray_cluster


def processes(report: Path) -> list[dict]:
    return json.loads(report.read_text())["processes"]


@pytest.mark.timeout(90)
def test_toy_gives_the_guides_result_on_two_nodes(on_ray, run_jaxrun, tmp_path):
    check_toy(run_jaxrun, RAY, tmp_path)  # the guide's output in 4 processes, and each one's log and resources
    hosts = [p["host"] for p in processes(tmp_path / "report.json")]
    assert all(NODE.match(h) for h in hosts), hosts
    assert len(set(hosts)) == 2, hosts  # spread (the default): two nodes, two processes each
    assert [p["local_process_id"] for p in processes(tmp_path / "report.json")] == [0, 1, 0, 1]


@pytest.mark.timeout(90)
def test_a_crash_ends_the_job_within_3_seconds_and_is_named(on_ray, tmp_path):
    script, fault = tmp_path / "crash.py", tmp_path / "fault"
    script.write_text(CRASH)
    report = tmp_path / "report.json"
    job = Launch([*RAY, "-n", 4, "--cpu-devices", 1, "--log-dir", tmp_path / "logs", "--report", report, script, fault])
    try:
        code = job.wait(timeout=75)
    finally:
        job.kill()
    assert code == 1, job.stderr
    # From the crash to the attempt's end on jaxrun's record (the report's
    # last ended_at, this machine's clock): 0.1-0.3 s here, against JAX's
    # 100 s heartbeat without fail-fast; 3 s holds a loaded 2-core machine.
    # jaxrun's own exit after it (Ray's driver closing) is not counted:
    # test_matrix.py's ray cells bound it (WRAP_UP).
    ended = max(p["ended_at"] for p in processes(report))
    took = ended - float(fault.read_text())
    print(f"{took:.2f} s from the crash to the attempt's end")
    assert took < 3, f"{took:.1f} s from the crash to the attempt's end"
    assert re.search(r"^jaxrun: process 3 on [0-9a-f]{8}@127\.0\.0\.1 failed first: exit code 1", job.stderr, re.M)
    assert "RuntimeError: process 3 broke" in job.stderr
    cause = json.loads(report.read_text())["root_cause"]
    assert (cause["process_id"], cause["exception"]["type"]) == (3, "RuntimeError"), cause
    assert NODE.match(cause["host"])


@pytest.mark.timeout(90)
def test_logs_hold_every_byte_of_8_streams(on_ray, run_jaxrun, tmp_path):
    logs = tmp_path / "logs"
    code, _, err, _ = run_jaxrun(*RAY, "-n", 4, "--cpu-devices", 1, "--log-dir", logs, BYTES_PROBE, "{process_id}",
                                 BYTES_PER_PROCESS)
    assert code == 0, err[-3000:]
    for rank in range(4):
        for stream, want in zip(("stdout", "stderr"), bytes_payload(rank, BYTES_PER_PROCESS)):
            got = (logs / f"process-{rank}.{stream}").read_bytes()
            assert got[-100:] == want[-100:], (rank, stream)  # the unfinished last line first
            assert hashlib.sha256(got).digest() == hashlib.sha256(want).digest(), (rank, stream)
        assert f"[{rank}] unfinished stderr line {rank} \ufffd\n" in err


@pytest.mark.timeout(90)
def test_sigkill_of_jaxrun_leaves_no_controller_actor_or_placement_group(on_ray, tmp_path, no_leftover_processes):
    script, state = tmp_path / "idle.py", tmp_path / "state"
    script.write_text(IDLE)
    state.mkdir()
    job = Launch([*RAY, "-n", 4, "--cpu-devices", 1, "--log-dir", tmp_path / "logs", script, state])
    try:
        deadline = time.monotonic() + 60
        while len(list(state.glob("up-*"))) < 4 and job.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(list(state.glob("up-*"))) == 4, job.proc.poll()
        actors, groups = on_ray.live()
        assert actors >= 4 and groups >= 1, (actors, groups)  # the check sees the job's actors and its group
        ours = [actor for actor, end in on_ray.ends().items() if not end]
        job.proc.send_signal(signal.SIGKILL)
        killed = time.time()
        job.proc.wait()
        # The controllers, their agents and the driver carry the leak guard's token.
        assert wait_gone(no_leftover_processes, within=10) == []
        gone_by = time.monotonic() + RAY_LOOKS
        while on_ray.live() != (0, 0):  # no live actor, no placement group
            assert time.monotonic() < gone_by, on_ray.state()
            time.sleep(0.2)
        # When the actors died, by the GCS's own record: Ray ends a dead
        # driver's actors in about a second; 10 s holds a loaded machine.
        ends = on_ray.ends()
        took = max(ends[actor] for actor in ours) - killed
        print(f"the job's actors ended {took:.1f} s after SIGKILL")
        assert took < 10, (took, ends)
    finally:
        job.kill()


@pytest.mark.timeout(90)
def test_an_actor_that_dies_takes_its_agent_and_controller_along(on_ray, tmp_path, no_leftover_processes):
    """An actor killed alone (the OOM killer's way), not its process group:
    its agent goes (Ray kills what was the actor's group; the agent also has
    a lifeline from its actor), and its process with it."""
    script, state = tmp_path / "idle.py", tmp_path / "state"
    script.write_text(IDLE)
    state.mkdir()
    job = Launch([*RAY, "-n", 2, "--cpu-devices", 1, "--grace", 1, "--log-dir", tmp_path / "logs", script, state])
    try:
        deadline = time.monotonic() + 60
        while len(list(state.glob("up-*"))) < 2 and job.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        agents = [p for p in processes_with_token(no_leftover_processes) if "--agent" in p.cmdline()]
        actor = agents[0].parent()
        assert actor.cmdline()[0].startswith("ray::ControllerHost"), actor.cmdline()
        actor.kill()  # SIGKILL to the actor alone, not its group
        code = job.wait(timeout=30)
    finally:
        job.kill()
    assert code == 137, job.stderr  # its process was lost with its agent
    assert re.search(r"^jaxrun: process \d on \S+ failed first: its task agent ended before the process's end "
                     r"came home \(killed by SIGKILL\)", job.stderr, re.M), job.stderr
    assert wait_gone(no_leftover_processes, within=5) == []


@pytest.mark.timeout(90)
def test_a_placement_that_waits_says_so_and_dies_with_jaxrun(on_ray, tmp_path, no_leftover_processes):
    """Two nodes cannot hold three processes one per node: the driver waits (an
    autoscaler could add a node), says so once, and goes when jaxrun is SIGKILLed."""
    script, err = tmp_path / "s.py", tmp_path / "jaxrun.err"
    script.write_text("print('never')\n")
    with open(err, "wb") as sink:
        argv = [*RAY, "--placement", "strict-spread", "-n", 3, "--log-dir", tmp_path / "logs", script]
        proc = subprocess.Popen([*JAXRUN, *map(str, argv)], stdout=sink, stderr=sink, start_new_session=True)
    try:
        deadline = time.monotonic() + 45
        while "waiting for the Ray cluster" not in err.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, err.read_text()
        assert "[ray] jaxrun: waiting for the Ray cluster to place 3 processes ({'CPU': 1.0} each, --placement " \
               "strict-spread)" in err.read_text()
        assert on_ray.live() == (0, 1)  # the group waits to be placed
        proc.kill()
        assert wait_gone(no_leftover_processes, within=10) == []  # the driver carries the token
        gone_by = time.monotonic() + RAY_LOOKS
        while on_ray.live() != (0, 0):
            assert time.monotonic() < gone_by, on_ray.state()
            time.sleep(0.2)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.timeout(90)
def test_pack_places_every_process_on_one_node_with_the_nodes_environment(ray_cluster, monkeypatch, run_jaxrun,
                                                                          tmp_path):
    for name, value in ray_cluster.env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    script, report = tmp_path / "probe.py", tmp_path / "report.json"
    script.write_text(PROBE)
    code, out, err, _ = run_jaxrun(*RAY, "--ray-address", ray_cluster.address, "--placement", "pack", "-n", 4,
                                   "--report", report, "--log-dir", tmp_path / "logs", script)
    assert code == 0, err
    assert len({p["host"] for p in processes(report)}) == 1, processes(report)
    for rank in range(4):
        (line,) = [x for x in out.splitlines() if x.startswith(f"[{rank}] probe ")]
        seen = json.loads(line.split("probe ", 1)[1])
        assert seen["cwd"] == str(Path.cwd()), seen  # the launcher's working directory, on every node
        assert seen["env"] == {"JAXRUN_PROCESS_ID": str(rank), "JAXRUN_LOCAL_PROCESS_ID": str(rank),
                               "JAXRUN_LOCAL_PROCESS_COUNT": "4", "RAY_JOB_ID": None, "PYTHONBREAKPOINT": None,
                               "JAX_LOCAL_DEVICE_IDS": None, "JAXRUN_TASK_DEVICES_PER_PROCESS": None}, seen


@pytest.mark.timeout(90)
def test_ray_job_submit_ships_the_working_directory_to_every_process(on_ray, tmp_path):
    """A Ray user's way to ship code: jaxrun as a Ray job's entrypoint, with
    ``--working-dir``; every process starts in its node's copy of it."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "where.py").write_text("import os\nprint('cwd', os.getcwd(), sorted(os.listdir('.')))\n")
    done = subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "job", "submit", "--address",
                           f"http://{on_ray.dashboard}", "--working-dir", ".", "--", sys.executable, "-m", "jaxrun",
                           *RAY, "-n", "2", "where.py"], cwd=project, capture_output=True, text=True, timeout=80)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    for rank in range(2):
        (line,) = [x for x in done.stdout.splitlines() if x.startswith(f"[{rank}] cwd ")]
        assert "/working_dir_files/_ray_pkg_" in line and line.endswith("['where.py']"), line


@needs_ray
@pytest.mark.timeout(60)
def test_a_cluster_that_cannot_be_reached_is_one_line_and_exit_2(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('never')\n")
    with __import__("socket").socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run([*JAXRUN, *RAY, "--ray-address", f"127.0.0.1:{port}", "--log-dir", tmp_path / "logs",
                           script], capture_output=True, text=True, timeout=50)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"jaxrun: error: --launcher ray: cannot reach the Ray cluster at 127.0.0.1:{port}: ")
    assert done.stderr.count("\n") == 1, done.stderr


# -- no cluster needed -------------------------------------------------------------------
# jaxrun's command line in a Python where ``import ray`` fails: sys.modules["ray"] = None.
WITHOUT_RAY = """\
import sys
sys.modules["ray"] = None
from jaxrun import cli
try:
    cli.entry_point(sys.argv[1:])
finally:
    print("imported ray" if any(m == "ray" or m.startswith("ray.") for m in sys.modules if sys.modules[m]) else "")
"""


def jaxrun_without_ray(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT_RAY, *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def test_without_ray_the_ray_launcher_says_how_to_install_it(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('never')\n")
    done = jaxrun_without_ray(*RAY, "-n", 2, "--log-dir", tmp_path / "logs", script)
    assert done.returncode == 2
    assert done.stderr == ("jaxrun: error: --launcher ray needs Ray, which this Python cannot import: "
                           "pip install 'jaxrun[ray]'\n")
    assert not (tmp_path / "logs").exists()  # nothing started
    assert "imported ray" not in done.stdout
    local = jaxrun_without_ray("-n", 1, "--log-dir", tmp_path / "logs", script)  # the rest works without it
    assert local.returncode == 0 and "[0] never" in local.stdout, local.stderr


def test_help_shows_the_ray_options_without_importing_ray():
    done = subprocess.run([sys.executable, "-c", "import sys\nfrom jaxrun import cli\ntry:\n"
                           "    cli.entry_point(['--help-all'])\nfinally:\n    print('RAY', 'ray' in sys.modules)\n"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("With --launcher ray:\n", 1)[1].split("\n\n", 1)[0]
    assert "--ray-address ADDR" in section and "--placement [pack|spread|strict-spread]" in section, section
    assert re.search(r"--launcher NAME +How to start the controllers: local, ssh,\s+slurm, mpirun, ray", done.stdout)
    assert done.stdout.rstrip().endswith("RAY False")


def test_the_ray_options_need_the_ray_launcher(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('never')\n")
    done = subprocess.run([*JAXRUN, "--placement", "pack", script], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (2, "jaxrun: error: --placement works with --launcher ray only\n")
