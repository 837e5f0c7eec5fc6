"""At the far end: one process's finished traces, home over the host's connection.

``jaxrun profile`` and ``--profile`` ask every controller for a trace
(``child.watch.profiling``); a controller on an SSH host writes it in its own trace
folder there (``contract.PROFILE_DIR``, a bare name in the host's per-user
base, ``contract.traces``).  Once the trace is over, the launcher runs this
module in a session on the host's master (``SshBackend.bring_home``) with
the folder's name and how long to wait: it waits until no trace in the
folder is still being written (or the wait is over), writes the finished
ones to stdout as one tar stream, and removes them (and the folder, once
empty).  It reads nothing of
what jax wrote.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tarfile
import time

from jaxrun import contract

POLL = 0.1


def main(argv: list[str]) -> int:
    if len(argv) != 2 or os.path.isabs(argv[0]) or contract.trace_folder(argv[0]) is None:
        print("usage: traces_agent NAME WAIT (NAME: a trace folder's bare name)", file=sys.stderr)
        return 2
    folder, wait = contract.trace_folder(argv[0]), float(argv[1])
    problem = not_private(folder)
    if problem:
        print(f"{folder} is not private: {problem}", file=sys.stderr)
        return 1
    end = time.monotonic() + wait
    while contract.trace_sessions(folder)[1] and time.monotonic() < end:
        time.sleep(POLL)
    over = contract.trace_sessions(folder)[0]
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        for name in over:
            tar.add(os.path.join(folder, name), arcname=name)  # links stay links, never followed
    sys.stdout.buffer.flush()
    for name in over:
        shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    with contextlib.suppress(OSError):  # nothing left on the host (its process makes it again for another trace)
        os.rmdir(folder)
    return 0


def not_private(folder: str) -> str | None:
    """What is wrong with the folder (another user's, open to others), or
    None; a folder that is not there holds nothing to send."""
    try:
        return contract.private_problem(os.lstat(folder))
    except FileNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
