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
``$TMPDIR/jaxrun-cache-UID``.  A folder that is not this user's alone is
refused with one line on stderr, and the process runs without the cache.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import MutableMapping

from jaxrun import contract


def host_base(tmpdir: str | None = None) -> str:
    """This host's per-user folder for the caches of runs started elsewhere."""
    return os.path.join(tmpdir or tempfile.gettempdir(), f"jaxrun-cache-{os.geteuid()}")


def apply(environ: MutableMapping[str, str] = os.environ, tmpdir: str | None = None) -> str | None:
    """Set ``JAX_COMPILATION_CACHE_DIR`` to the run's shared folder, made
    private; the folder, or None when there is none to share."""
    name = environ.get(contract.COMPILE_CACHE)
    if not name or contract.own_compile_cache(environ):
        return None
    if os.path.isabs(name):
        folders = [name]
    elif os.sep in name or name in (os.curdir, os.pardir):
        print(f"jaxrun: no shared compile cache: {contract.COMPILE_CACHE}={name!r} is neither a path nor a "
              "run's name", file=sys.stderr, flush=True)
        return None
    else:
        folders = [host_base(tmpdir), os.path.join(host_base(tmpdir), name)]
    for folder in folders:
        try:
            problem = contract.private_folder(folder)
        except OSError as e:
            problem = f"it cannot be created ({e.strerror})"
        if problem:
            print(f"jaxrun: no shared compile cache: {folder} is not private: {problem}", file=sys.stderr, flush=True)
            return None
    environ[contract.JAX_COMPILATION_CACHE_DIR] = folders[-1]
    return folders[-1]
