"""Socket files that dead runs left behind.

A jaxrun or a process 0 that was SIGKILLed had no chance to remove its
socket file: a local attempt's coordination service (``coordinator-*.sock``)
stays in the user's socket folder, as a run's control channel
(``run-*.sock``) does.  Each is removed the way ``jaxrun top`` removes a
dead channel: nobody listens there (the connection is refused).  A file
younger than ``YOUNG`` is left alone, as it may be one whose listener is
between its bind and its listen.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import time

COORDINATOR_PREFIX, SUFFIX = "coordinator-", ".sock"
YOUNG = 1.0  # seconds


def remove_stale(folder: str, prefix: str = COORDINATOR_PREFIX, now: float | None = None) -> list[str]:
    """Remove each socket file of ``prefix`` in ``folder`` that nobody
    listens on any more; the paths removed."""
    now = time.time() if now is None else now
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    removed = []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(SUFFIX)):
            continue
        path = os.path.join(folder, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.geteuid() and now - st.st_mtime >= YOUNG and refused(path):
            with contextlib.suppress(OSError):
                os.unlink(path)
                removed.append(path)
    return removed


def refused(path: str) -> bool:
    """Nobody listens on the socket file at ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return True
        except OSError:
            return False
    return False
