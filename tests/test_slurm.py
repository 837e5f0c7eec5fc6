"""--launcher slurm: one real srun step on a throwaway one-node Slurm cluster."""

import pytest

from engine_checks import check_crash_in_task_3, check_toy, run_jaxrun  # noqa: F401 - fixture
from slurm_fixture import slurm_cluster  # noqa: F401 - session fixture

# This machine has fewer CPUs than processes.
SLURM = ["--launcher", "slurm", "--scheduler-arg=--overcommit"]


@pytest.mark.timeout(90)
def test_toy_matches_the_guide(slurm_cluster, run_jaxrun, tmp_path):
    check_toy(run_jaxrun, SLURM, tmp_path)


@pytest.mark.timeout(60)
def test_crash_in_task_3_ends_the_step_and_is_named(slurm_cluster, run_jaxrun, tmp_path):
    check_crash_in_task_3(run_jaxrun, SLURM, tmp_path)
