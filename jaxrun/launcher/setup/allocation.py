"""What the environment says about the job jaxrun runs in: an allocation's
task layout, and a job step jaxrun must not be started in.  Pure: the
environment comes in as a mapping.

Inside ``sbatch -N 4`` or ``salloc -N 4`` Slurm sets ``SLURM_NNODES=4`` and
``SLURM_TASKS_PER_NODE=1(x4)`` but no ``SLURM_NTASKS`` (it sets that only
where ``-n`` was given), so the count is read in this order:
``--nodes`` times ``--ntasks-per-node``; ``--ntasks-per-node`` times the
allocation's nodes; ``SLURM_NTASKS``; the sum of ``SLURM_TASKS_PER_NODE``
(over the first ``--nodes`` nodes); one per node of ``SLURM_NNODES``.  The
layout says which of them decided, for the dry run.

A job step (``srun jaxrun ...``, ``mpirun -n 4 jaxrun ...``) runs one jaxrun
per task, and each would start a whole job of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from jaxrun.contract.devices import tasks_per_node
from jaxrun.core.config import BackendEntry, LaunchError
from jaxrun.core.ranks import DIGITS
from jaxrun.core.spec import Host


@dataclasses.dataclass(frozen=True)
class Layout:
    """How many processes the allocation holds, and what said so (one line)."""

    count: int
    source: str


def _number(environ: Mapping[str, str], name: str) -> int | None:
    value = environ.get(name, "").strip()
    return int(value) if DIGITS.match(value) and int(value) > 0 else None


def slurm_layout(environ: Mapping[str, str], nodes: int | None, per_node: int | None) -> Layout | None:
    """The process count that ``--nodes``, ``--ntasks-per-node`` and the
    allocation's variables give together, in the module docstring's order;
    None where none of them says (outside an allocation, no flag)."""
    if nodes and per_node:
        return Layout(nodes * per_node, f"--nodes {nodes} x --ntasks-per-node {per_node}")
    allocated = _number(environ, "SLURM_NNODES") or _number(environ, "SLURM_JOB_NUM_NODES")
    if per_node and allocated:
        return Layout(allocated * per_node, f"SLURM_NNODES={allocated} x --ntasks-per-node {per_node}")
    for name in ("SLURM_NTASKS", "SLURM_NPROCS"):  # the second: older Slurm's name
        ntasks = _number(environ, name)
        if ntasks:
            return Layout(ntasks, f"{name}={ntasks}")
    text = environ.get("SLURM_TASKS_PER_NODE", "").strip()
    if text:
        try:
            counts = tasks_per_node(text)
        except ValueError as e:
            raise LaunchError(str(e)) from None
        if nodes and nodes < len(counts):
            return Layout(sum(counts[:nodes]), f"SLURM_TASKS_PER_NODE={text} (its first {nodes} nodes: --nodes)")
        return Layout(sum(counts), f"SLURM_TASKS_PER_NODE={text}")
    if allocated:
        count = min(nodes, allocated) if nodes else allocated
        return Layout(count, f"SLURM_NNODES={allocated} (one process per node)")
    return None


def step_refusal(environ: Mapping[str, str]) -> str | None:
    """Why jaxrun must not run here, when it was started as one task of a
    job step of several: by ``srun`` (``SLURM_STEP_ID`` with its task
    variables; a batch script has no step id, and a one-task step such as
    ``srun --pty bash`` is a shell) or by an MPI launcher."""
    if "SLURM_STEP_ID" in environ:
        tasks = _number(environ, "SLURM_STEP_NUM_TASKS") or _number(environ, "SLURM_NTASKS") or 1
        rank = environ.get("SLURM_PROCID", "0")
        if tasks > 1 or rank not in ("", "0"):
            job = environ.get("SLURM_JOB_ID", "?")
            return (f"started as task {rank} of {tasks} of Slurm step {job}.{environ['SLURM_STEP_ID']} "
                    "(srun jaxrun ...); nothing was started: run jaxrun once, in the batch script or salloc "
                    "shell, as 'jaxrun --launcher slurm SCRIPT', and it starts the srun step itself")
    for rank_name, size_name, engine in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "mpirun"),
                                         ("PMIX_RANK", "PMIX_SIZE", "an MPI launcher"),
                                         ("PMI_RANK", "PMI_SIZE", "an MPI launcher")):
        if rank_name in environ:
            size = _number(environ, size_name) or 1
            rank = environ[rank_name]
            if size > 1 or rank not in ("", "0"):
                return (f"started as rank {rank} of {size} by {engine} ({rank_name} is set); nothing was "
                        "started: run jaxrun once, not under mpirun, as 'jaxrun --launcher mpirun SCRIPT', "
                        "and it starts mpirun itself")
    return None


def process_count(values: Mapping[str, Any], entry: BackendEntry, hosts: Sequence[Host],
                  environ: Mapping[str, str]) -> Layout:
    """-n, else every host slot, else the allocation's layout (for a backend
    that reads it: ``slurm_layout``), else 1.  An empty source: -n said."""
    given = values["num_processes"]
    if given:
        return Layout(given, "")
    if hosts:
        from jaxrun.launcher.setup.hosts import total_slots

        return Layout(total_slots(hosts), "")
    if entry.reads_allocation:
        layout = slurm_layout(environ, values.get("nodes"), values.get("tasks_per_node"))
        if layout is not None:
            return layout
    return Layout(1, "")


def refuse_a_step(environ: Mapping[str, str]) -> None:
    """Exit 2 before anything starts when jaxrun runs as one task of a step."""
    why = step_refusal(environ)
    if why:
        raise LaunchError(why)
