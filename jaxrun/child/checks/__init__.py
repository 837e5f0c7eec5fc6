"""Child side of ``--checks``: the guide's silent mistakes, caught by default.

The checks, on unless ``--checks off``:

- programs (:mod:`jaxrun.child.checks.programs`): every process fingerprints each
  compiled program whose devices span more than one process, as it gets it
  (compiled or from the persistent cache), and at its first run the
  processes that take part compare them in order; the first difference
  stops the job;
- meetings (:mod:`jaxrun.child.checks.meeting`): that first run waits until
  every process of the program's group has come to the same program, so a
  program some never come to runs none of its collectives;
- replicas (:mod:`jaxrun.child.checks.replicas`): an array built from per-process
  data whose sharding puts one slice on devices of several processes has
  that slice's fingerprint compared among them, on a sample of the calls
  (every call under ``--checks strict``);
- partings (:mod:`jaxrun.child.checks.parting`): a program that spans
  processes where some of them never come (rank 0 alone evaluates: it waits
  at its meeting) is found from the time account's long waits and stops the
  job in seconds.

Both compare through the coordination service's key-value store from a
thread of their own (:mod:`jaxrun.child.checks.agreement`), never on the step's
path.  Nothing here imports jax: the checks patch it when the script
imports it.
"""

from __future__ import annotations

import os

from jaxrun import contract
from jaxrun.child import hooks

_mode = contract.CHECKS_OFF


def mode(environ=os.environ) -> str:
    """The mode the launcher asked for; unset is on, an unknown word off."""
    said = environ.get(contract.CHECKS, contract.CHECKS_ON)
    return said if said in contract.CHECKS_MODES else contract.CHECKS_OFF


def prepare(environ, rank: int, count: int) -> None:
    """Arrange for the checks to be installed when the script imports jax.
    A process alone has nothing to agree with: nothing is patched."""
    global _mode
    _mode = mode(environ)
    if _mode == contract.CHECKS_OFF or count < 2:
        return

    def install(_jax) -> None:
        from jaxrun.child.checks import agreement, parting, programs, replicas

        board = agreement.start(rank, count)
        strict = _mode == contract.CHECKS_STRICT
        checker = programs.install(board, strict=strict)
        if checker is not None:
            parting.install(board, checker)
        replicas.install(board, strict=strict)

    hooks.after_import("jax", install)


def script_returned() -> None:
    """The script returned: settle the comparisons still open (bounded), then stop."""
    if _mode == contract.CHECKS_OFF:
        return
    import sys

    agreement = sys.modules.get("jaxrun.child.checks.agreement")
    if agreement is not None:
        agreement.script_returned()
