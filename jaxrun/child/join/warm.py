"""What a controller would import after its start, imported once ahead of it.

A preloading server (:mod:`jaxrun.backends.forkserver.server`) imports jax
once and forks every controller from it; what the server had not imported,
each controller imports again, all of them at the same moment on the same
cores, on the way to the job's first collective.  So the server also
imports, once, what a controller otherwise imports right after the fork:

- the shim and the child side's modules that ``--checks`` (on by default),
  the flight recorder and the watches load (importing them only defines
  them; each still installs itself only where its mode is on);
- ``encodings.idna``, which the first connection to the coordinator by name
  loads (``socket.getaddrinfo``);
- the modules jax itself loads lazily for a job's first program: the MLIR
  dialects of its first lowering, and ``multihost_utils``, which
  ``device_put`` of host data onto devices of several processes uses.
  Importing them creates no MLIR context, thread or backend, so a fork
  after them is as safe as after ``import jax``.  A jax that has no such
  module is simply not warmed there.

On the guide's toy (4 processes on 2 cores) this was about 20 ms of each
controller's CPU between its fork and its first program.
"""

from __future__ import annotations

import importlib

# The child side, every module that a controller may import before and
# while its script runs.
CHILD = (
    "jaxrun.child.join.bootstrap",
    "jaxrun.child.join.preflight",
    "jaxrun.child.shim",
    "jaxrun.child.join.compile_cache",
    "jaxrun.child.checks.agreement",
    "jaxrun.child.checks.programs",
    "jaxrun.child.checks.replicas",
    "jaxrun.child.checks.replicas_prints",
    "jaxrun.child.checks.flight",
    "jaxrun.child.checks.divergence",
    "jaxrun.child.checks.parting",
    # The watches the shim loads where they are on (the stall watchdog and the
    # account by default; a trace where the launcher named a folder).
    "jaxrun.child.watch.activity",
    "jaxrun.child.watch.accounting",
    "jaxrun.child.watch.marks",
    "jaxrun.child.watch.profiling",
    "encodings.idna",
)

# What jax imports on its first lowering and first cross-process device_put
# (found with an audit hook on imports, jax 0.10).
JAX_LAZY = (
    "jaxlib.mlir.dialects.mhlo",
    "jaxlib.mlir.dialects.builtin",
    "jax.experimental.multihost_utils",
)


def warm() -> None:
    """Import the child side (an error here is the server's to report) and
    what jax loads lazily (where this jax has it)."""
    for name in CHILD:
        importlib.import_module(name)
    for name in JAX_LAZY:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # another jax: its controllers import what they need themselves
