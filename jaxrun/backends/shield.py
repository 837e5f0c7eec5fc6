"""Helpers that leave the stop signals to the launcher.

A job is often stopped by signalling every process of its tree at once:
Slurm's ``scancel``, systemd stopping a control group, a container runtime's
stop.  Each controller then gets SIGTERM directly, and so does jaxrun, which
forwards it and gives every controller ``--grace`` seconds.  A helper that
jaxrun started (the fork server, an ``ssh`` client, an agent, ``mpirun``)
gets it too; if it died of it, its controllers would lose their grace: the
fork server's exits would go unreported, an ssh connection would drop (and
its host agent kill at once), mpirun would SIGKILL its job a second after
forwarding the signal.

So every helper starts with SIGINT, SIGTERM and SIGHUP *blocked* (the signal
mask is inherited through ``fork`` and ``exec``), and the launcher alone
decides what they mean.  Blocked rather than ignored, for two reasons:

- OpenSSH's client keeps an inherited SIG_IGN only in its main loop; a
  session over a ControlMaster (a mux client) installs its handlers
  whatever it inherited, and then dies of SIGTERM.  Blocked, the handlers
  never run.  mpirun likewise never unblocks them.
- A signal sent to a controller between its start and the moment it unblocks
  stays pending and is delivered then; an ignored one would be lost, and a
  stop asked for at that moment would wait out the whole grace period.

Every controller unblocks them before the script runs (``child.shim``, and
the fork server right after its fork), so a script sees what a plain launch
gives it.  ``srun`` cannot be shielded: it unblocks the signals and turns
its own SIGTERM into a SIGKILL of its tasks (see docs/backends.md).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

from jaxrun import contract

STOP_SIGNALS = frozenset(contract.STOP_SIGNALS)  # a set, as pthread_sigmask takes it


@contextlib.contextmanager
def shielded() -> Iterator[None]:
    """Whatever this thread starts meanwhile inherits the stop signals
    blocked.  This process still gets them: the kernel hands one that
    arrives meanwhile to another thread, or holds it until the block ends."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def shield_self() -> None:
    """This thread (and every thread and process it starts later) holds the
    stop signals: call it first thing in a helper, before any thread starts."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
