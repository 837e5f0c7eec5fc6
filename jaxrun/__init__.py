"""jaxrun: a launcher for multi-controller JAX, and helpers for the scripts it runs.

The launcher side never imports jax.  Inside a controller, the runtime helpers
(``jaxrun.process_id()``, ``jaxrun.mesh()``, ...) import it lazily.
"""

__version__ = "0.1.0"

# Names served lazily from jaxrun.runtime, which imports jax: the launcher
# imports this package too, and `jaxrun --help` must stay jax-free.
_RUNTIME_NAMES = frozenset({
    "process_id", "num_processes", "is_coordinator", "print0", "mesh",
    "local_slices", "make_global_array", "replica_input_index", "make_global_batch",
    "InputStream", "assert_replicas_identical", "assert_same_across_processes",
    "ReplicaMismatchError", "ProcessMismatchError",
    "alive", "checkpointing", "checkpoint_saved", "step",
})


def __getattr__(name):
    if name in _RUNTIME_NAMES:
        from jaxrun import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'jaxrun' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | _RUNTIME_NAMES)
