"""The ``jaxrun`` command line: ``entry_point`` is the console script.

``early`` starts the commonest run's preloading server from the bare words,
before anything else loads; ``entry`` dispatches the subcommands and turns
click's errors into one line.  ``command`` declares the command and its
options, ``params`` the kinds of value they take, and ``helptext`` what
--help and --help-all print.  ``jaxrun.launcher.setup.configure`` turns the
parsed values into a ``RunConfig``, and ``jaxrun.launcher.run.run`` does
the work.

This package's own names load when first used (PEP 562): the console
script's first step is ``early``'s guess, not click's import."""

from __future__ import annotations

import sys

# Each name's module, loaded when the name is first used.
_WHERE = {
    "HELP_SECTIONS": "helptext", "SHORT_HELP": "helptext", "help_sections": "helptext",
    "HostPort": "params", "KeyValue": "params", "MeshSpecType": "params", "RankList": "params", "Seconds": "params",
    "Variable": "params",
    "backend_option": "command", "kernel": "command", "main": "command",
}
__all__ = ["entry_point", *_WHERE]


def entry_point(argv: list[str] | None = None) -> None:
    """Console-script entry (``cli.entry.entry_point``); as the command itself
    (no ``argv`` given), the guess first (``cli.early``)."""
    if argv is None:
        from jaxrun.cli import early

        early.guess(sys.argv[1:])
    from jaxrun.cli.entry import entry_point as enter

    enter(argv)


def __getattr__(name: str):
    import importlib

    where = _WHERE.get(name)
    if where is None:  # a module of the package's, as ``cli.command``
        try:
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
