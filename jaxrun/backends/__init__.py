"""The ways jaxrun starts controllers, each in its package beside its far-end agent.

The table of them, ``BACKENDS``, with ``create_backend`` and ``head_start``,
is in ``table``, served from here on first use: a far end (the preloading
server, a host's agent) imports a module of this package without paying for
the table's imports.
"""

from __future__ import annotations

_TABLE_NAMES = frozenset({"BACKENDS", "create_backend", "head_start"})


def __getattr__(name):
    if name in _TABLE_NAMES:
        from jaxrun.backends import table

        return getattr(table, name)
    raise AttributeError(f"module 'jaxrun.backends' has no attribute {name!r}")
