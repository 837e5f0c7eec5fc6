"""The far-end agents' pure parts: argument parsing and the scheduler's task counts."""

import pytest

from jaxrun import contract
from jaxrun.backends.ssh import session_agent as ssh_agent
from jaxrun.contract import devices


@pytest.mark.parametrize("per_node, node, count", [("4", 0, 4), ("2(x3),1", 0, 2), ("2(x3),1", 2, 2),
                                                   ("2(x3),1", 3, 1), ("", 0, 1), ("3", 5, 1)])
def test_slurm_tasks_on_node(per_node, node, count):
    assert devices.tasks_on_node(per_node, node) == count


@pytest.mark.parametrize("env, count", [
    ({contract.RANK_SOURCE: "slurm", "SLURM_STEP_TASKS_PER_NODE": "3(x2)", "SLURM_NODEID": "1"}, 3),
    ({contract.RANK_SOURCE: "mpirun", "OMPI_COMM_WORLD_LOCAL_SIZE": "5"}, 5),
    ({contract.RANK_SOURCE: "mpi", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, 2),
    ({}, 1),
])
def test_local_count_from_the_scheduler(env, count):
    assert devices.local_count_from_env(env) == count


def test_ssh_agent_arguments():
    assert ssh_agent.parse_args(["--chdir", "/w d", "--", "py", "-m", "x"]) == ("/w d", ["py", "-m", "x"])
    assert ssh_agent.parse_args(["--", "py"]) == (None, ["py"])
    # The host's server's name is never on the command line (issue 70): no word for it.
    for bad in ([], ["py"], ["--chdir", "/w"], ["--"], ["--forkserver", "jx-1", "--", "py"]):
        with pytest.raises(ValueError, match="usage"):
            ssh_agent.parse_args(bad)
