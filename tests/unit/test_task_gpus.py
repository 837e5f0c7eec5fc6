"""Which GPUs each task of a scheduler step owns, from the variables the
engines set (Slurm 22.05's and Open MPI's names; no GPU here, so the node's
device files are a folder of empty files)."""

from __future__ import annotations

import pytest

from jaxrun import contract
from jaxrun.backends.scheduler import task_agent
from jaxrun.contract import devices


def agent_devices(environ: dict[str, str]) -> str | None:
    """What the task agent gives its child, with its local rank and count
    read from the engine's variables as the agent reads them."""
    _, _, local = contract.identity_from_env(environ)
    ids = task_agent.device_env(local, task_agent.local_count_from_env(environ), environ)
    return ids.get(contract.JAX_LOCAL_DEVICE_IDS)


def slurm_task(local: int, tasks: int, **more: str) -> dict[str, str]:
    return {contract.RANK_SOURCE: "slurm", "SLURM_PROCID": str(local), "SLURM_NTASKS": str(tasks),
            "SLURM_LOCALID": str(local), "SLURM_NODEID": "0", "SLURM_STEP_TASKS_PER_NODE": str(tasks),
            contract.TASK_DEVICES_PER_PROCESS: "auto", **more}


def test_slurm_without_gpu_binding_splits_the_nodes_gpus_by_local_rank():
    # srun -n 2 --gres=gpu:4: every task sees the step's four GPUs.
    seen = {"SLURM_STEP_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert [agent_devices(slurm_task(r, 2, **seen)) for r in range(2)] == ["0,1", "2,3"]
    # srun -n 4 on a node of eight.
    seen = {"SLURM_STEP_GPUS": "0,1,2,3,4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert [agent_devices(slurm_task(r, 4, **seen)) for r in range(4)] == ["0,1", "2,3", "4,5", "6,7"]


def test_slurm_with_gpu_binding_leaves_each_task_the_gpus_it_sees():
    # srun -n 4 --gpus-per-task=1: each task sees its own GPU only, as 0 under
    # ConstrainDevices (cgroups) or by its node index without.
    for visible in ("0", "2"):
        seen = {"SLURM_STEP_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": visible}
        assert agent_devices(slurm_task(2, 4, **seen)) is None  # JAX then uses all it sees: its one
        # With --devices-per-process 1 it asked for device 2 and saw only device 0.
        assert agent_devices(slurm_task(2, 4, **seen, **{contract.TASK_DEVICES_PER_PROCESS: "1"})) == "0"
    # Bound by UUID (CUDA_DEVICE_ORDER aside, what some sites' prologs set).
    seen = {"SLURM_STEP_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "GPU-aa"}
    assert agent_devices(slurm_task(1, 4, **seen)) is None
    # Two GPUs each (--gpus-per-task=2), one process using its first.
    seen = {"SLURM_STEP_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "2,3", contract.TASK_DEVICES_PER_PROCESS: "1"}
    assert agent_devices(slurm_task(1, 2, **seen)) == "0"


def test_open_mpi_binds_no_gpu_so_the_nodes_device_files_are_split(tmp_path):
    for i in range(8):
        (tmp_path / f"nvidia{i}").touch()
    (tmp_path / "nvidiactl").touch()  # not a GPU
    on_node = devices.node_gpus({}, str(tmp_path))
    assert on_node == 8

    def task(local: int, size: int) -> list[int] | None:
        environ = {"OMPI_COMM_WORLD_LOCAL_RANK": str(local), "OMPI_COMM_WORLD_LOCAL_SIZE": str(size)}
        return devices.task_device_ids(local, size, None, environ, on_node)[0]

    assert [task(r, 8) for r in range(8)] == [[r] for r in range(8)]
    # The user's CUDA_VISIBLE_DEVICES for the whole job is the node's set, not a binding.
    users = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert [devices.task_device_ids(r, 2, None, users, on_node)[0] for r in range(2)] == [[0, 1], [2, 3]]
    assert [task(r, 2) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert task(0, 1) is None  # one task owns the node


@pytest.mark.parametrize("visible, on_node, local, count, per_process, ids", [
    (None, 2, 3, 4, None, [1]),  # more tasks than GPUs: round the table, never all of them
    (None, 3, 1, 2, None, [1]),  # an uneven split: each its floor share
    ("", 4, 0, 2, None, None),  # CUDA_VISIBLE_DEVICES hides every GPU
    ("NoDevFiles", 4, 0, 2, None, None),  # Slurm's word for the same
    ("GPU-aa,GPU-bb", 4, 1, 2, None, [1]),  # no list of Slurm's: the user's set, split
    (None, None, 1, 2, None, None),  # no GPU to count: nothing set
    (None, None, 1, 2, 3, [3, 4, 5]),  # --devices-per-process: the local rank's, as before
])
def test_edges(visible, on_node, local, count, per_process, ids):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert devices.task_device_ids(local, count, per_process, environ, on_node)[0] == ids


def test_the_step_counts_its_gpus_before_the_device_files():
    assert devices.node_gpus({"SLURM_STEP_GPUS": "4,5"}, "/nonexistent") == 2
    assert devices.node_gpus({}, "/nonexistent") is None


def test_a_shim_a_scheduler_started_itself_follows_the_same_rule():
    """examples/deploy/slurm.sbatch: srun starts the shim with no task agent."""
    from jaxrun.child.join.bootstrap import scheduled_devices

    seen = {"SLURM_STEP_GPUS": "0,1,2,3", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    for local, ids in ((0, "0,1"), (1, "2,3")):
        environ = slurm_task(local, 2, **seen)
        del environ[contract.TASK_DEVICES_PER_PROCESS]  # the shim's environment has no agent's word
        scheduled_devices(environ, local)
        assert environ[contract.JAX_LOCAL_DEVICE_IDS] == ids
    bound = slurm_task(1, 4, SLURM_STEP_GPUS="0,1,2,3", CUDA_VISIBLE_DEVICES="0")
    scheduled_devices(bound, 1)
    assert contract.JAX_LOCAL_DEVICE_IDS not in bound  # it uses the one GPU it sees
    given = slurm_task(1, 2, **seen, JAX_LOCAL_DEVICE_IDS="3")
    scheduled_devices(given, 1)
    assert given[contract.JAX_LOCAL_DEVICE_IDS] == "3"  # the agent's (or the user's) ids stay
