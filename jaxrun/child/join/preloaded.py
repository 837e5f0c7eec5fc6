"""A controller forked from the preloading server found jax imported already
(``backends.forkserver.server``): what importing jax does that the server
did too early for this script is done at the script's own first ``import
jax`` (``sync_preloaded_config``): the JAX_* variables the script set
before it reach ``jax.config``, as jax would have read them there, and jax's
atexit hooks run in the order a plain import gives them."""

from __future__ import annotations

import atexit
import os
from collections.abc import Mapping

# The JAX_* variables the preloading server imported jax with; None when this
# process imported nothing before the script.
_preloaded_env: dict[str, str] | None = None
_preloaded_exit_hooks: list[tuple] = []


def forked() -> bool:
    """Whether this controller was forked with jax imported, and has not synced yet."""
    return _preloaded_env is not None


def note_preloaded_jax(import_env: Mapping[str, str], exit_hooks: list[tuple]) -> None:
    """Called in a forked controller: jax was imported with these JAX_* values
    and registered these atexit hooks.  The hooks are taken back until the
    script imports jax, so that they run in the order a plain import gives
    them relative to the script's own hooks."""
    global _preloaded_env, _preloaded_exit_hooks
    _preloaded_env = dict(import_env)
    _preloaded_exit_hooks = list(exit_hooks)
    for func, _, _ in _preloaded_exit_hooks:
        atexit.unregister(func)


def sync_preloaded_config() -> None:
    """What importing jax does that the preloading server did too early for
    this script, done now: read the JAX_* variables the script may have set
    before its ``import jax``, and register jax's atexit hooks.  Once only."""
    global _preloaded_env, _preloaded_exit_hooks
    if _preloaded_env is None:
        return
    before, _preloaded_env = _preloaded_env, None
    hooks_back, _preloaded_exit_hooks = _preloaded_exit_hooks, []
    for func, args, kwargs in hooks_back:
        atexit.register(func, *args, **kwargs)
    from jax._src import config

    for name, (kind, _, _) in list(config.config.meta.items()):
        var = name.upper()
        value = os.environ.get(var)
        if value is None or value == before.get(var):
            continue
        config.config.update(name, _parse_env(var, value, kind))


def _parse_env(var: str, value: str, kind) -> object:
    """As jax's config parses a variable at import, with its error messages."""
    if kind is bool:
        text = value.lower()
        if text in ("y", "yes", "t", "true", "on", "1"):
            return True
        if text in ("n", "no", "f", "false", "off", "0"):
            return False
        raise ValueError(f"invalid truth value {text!r} for environment {var!r}")
    if kind is int:
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"invalid integer value {value} for environment variable {var}") from None
    if kind is float:
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"invalid float value {value} for environment variable {var}") from None
    return value
