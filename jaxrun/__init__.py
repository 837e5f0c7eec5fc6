"""jaxrun: a launcher for multi-controller JAX, and helpers for the scripts it runs.

The launcher side never imports jax.  Inside a controller, the runtime helpers
(``jaxrun.process_id()``, ``jaxrun.mesh()``, ...) import it lazily.
"""

__version__ = "0.1.0"
