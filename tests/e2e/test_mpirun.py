"""--launcher mpirun: one real Open MPI step on this machine."""

import shutil

import pytest
from fixtures.engines import (
    check_crash_in_task_3,
    check_logs_hold_every_byte,
    check_ranks_come_from_the_scheduler,
    check_timeout_stops_the_step,
    check_toy,
)

# Only the tests that start a step need Open MPI; building its command line does not.
needs_mpirun = pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI is not installed (apt-get install openmpi-bin)")

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
def test_crash_in_task_3_ends_the_step_and_is_named(run_jaxrun, tmp_path):
    check_crash_in_task_3(run_jaxrun, MPIRUN, tmp_path)


@needs_mpirun
@pytest.mark.timeout(60)
def test_timeout_dumps_stacks_and_stops_the_step(run_jaxrun, tmp_path):
    check_timeout_stops_the_step(run_jaxrun, MPIRUN, tmp_path)


@needs_mpirun
@pytest.mark.timeout(60)
def test_each_task_takes_its_rank_from_mpirun(run_jaxrun, tmp_path):
    check_ranks_come_from_the_scheduler(run_jaxrun, MPIRUN, tmp_path, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK")


@needs_mpirun
@pytest.mark.timeout(60)
def test_logs_hold_every_byte(run_jaxrun, tmp_path):
    check_logs_hold_every_byte(run_jaxrun, MPIRUN, tmp_path)
