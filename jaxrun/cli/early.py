"""The commonest run's preloading server, started from the bare command
line, before click and the launcher load.

A local run that preloads (``jaxrun -n 4 --cpu-devices 2 toy.py``) waits
for its server's ``import jax``: that is its critical path.  The launcher's
own imports (click, the configuration, the plan: about 90 ms) come before
its command line is parsed, and ``backends.table.head_start`` starts the
server only then.  ``guess`` starts it first, where the words alone say the
run is local, preloads and names a script; ``take`` hands it to the run
once the command line is parsed.  A guess that was wrong costs nothing but
a server closed unused: the parsed run that is not local, or bad input,
closes it (``take``, or at exit), and the fork server's backend still
checks that the server serves the plan before it uses it
(``forkserver.client.serves``), else it starts the right one.

Only the console script guesses (``entry_point`` with no ``argv``); a test
that calls the command in its own process never gets a server it did not
ask for.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from jaxrun import contract

# Words after which the run is not a local one that preloads with the
# launcher's environment and python, or is no run at all: no guess.
NOT_GUESSED = frozenset({
    "--hosts", "-H", "--host", "--hosts-command", "--min-hosts", "--launcher", "--probe",
    "--dry-run", "--no-preload", "--preload-module", "--python", "-x", "--env", "--export",
    "-i", "--interactive", "--kernel-pipe", "--help", "--help-all", "--version",
})
# The subcommands (``cli._entry``): none starts a run.
SUBCOMMANDS = frozenset({"k8s", "logs", "probe", "kernel", "stacks", "top", "profile"})

_guessed = None  # the server ``guess`` started, until ``take`` hands it on or closes it


def guesses(argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> bool:
    """Whether these words alone say: a local run that preloads, of a script or a module."""
    if not argv or argv[0] in SUBCOMMANDS or environ.get(contract.NO_PRELOAD, "") not in ("", "0"):
        return False
    for word in argv:
        if word.split("=", 1)[0] in NOT_GUESSED:
            return False
        if word == "-m" or word.endswith(".py"):  # the target: the words after it are the script's own
            return True
    return False


def guess(argv: Sequence[str]) -> None:
    """Start the server now where ``guesses`` says so."""
    global _guessed
    if not guesses(argv):
        return
    import atexit

    from jaxrun.backends.table import start_server

    try:
        _guessed = start_server(sys.executable, {})
    except OSError:  # no process to spare: the run, if there is one, says so itself
        return
    atexit.register(_close)


def take(config) -> object | None:
    """The guessed server, for a run that may use it (its backend checks
    that it serves the plan); None, the server closed, for any other."""
    global _guessed
    server, _guessed = _guessed, None
    if server is None:
        return None
    if config.backend != "local" or not config.preload or config.preload_modules or config.dry_run:
        server.close(wait=False)
        return None
    return server


def _close() -> None:
    """At exit: a guessed server no run took (bad input, ``--help`` after all)."""
    global _guessed
    server, _guessed = _guessed, None
    if server is not None:
        server.close()
