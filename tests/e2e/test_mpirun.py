"""--launcher mpirun: one real Open MPI step on this machine.

mpirun hands its own environment to the ranks it starts on this machine, but
only the variables named with ``-x`` to ranks on other nodes.  To see what
other nodes get, one test starts its ranks through the SSH fixture's sshd on
127.0.0.2, as mpirun reaches a remote node.
"""

import json
import shutil

import pytest
from fixtures.engines import (
    check_engine_failure_named_once,
    check_logs_hold_every_byte,
    check_ranks_come_from_the_scheduler,
    check_toy,
)

# Only the tests that start a step need Open MPI; building its command line does not.
needs_mpirun = pytest.mark.skipif(not shutil.which("mpirun"),
                                  reason="Open MPI is not installed (apt-get install openmpi-bin)")

# This machine has fewer cores than processes.
MPIRUN = ["--launcher", "mpirun"]


@pytest.fixture(autouse=True)
def more_processes_than_cores(monkeypatch):
    """This machine has 2 cores and the checks start 4 processes.  A site sets
    this in openmpi-mca-params.conf; here it is the environment's job, so the
    jaxrun command stays exactly what a user types."""
    monkeypatch.setenv("OMPI_MCA_rmaps_base_oversubscribe", "1")


@needs_mpirun
@pytest.mark.timeout(60)
def test_toy_matches_the_guide(run_jaxrun, tmp_path):
    check_toy(run_jaxrun, MPIRUN, tmp_path)




@needs_mpirun
@pytest.mark.timeout(60)
def test_each_task_takes_its_rank_from_mpirun(run_jaxrun, tmp_path):
    check_ranks_come_from_the_scheduler(run_jaxrun, MPIRUN, tmp_path, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK")


@needs_mpirun
@pytest.mark.timeout(60)
def test_logs_hold_every_byte(run_jaxrun, tmp_path):
    check_logs_hold_every_byte(run_jaxrun, MPIRUN, tmp_path)


# What a task saw, as one marked JSON line: the variables under test, and
# whether an sshd is among its ancestors (it ran on the "other node").
ENV_PROBE = """\
import json, os, psutil
names = ("FOO", "BAZ", "PYTHONUNBUFFERED", "JAX_LOCAL_DEVICE_IDS", "JAXRUN_LOCAL_PROCESS_ID", "OMPI_COMM_WORLD_RANK")
seen = {n: os.environ.get(n) for n in names}
seen["via_sshd"] = any(p.name() == "sshd" for p in psutil.Process().parents())
print("env-probe " + json.dumps(seen))
"""


def probe_lines(logs, ranks: int) -> dict[int, dict]:
    seen = {}
    for rank in range(ranks):
        text = (logs / f"process-{rank}.stdout").read_text()
        (line,) = [line for line in text.splitlines() if line.startswith("env-probe ")]
        seen[rank] = json.loads(line.removeprefix("env-probe "))
    return seen


@needs_mpirun
@pytest.mark.timeout(90)
def test_env_and_x_reach_ranks_on_another_node(sshd_hosts, shared_dir, run_jaxrun, tmp_path, monkeypatch):
    script = shared_dir / "env_probe.py"  # the test hosts have their own /tmp
    script.write_text(ENV_PROBE)
    logs = tmp_path / "logs"
    monkeypatch.setenv("BAZ", "from -x")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    # mpirun reaches hostA through the fixture's sshd, as it would a remote node.
    remote = ["--scheduler-arg=--mca", "--scheduler-arg=plm_rsh_agent", f"--scheduler-arg=ssh -F {sshd_hosts.config}",
              "--scheduler-arg=--host", "--scheduler-arg=hostA:2"]
    code, _, err, _ = run_jaxrun(*MPIRUN, *remote, "-n", 2, "-x", "FOO=bar $HOME 'q'", "-x", "BAZ",
                                 "--log-dir", logs, script)
    assert code == 0, err
    for rank, seen in probe_lines(logs, 2).items():
        assert seen["via_sshd"], f"rank {rank} did not run through sshd: {seen}"
        assert (seen["FOO"], seen["BAZ"], seen["PYTHONUNBUFFERED"]) == ("bar $HOME 'q'", "from -x", "1"), seen


@needs_mpirun
@pytest.mark.timeout(60)
def test_devices_per_process_come_from_the_local_rank_mpirun_gives(run_jaxrun, tmp_path):
    script = tmp_path / "env_probe.py"
    script.write_text(ENV_PROBE)
    logs = tmp_path / "logs"
    code, _, err, _ = run_jaxrun(*MPIRUN, "-n", 2, "--devices-per-process", 2, "--log-dir", logs, script)
    assert code == 0, err
    seen = probe_lines(logs, 2)
    assert {s["JAXRUN_LOCAL_PROCESS_ID"]: s["JAX_LOCAL_DEVICE_IDS"] for s in seen.values()} == {"0": "0,1", "1": "2,3"}


@needs_mpirun
@pytest.mark.timeout(60)
def test_mpirun_failing_for_all_processes_is_named_once(run_jaxrun, tmp_path, monkeypatch):
    # Without oversubscription, 64 processes do not fit this machine: mpirun
    # itself refuses the job before any task starts.
    monkeypatch.delenv("OMPI_MCA_rmaps_base_oversubscribe")
    check_engine_failure_named_once(run_jaxrun, MPIRUN, tmp_path, "mpirun", 64, "There are not enough slots available")
