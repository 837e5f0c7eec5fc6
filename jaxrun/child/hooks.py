"""Patching a module the moment it is first imported, without importing it first.

The child must join the job before jax creates a backend, and must not import
jax before the user's script does: a script may change ``os.environ`` or
``jax.config`` first.  So jaxrun waits for jax's own modules to load and
patches them as they arrive:

- ``after_import(name, patch)`` runs ``patch(module)`` right after ``name``
  has executed, before any other module can bind names from it (or at once,
  when it is already loaded: the preloading server imported it);
- ``on_first_import(package, callback)`` runs ``callback()`` when the
  script first imports ``package`` or one of its submodules, even when the
  package is already in ``sys.modules``.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import sys
from collections.abc import Callable


# The import system asks a finder for find_spec and a loader for
# create_module and exec_module, no more: plain classes, not importlib.abc's
# (its import is 0.4 ms of every process's start-up).
class _PatchingLoader:
    def __init__(self, loader, patch: Callable[[object], None]):
        self.loader, self.patch = loader, patch

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        self.patch(module)


class _PatchingFinder:
    def __init__(self) -> None:
        self.patches: dict[str, Callable[[object], None]] = {}

    def find_spec(self, name, path, target=None):
        patch = self.patches.pop(name, None)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


_finder = _PatchingFinder()


def after_import(name: str, patch: Callable[[object], None]) -> None:
    module = sys.modules.get(name)
    if module is not None:
        patch(module)
        return
    earlier = _finder.patches.get(name)
    if earlier is not None:  # two patches of one module (--check-divergence and --checks): both, in order
        patch = _both(earlier, patch)
    _finder.patches[name] = patch
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _both(first: Callable[[object], None], then: Callable[[object], None]) -> Callable[[object], None]:
    def patch(module) -> None:
        first(module)
        then(module)

    return patch


def on_first_import(package: str, callback: Callable[[], None]) -> None:
    """``callback`` raising makes the script's import statement raise, as an
    error at import time would."""
    original = builtins.__import__

    def watching(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0 and (name == package or name.startswith(package + ".")):
            builtins.__import__ = original
            callback()
        return original(name, globals, locals, fromlist, level)

    builtins.__import__ = watching
