"""Which GPUs one task of a scheduler step owns, from what its engine set;
and how many tasks share its node.

JAX's own Slurm detection would give each process its ``SLURM_LOCALID``'s
GPU, but the shim turns it off (``cluster_detection_method="deactivate"``,
jaxrun numbers the processes itself), so this rule takes its place: the task
agent of ``--launcher slurm``/``mpirun`` applies it and hands the child
``JAX_LOCAL_DEVICE_IDS``, and the shim applies it itself when a scheduler
started it directly (``examples/deploy/slurm.sbatch``).  The ids are indices
among the devices the task sees:

- **bound by the engine**: the task sees fewer GPUs than the step has on its
  node (Slurm's ``--gpus-per-task``, ``--gpu-bind``: each task's
  ``CUDA_VISIBLE_DEVICES`` is its own, ``SLURM_STEP_GPUS`` the node's; a
  ``CUDA_VISIBLE_DEVICES`` without Slurm's list is the node's set).  It
  owns what it sees: all of it, or its first K with ``--devices-per-process K``
  (more than it sees is JAX's error, naming the device);
- **not bound** (``--gres=gpu:4`` alone, Open MPI, which binds no GPU): the
  node's GPUs are split among the node's tasks by local rank: local task r
  owns ``r*K ... r*K+K-1``, K being ``--devices-per-process`` or the node's
  GPUs over its tasks.  With more tasks than GPUs, tasks share them round
  the table (task r takes GPU ``r mod G``), so that no task holds every GPU;
- no GPU the agent can count: nothing is set (CPUs, TPUs), unless
  ``--devices-per-process K`` gives local task r ``r*K ... r*K+K-1`` anyway.

Pure: the environment and the node's GPU count come in.  The node's GPUs
are counted with ``node_gpus``: the step's (``SLURM_STEP_GPUS``), else the
device files the driver makes (``/dev/nvidiaN``), never nvidia-smi.  Nothing
here imports jax.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from jaxrun.contract.names import LOCAL_COUNT_SOURCES, LOCAL_PROCESS_COUNT, RANK_SOURCE

DEVICE_FILE = re.compile(r"nvidia\d+")
# One entry of SLURM_TASKS_PER_NODE: "2", or "2(x3)" for three nodes of two.
TASKS_ENTRY = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
# contract.TASK_DEVICES_PER_PROCESS without --devices-per-process: the engine's binding, or an even split.
AUTO = "auto"


def listed(text: str | None) -> list[str] | None:
    """A device list variable's entries (``0,1`` or UUIDs); None when unset;
    an empty list where it hides every GPU (``""``, ``-1``, ``NoDevFiles``)."""
    if text is None:
        return None
    entries = [e.strip() for e in text.split(",") if e.strip()]
    return [] if entries in ([], ["-1"], ["NoDevFiles"]) else entries


def node_gpus(environ: Mapping[str, str], dev: str = "/dev") -> int | None:
    """How many GPUs this node gives the step: Slurm's list of them, else the
    NVIDIA device files; None where there are none."""
    step = listed(environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS"))
    if step:
        return len(step)
    try:
        return sum(1 for name in os.listdir(dev) if DEVICE_FILE.fullmatch(name)) or None
    except OSError:
        return None


def task_device_ids(local: int, local_count: int, per_process: int | None, environ: Mapping[str, str],
                    on_node: int | None) -> tuple[list[int] | None, str]:
    """(the indices of the task's devices among those it sees, or None: all
    of them or none to choose; why, in a few words for the docs and -v)."""
    visible = listed(environ.get("CUDA_VISIBLE_DEVICES"))
    if visible == []:
        return None, "CUDA_VISIBLE_DEVICES hides every GPU"
    sees = len(visible) if visible is not None else on_node
    # Only Slurm's own list of the step's GPUs tells a binding apart: a
    # CUDA_VISIBLE_DEVICES the user set for the whole job is the node's set.
    step = listed(environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS"))
    if visible is not None and step and len(visible) < len(step):
        if per_process is None:
            return None, f"bound by the engine: it sees {len(visible)} of the step's {len(step)}"
        return list(range(per_process)), f"bound by the engine: the first {per_process} of the {len(visible)} it sees"
    if per_process is not None:
        return list(range(local * per_process, (local + 1) * per_process)), f"local rank {local} x {per_process}"
    if not sees:
        return None, "no GPU to count on this node"
    if local_count <= 1:
        return None, f"the only task on its node: all {sees}"
    share = sees // local_count
    if share == 0:
        return [local % sees], f"{local_count} tasks share {sees} GPUs: local rank {local} mod {sees}"
    return list(range(local * share, (local + 1) * share)), f"{sees} GPUs split among {local_count} tasks"


def tasks_per_node(text: str) -> list[int]:
    """Slurm's per-node task counts as one count per node: ``2(x3),1`` is
    [2, 2, 2, 1]; ValueError naming what cannot be read."""
    counts: list[int] = []
    for entry in text.split(","):
        match = TASKS_ENTRY.fullmatch(entry.strip())
        if not match:
            raise ValueError(f"SLURM_TASKS_PER_NODE={text}: cannot read {entry.strip()!r} "
                             "(expected N or N(xM), comma-separated)")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def tasks_on_node(per_node: str, node_index: int) -> int:
    """Slurm's compressed list, e.g. "2(x3),1": node 3 has 1 task."""
    counts = tasks_per_node(per_node) if per_node.strip() else []
    return counts[node_index] if node_index < len(counts) else 1


def local_count_from_env(environ: Mapping[str, str] = os.environ) -> int:
    """How many tasks of this step share our node, as the rank source's
    variables say (``LOCAL_COUNT_SOURCES``); without one, jaxrun's own
    numbering (Ray's nodes)."""
    source = environ.get(RANK_SOURCE, "")
    per_node, node = LOCAL_COUNT_SOURCES.get(source, (LOCAL_PROCESS_COUNT, None))
    return tasks_on_node(environ.get(per_node, ""), int(environ.get(node, "0")) if node else 0)
