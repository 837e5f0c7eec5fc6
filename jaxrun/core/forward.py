"""What a process started on another machine gets from the shell that
launched jaxrun: one rule for every backend whose processes do not inherit
this environment (over SSH, mpirun's other nodes, Ray's workers).

The settings that shape a JAX job travel: ``JAX_*``, ``XLA_*``, ``NCCL_*``,
``TF_CPP_*``, ``CUDA_*`` and ``LD_LIBRARY_PATH``, as ``mpirun -x`` lists and
Ray's runtime environments carry them; not the ones jaxrun sets for each
process itself (a process's device ids, its coordinator), and not the two
that name this machine's things: ``CUDA_VISIBLE_DEVICES``, its GPUs, and
``JAX_COMPILATION_CACHE_DIR``, a folder here (over SSH a job with restarts
gets a cache of its own on each host).  Give either with -x to mean the
hosts'.  An engine whose far end has no login environment at all (mpirun's
other nodes, Ray's workers) also needs the interpreter's ``PATH``,
``PYTHONPATH`` and ``VIRTUAL_ENV``; an SSH session has the host's own.
"""

from __future__ import annotations

from collections.abc import Mapping

from jaxrun import contract

PREFIXES = ("JAX_", "XLA_", "NCCL_", "TF_CPP_", "CUDA_")
NAMES = ("LD_LIBRARY_PATH",)
ENGINE_NAMES = ("PATH", "PYTHONPATH", "VIRTUAL_ENV")
# Set per process by jaxrun, or about this machine only.
NOT_CARRIED = (contract.JAX_LOCAL_DEVICE_IDS, contract.JAX_COORDINATOR_ADDRESS, "JAX_PROCESS_ID",
               "JAX_NUM_PROCESSES", "CUDA_VISIBLE_DEVICES", contract.JAX_COMPILATION_CACHE_DIR)


def carried(name: str, engine: bool = False) -> bool:
    """Whether this shell's ``name`` reaches the processes elsewhere;
    ``engine``: for an engine's far end with no environment of its own."""
    if name in NOT_CARRIED:
        return False
    return name in NAMES or name.startswith(PREFIXES) or (engine and name in ENGINE_NAMES)


def forwarded(environ: Mapping[str, str], engine: bool = False) -> dict[str, str]:
    """The part of ``environ`` that travels (see ``carried``)."""
    return {name: value for name, value in environ.items() if carried(name, engine)}
