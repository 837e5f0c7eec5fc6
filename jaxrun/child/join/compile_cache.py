"""The compile cache the attempts of a run share (``contract.COMPILE_CACHE``).

When restarts are possible, the launcher names a folder for JAX's persistent
compile cache, and each process turns that name into
``JAX_COMPILATION_CACHE_DIR`` here, before the script runs.  JAX reads the
variable at import (the preloading server's processes read it at the
script's first ``import jax``, see ``preloaded.sync_preloaded_config``), so
a ``jax.config.update`` of the script's own still wins, and a variable the
process already has (the user's, an ``--env``, a host's own) is left alone.

The folder is made on the host that runs the process, mode 0700: the
launcher's path where the process runs on the launching machine, else a
folder named after the run in this host's per-user base,
``$TMPDIR/jaxrun-cache-UID`` (or the private one of a random name beside
it, where another user made that name first).  JAX opens the folder by its
name for as long as the process runs, so it must be a folder no other user
can swap (``contract.trusted_path``: no folder on the way is theirs to
change), and this user's alone; else the process runs without the cache,
said in one line on stderr.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import MutableMapping

from jaxrun import contract


def host_base(tmpdir: str | None = None) -> str:
    """This host's per-user folder for the caches of runs started elsewhere,
    made private (OSError: it cannot be)."""
    return contract.private_folder_in(tmpdir or tempfile.gettempdir(), f"jaxrun-cache-{os.geteuid()}")[0]


def apply(environ: MutableMapping[str, str] = os.environ, tmpdir: str | None = None) -> str | None:
    """Set ``JAX_COMPILATION_CACHE_DIR`` to the run's shared folder, made
    private; the folder, or None when there is none to share."""
    name = environ.get(contract.COMPILE_CACHE)
    if not name or contract.own_compile_cache(environ):
        return None
    if not os.path.isabs(name) and (os.sep in name or name in (os.curdir, os.pardir)):
        print(f"jaxrun: no shared compile cache: {contract.COMPILE_CACHE}={name!r} is neither a path nor a "
              "run's name", file=sys.stderr, flush=True)
        return None
    folder = real = name
    try:
        folder = name if os.path.isabs(name) else os.path.join(host_base(tmpdir), name)
        problem = contract.private_folder(folder)
        real, unsafe = contract.trusted_path(folder)
    except OSError as e:
        problem, unsafe = f"it cannot be created ({e.strerror or e})", None
    if problem or unsafe:
        print(f"jaxrun: no shared compile cache: {folder} is not private: {problem or unsafe}", file=sys.stderr,
              flush=True)
        return None
    environ[contract.JAX_COMPILATION_CACHE_DIR] = real
    return real
