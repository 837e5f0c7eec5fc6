"""The child side: what runs inside every controller before and around the user's script.

The shim joins the job (``jax.distributed.initialize`` before any device is
touched), installs the mesh, and runs the script as the real ``__main__``.
It reads the contract only, and imports jax only when the script would.
"""

import os as _os

# jaxrun's own folder, whose frames are never the user's call site (the
# checks' and the flight recorder's locators).  From this file's place:
# ``import jaxrun`` here would close a cycle (jaxrun -> runtime -> child).
JAXRUN_FOLDER = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
