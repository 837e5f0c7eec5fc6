"""A TPU host's launch, as far as a machine without one shows it (issue 71):
each process's chips in the dry run, for hosts of 1, 4 and 8 chips, with the
variables JAX's own multi-process runner sets; more processes than chips
refused in one line before anything starts; and JAX's teardown lines, which
every clean run on the TPU host printed, kept out of the console.

The chips are the ones ``TPU_VISIBLE_CHIPS`` names (jaxrun shares out what
it names); tests/unit/test_tpu_chips.py counts them from /dev and /sys."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from fixtures.jobs import JAXRUN

pytestmark = [pytest.mark.timeout(120), pytest.mark.plain_python]


def dry_run(tmp_path, chips: int, *args: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    env = {**os.environ, "TPU_VISIBLE_CHIPS": ",".join(map(str, range(chips)))}
    env.pop("JAX_PLATFORMS", None)
    return subprocess.run([*JAXRUN, "--dry-run", *args, str(script)], env=env, capture_output=True, text=True,
                          timeout=60)


def processes(out: str) -> list[dict[str, str]]:
    """Each process's variables, as the dry run lists them."""
    found: list[dict[str, str]] = []
    for line in out.splitlines():
        if re.match(r"process \d+:", line):
            found.append({})
        elif found and (m := re.match(r"  ([A-Z_]+)=(.*)", line)):
            found[-1][m[1]] = m[2]
    return found


@pytest.mark.parametrize("chips, args, shares, bounds", [
    (1, ("--devices-per-process", "1"), ["0"], ("1,1,1", "1,1,1")),
    (4, ("-n", "4"), ["0", "1", "2", "3"], ("2,2,1", "1,1,1")),
    (4, ("-n", "2"), ["0,1", "2,3"], ("2,1,1", "1,2,1")),
    (8, ("-n", "8"), [str(c) for c in range(8)], ("4,2,1", "1,1,1")),
    (8, ("-n", "2", "--devices-per-process", "4"), ["0,1,2,3", "4,5,6,7"], ("1,2,1", "2,2,1")),
], ids=["1-chip", "4-by-1", "4-by-2", "8-by-1", "8-by-4"])
def test_the_dry_run_shows_each_processs_chips(tmp_path, chips, args, shares, bounds):
    done = dry_run(tmp_path, chips, *args)
    assert done.returncode == 0, done.stderr
    envs = processes(done.stdout)
    assert [env["TPU_VISIBLE_CHIPS"] for env in envs] == shares
    ports = [env.get("TPU_PROCESS_PORT") for env in envs]
    for rank, env in enumerate(envs):
        assert (env["TPU_PROCESS_BOUNDS"], env["TPU_CHIPS_PER_PROCESS_BOUNDS"]) == bounds
        assert env["CLOUD_TPU_TASK_ID"] == env["TPU_WORKER_ID"] == str(rank)
        assert env["ALLOW_MULTIPLE_LIBTPU_LOAD"] == "1"
        if len(envs) > 1:
            assert env["TPU_PROCESS_ADDRESSES"] == ",".join(f"localhost:{p}" for p in ports)
    assert len(set(ports)) == len(envs)


def test_one_process_owns_every_chip_as_a_bare_python_does(tmp_path):
    done = dry_run(tmp_path, 4)
    assert done.returncode == 0 and "TPU_" not in done.stdout


@pytest.mark.parametrize("chips, args, message", [
    (1, ("-n", "2"), "-n 2: this machine has 1 TPU chip, and a chip is held by one process at a time; at most 1 "
                     "process here (or --cpu-devices D for CPU processes)"),
    (4, ("-n", "8"), "-n 8: this machine has 4 TPU chips, and a chip is held by one process at a time; at most 4 "
                     "processes here (or --cpu-devices D for CPU processes)"),
    (4, ("-n", "2", "--devices-per-process", "4"), "-n 2 x --devices-per-process 4 needs 8 TPU chips, but this "
                                                   "machine has 4"),
], ids=["1-chip", "4-chips", "per-process"])
def test_more_processes_than_chips_is_one_line_and_exit_2(tmp_path, chips, args, message):
    done = dry_run(tmp_path, chips, *args)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"jaxrun: error: {message}\n")


# As the TPU host printed them at the end of a clean run (bench/tpu_smoke.sh).
TEARDOWN = (
    "W1205 22:34:55.906839    5317 pjrt_client.cc:1615] WatchTasksAsync failed for task 0: CANCELLED: CANCELLED",
    "Additional GRPC error information from remote target coordination_service while calling "
    "/xla.coordination.CoordinationService/WatchTasks:",
    ':UNKNOWN:Error received from peer  {grpc_message:"CANCELLED", grpc_status:1} '
    "[type.googleapis.com/tensorflow.DerivedStatus='']",
)


@pytest.mark.parametrize("verbose", [False, True], ids=["console", "-v"])
def test_jaxs_teardown_lines_stay_in_the_log_and_reach_the_console_with_v(jaxrun, tmp_path, verbose):
    script = tmp_path / "ends.py"
    script.write_text("import sys\nprint('trained')\n"
                      f"sys.stderr.write({chr(10).join(TEARDOWN) + chr(10)!r})\n")
    code, out, err = jaxrun(*(["-v"] if verbose else []), "--log-dir", tmp_path / "logs", script)
    assert code == 0, err
    assert "[0] trained" in out
    assert all((line in err) is verbose for line in TEARDOWN), err
    assert (tmp_path / "logs" / "process-0.stderr").read_text().splitlines()[-3:] == list(TEARDOWN)
