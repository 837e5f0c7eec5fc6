"""The contract between jaxrun's parts: the one package every side imports.

The launcher (``jaxrun.launcher``), the backends and their far-end agents
(``jaxrun.backends``), the child side (``jaxrun.child``) and the reports
(``jaxrun.reporting``) never import each other's internals to agree on a
name.  Everything they must agree on is here:

- every environment variable jaxrun sets or reads (no ``JAXRUN_*`` name is
  spelled anywhere else);
- the module names put on command lines, and the shim's command line;
- the argument placeholders and their substitution;
- exit statuses: Popen's negative signal numbers against the shell's 128+N;
- the error record a child leaves behind for the run summary;
- how a part picks a port: bind one address, never a wildcard.

The messages that cross a socket are in :mod:`jaxrun.wire`.  Nothing here
imports jax.
"""

# One namespace for the users of the contract (``contract.ERROR_FILE``,
# ``contract.ErrorRecord``): the split into names, rules and records is for
# its readers, not its users.  The records (``contract.records``: dataclasses,
# json, regular expressions) are imported at the first use of one of their
# names: every controller imports the contract at start-up and needs none.
from jaxrun.contract.files import *  # noqa: F401,F403
from jaxrun.contract.helpers import *  # noqa: F401,F403
from jaxrun.contract.names import *  # noqa: F401,F403
from jaxrun.contract.owned import *  # noqa: F401,F403
from jaxrun.contract.timesplit import *  # noqa: F401,F403
from jaxrun.contract.traces import *  # noqa: F401,F403

TYPE_CHECKING = False  # typing's own flag, without importing typing
if TYPE_CHECKING:  # what a reader and a type checker see here; __getattr__ gives it
    from jaxrun.contract.records import *  # noqa: F401,F403


def __getattr__(name: str):
    """A name of ``contract.records``, as ``from ... import *`` would give it."""
    if not name.startswith("_"):
        import importlib

        records = importlib.import_module("jaxrun.contract.records")
        for key, value in vars(records).items():
            if not key.startswith("_"):
                globals().setdefault(key, value)  # what a test patched here stays
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    import importlib

    return sorted(set(globals()) | {k for k in vars(importlib.import_module("jaxrun.contract.records"))
                                    if not k.startswith("_")})
