"""--launcher mpirun: one real Open MPI step on this machine."""

import os
import shutil

import pytest

from engine_checks import check_crash_in_task_3, check_toy, run_jaxrun  # noqa: F401 - fixture

pytestmark = pytest.mark.skipif(not shutil.which("mpirun"), reason="Open MPI is not installed (apt-get install openmpi-bin)")

# This machine has fewer cores than processes.
MPIRUN = ["--launcher", "mpirun", "--scheduler-arg=--oversubscribe"]


@pytest.mark.timeout(60)
def test_toy_matches_the_guide(run_jaxrun, tmp_path):
    check_toy(run_jaxrun, MPIRUN, tmp_path)


@pytest.mark.timeout(60)
def test_crash_in_task_3_ends_the_step_and_is_named(run_jaxrun, tmp_path):
    check_crash_in_task_3(run_jaxrun, MPIRUN, tmp_path)
