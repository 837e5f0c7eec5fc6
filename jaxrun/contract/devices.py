"""Which GPUs one task of a scheduler step owns, from what its engine set;
and how many tasks share its node.  Below, a TPU host's chips: how many, and
each local process's share (``tpu_env``, for the launcher's plan).

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
from collections.abc import Mapping, Sequence

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


# -- TPU hosts -------------------------------------------------------------------
# One program at a time holds a TPU chip (libtpu's lockfile), so several
# processes on one host each get chips of their own, with the variables JAX's
# own multi-process runner (jax/_src/test_multiprocess.py) sets.  Each
# process's chips, as indices among the host's:
TPU_VISIBLE_CHIPS = "TPU_VISIBLE_CHIPS"
TPU_CHIPS_PER_PROCESS_BOUNDS = "TPU_CHIPS_PER_PROCESS_BOUNDS"  # the shape of one process's chips
TPU_PROCESS_BOUNDS = "TPU_PROCESS_BOUNDS"  # the shape of the grid of processes
TPU_PROCESS_ADDRESSES = "TPU_PROCESS_ADDRESSES"  # every process's host:port, where libtpu's processes meet
TPU_PROCESS_PORT = "TPU_PROCESS_PORT"  # this process's port among them
CLOUD_TPU_TASK_ID = "CLOUD_TPU_TASK_ID"  # this process's place among them
ALLOW_MULTIPLE_LIBTPU_LOAD = "ALLOW_MULTIPLE_LIBTPU_LOAD"
# What a Cloud TPU VM (or a GKE pod) sets for the whole host, which libtpu and
# JAX's TPU detection read as well: given jaxrun's numbering, so that the VM's
# "worker 0 of one" does not undo it.
TPU_WORKER_ID = "TPU_WORKER_ID"
TPU_WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"
TPU_HOST_BOUNDS = "TPU_HOST_BOUNDS"
TPU_CHIPS_PER_HOST_BOUNDS = "TPU_CHIPS_PER_HOST_BOUNDS"
# (chips the host's processes use together, chips per process) -> (process
# bounds, chips-per-process bounds): JAX's runner's table, and 8 chips by 2
# (absent there), which tiles the same 2x4 host as its 8 by 4.
TPU_LAYOUTS = {
    (1, 1): ("1,1,1", "1,1,1"),
    (4, 1): ("2,2,1", "1,1,1"),
    (4, 2): ("2,1,1", "1,2,1"),
    (4, 4): ("1,1,1", "2,2,1"),
    (8, 1): ("4,2,1", "1,1,1"),
    (8, 2): ("2,2,1", "1,2,1"),
    (8, 4): ("1,2,1", "2,2,1"),
    (8, 8): ("1,1,1", "2,4,1"),
}
# The chips' device files: /dev/accelN (TPU v2 to v4), /dev/vfio/N (v5e and
# newer: one VFIO group per chip).  A VFIO group may hold any device, so those
# count only as far as PCI lists Google TPUs (vendor 0x1ae0; its device ids for
# TPUs, as JAX's hardware_utils names them: v3 to TPU7x, not the gVNIC).
ACCEL_FILE = re.compile(r"accel\d+")
VFIO_GROUP = re.compile(r"\d+")
GOOGLE_VENDOR = "0x1ae0"
TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f", "0x0076"})


def _count(folder: str, pattern: re.Pattern) -> int:
    try:
        return sum(1 for name in os.listdir(folder) if pattern.fullmatch(name))
    except OSError:
        return 0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read(64).strip()
    except OSError:
        return ""


def tpu_pci_chips(root: str = "/") -> int:
    """How many TPU chips PCI lists (sysfs), 0 where it cannot be read."""
    folder = os.path.join(root, "sys/bus/pci/devices")
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    return sum(1 for name in names if _read(os.path.join(folder, name, "vendor")) == GOOGLE_VENDOR
               and _read(os.path.join(folder, name, "device")) in TPU_PCI_DEVICES)


def host_tpu_chips(environ: Mapping[str, str], root: str = "/") -> list[int] | None:
    """The TPU chips this host gives its processes, as the indices
    TPU_VISIBLE_CHIPS takes; None where there are none, or where the job
    leaves the TPU alone (JAX_PLATFORMS without ``tpu``).  TPU_VISIBLE_CHIPS,
    where set, is the set; else the chips' device files under ``root``: a
    sandbox may list more TPUs on PCI than it lets a process open (one VFIO
    group of four TPUs seen: JAX showed one chip)."""
    platforms = environ.get("JAX_PLATFORMS", "").strip()
    if platforms and "tpu" not in platforms.lower().split(","):
        return None
    visible = listed(environ.get(TPU_VISIBLE_CHIPS))
    if visible is not None:
        try:
            return [int(chip) for chip in visible] or None
        except ValueError:
            return None  # not ours to read: libtpu will say what is wrong with it
    accel = _count(os.path.join(root, "dev"), ACCEL_FILE)
    chips = accel or min(_count(os.path.join(root, "dev/vfio"), VFIO_GROUP), tpu_pci_chips(root))
    return list(range(chips)) or None


def tpu_split(chips: int, local_count: int, per_process: int | None) -> tuple[int, str, str]:
    """(chips per process, TPU_PROCESS_BOUNDS, TPU_CHIPS_PER_PROCESS_BOUNDS)
    for ``local_count`` processes on a host of ``chips`` TPU chips; ValueError,
    one line, where they do not fit as JAX's runner lays chips out."""
    s = "" if chips == 1 else "s"
    if per_process is None:
        if local_count > chips:
            raise ValueError(f"-n {local_count}: this machine has {chips} TPU chip{s}, and a chip is held by one "
                             f"process at a time; at most {chips} process{'' if chips == 1 else 'es'} here "
                             "(or --cpu-devices D for CPU processes)")
        if chips % local_count:
            raise ValueError(f"{chips} TPU chips cannot be split evenly among {local_count} processes; "
                             "pass --devices-per-process")
        per_process = chips // local_count
    if local_count * per_process > chips:
        raise ValueError(f"-n {local_count} x --devices-per-process {per_process} needs {local_count * per_process} "
                         f"TPU chips, but this machine has {chips}")
    layout = TPU_LAYOUTS.get((local_count * per_process, per_process))
    if layout is None:
        raise ValueError(f"-n {local_count} x {per_process} TPU chip{'' if per_process == 1 else 's'}: jaxrun lays "
                         "out a host's chips as JAX's multi-process runner does, 1, 4 or 8 chips in all, 1, 2, 4 "
                         "or 8 to a process")
    return per_process, *layout


def tpu_env(chips: Sequence[int], local: int, local_count: int, per_process: int | None,
            ports: Sequence[int]) -> dict[str, str]:
    """Local process ``local``'s TPU variables: its chips (the ``local``-th
    share of ``chips``, the host's), the layout, and where several meet (one
    port each in ``ports``; a lone process needs none)."""
    share, process_bounds, chip_bounds = tpu_split(len(chips), local_count, per_process)
    env = {
        TPU_VISIBLE_CHIPS: ",".join(str(c) for c in chips[local * share:(local + 1) * share]),
        TPU_CHIPS_PER_PROCESS_BOUNDS: chip_bounds, TPU_PROCESS_BOUNDS: process_bounds,
        CLOUD_TPU_TASK_ID: str(local), ALLOW_MULTIPLE_LIBTPU_LOAD: "1",
        TPU_WORKER_ID: str(local), TPU_HOST_BOUNDS: process_bounds, TPU_CHIPS_PER_HOST_BOUNDS: chip_bounds,
        TPU_WORKER_HOSTNAMES: "localhost",
    }
    if local_count > 1:
        env[TPU_PROCESS_ADDRESSES] = ",".join(f"localhost:{p}" for p in ports)
        env[TPU_PROCESS_PORT] = str(ports[local])
        env[TPU_WORKER_HOSTNAMES] = ",".join(["localhost"] * local_count)
    return env
