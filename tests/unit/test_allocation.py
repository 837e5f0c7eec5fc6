"""The allocation's task layout and the job-step refusal, from the variables
Slurm and MPI launchers set (the values below are what Slurm 22.05 gave in
``sbatch -N 2`` and in its ``srun`` step on a test cluster)."""

from __future__ import annotations

import pytest

from jaxrun.backends import BACKENDS
from jaxrun.core.config import LaunchError
from jaxrun.launcher.setup import allocation
from jaxrun.launcher.setup.allocation import tasks_per_node


@pytest.mark.parametrize("text, counts", [
    ("1", [1]),
    ("1(x4)", [1, 1, 1, 1]),
    ("2(x3),1", [2, 2, 2, 1]),
    ("8,4(x2), 2", [8, 4, 4, 2]),
])
def test_tasks_per_node_reads_slurms_compressed_form(text, counts):
    assert tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "2(x)", "x3", "2(3)", "-1"])
def test_an_unreadable_tasks_per_node_is_one_line_naming_it(text):
    with pytest.raises(ValueError, match=r"^SLURM_TASKS_PER_NODE=.*: cannot read"):
        tasks_per_node(text)
    with pytest.raises(LaunchError, match=r"^SLURM_TASKS_PER_NODE=.*: cannot read"):
        allocation.slurm_layout({"SLURM_TASKS_PER_NODE": text or ","}, None, None)


SBATCH_N4 = {"SLURM_JOB_ID": "2", "SLURM_NNODES": "4", "SLURM_JOB_NUM_NODES": "4", "SLURM_TASKS_PER_NODE": "1(x4)",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("environ, nodes, per_node, count, source", [
    (SBATCH_N4, None, None, 4, "SLURM_TASKS_PER_NODE=1(x4)"),
    ({**SBATCH_N4, "SLURM_TASKS_PER_NODE": "2(x3),1"}, None, None, 7, "SLURM_TASKS_PER_NODE=2(x3),1"),
    ({**SBATCH_N4, "SLURM_TASKS_PER_NODE": "2(x3),1"}, 2, None, 4,
     "SLURM_TASKS_PER_NODE=2(x3),1 (its first 2 nodes: --nodes)"),
    ({**SBATCH_N4, "SLURM_NTASKS": "6"}, None, None, 6, "SLURM_NTASKS=6"),
    ({**SBATCH_N4, "SLURM_NTASKS": "6"}, None, 8, 32, "SLURM_NNODES=4 x --ntasks-per-node 8"),
    (SBATCH_N4, 2, 8, 16, "--nodes 2 x --ntasks-per-node 8"),
    ({}, 4, 8, 32, "--nodes 4 x --ntasks-per-node 8"),  # outside an allocation too
    ({"SLURM_NNODES": "3"}, None, None, 3, "SLURM_NNODES=3 (one process per node)"),
    ({"SLURM_NPROCS": "5"}, None, None, 5, "SLURM_NPROCS=5"),
    ({"SLURM_NTASKS": "\u0664", "SLURM_NNODES": "2"}, None, None, 2, "SLURM_NNODES=2 (one process per node)"),
])
def test_the_allocation_layout_and_what_decided_it(environ, nodes, per_node, count, source):
    assert allocation.slurm_layout(environ, nodes, per_node) == allocation.Layout(count, source)


def test_outside_an_allocation_nothing_says():
    assert allocation.slurm_layout({}, None, 8) is None
    assert allocation.slurm_layout({"SLURM_NTASKS": "x"}, None, None) is None


def test_only_slurm_reads_the_allocation_and_dash_n_wins():
    values = {"num_processes": None, "nodes": None, "tasks_per_node": None}
    slurm, mpirun = BACKENDS["slurm"], BACKENDS["mpirun"]
    assert allocation.process_count(values, slurm, (), SBATCH_N4).count == 4
    assert allocation.process_count(values, mpirun, (), SBATCH_N4) == allocation.Layout(1, "")
    assert allocation.process_count({**values, "num_processes": 2}, slurm, (), SBATCH_N4) == allocation.Layout(2, "")


@pytest.mark.parametrize("environ", [
    {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2", "SLURM_NTASKS": "4"},
    {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "4"},
    {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4"},
    {"PMI_RANK": "0", "PMI_SIZE": "2"},
])
def test_a_task_of_a_step_is_refused(environ):
    why = allocation.step_refusal(environ)
    assert why and why.startswith("started as ") and "nothing was started" in why


@pytest.mark.parametrize("environ", [
    SBATCH_N4,  # the batch script: SLURM_PROCID=0 but no step
    {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"},  # srun --pty bash
    {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"},
    {},
])
def test_a_batch_script_or_a_one_task_shell_is_not(environ):
    assert allocation.step_refusal(environ) is None
