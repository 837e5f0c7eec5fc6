"""JAX's per-run noise, which the console hides and the logs keep, and
reading a log a run of lines at a time."""

from __future__ import annotations

import re
from typing import BinaryIO

# Lines JAX and its collectives print on every run; hidden on the console only.
# Gloo's "[Gloo] Rank 0 is connected to 3 peer ranks. Expected number of
# connected peer ranks is : 3" is written in pieces from C++ threads: pieces
# of two notices interleave, and a piece can land in the middle of a line the
# script prints.  So the pieces are cut out wherever they are, and what the
# script wrote around them stays.
_NOISE = re.compile(
    rb"\[Gloo\] Rank ?\d* ?"
    rb"|is connected to \d+ peer ranks\.? ?"
    rb"|Expected number of connected peer ranks is : \d+"
)

# JAX's teardown on an accelerator (a TPU host, issue 71): as process 0's
# coordination service stops, each process's WatchTasks call ends, which it
# says in three lines on stderr; or, where the service's socket file is gone
# already, that it cannot connect to it.  Whole lines, on a clean run too (a
# bare python has no coordination service).
_TEARDOWN = re.compile(
    rb"WatchTasksAsync failed for task \d+: CANCELLED"
    rb"|^Additional GRPC error information from remote target coordination_service while calling "
    rb"/xla\.coordination\.CoordinationService/WatchTasks:"
    rb'|^:UNKNOWN:Error received from peer\s+\{[^}]*grpc_message:"CANCELLED"'
    rb"|failed to connect to all addresses.*coordinator-[0-9a-f]+\.sock.*No such file or directory"
)
# Substrings every teardown line holds one of (the console's quick test).
TEARDOWN_MARKS = (b"WatchTasks", b"Error received from peer", b"failed to connect to all addresses")


def is_noise(line: bytes) -> bool:
    return bool(_NOISE.search(line) or _TEARDOWN.search(line))


def without_noise(line: bytes) -> bytes | None:
    """The line with JAX's notices cut out; None when nothing else was on it."""
    if _TEARDOWN.search(line):
        return None
    rest = _NOISE.sub(b"", line)
    return rest if rest.strip() else None


def read_lines_in_chunks(f: BinaryIO, size: int = 1 << 18):
    """Yield runs of complete lines (the last may lack its newline)."""
    partial = b""
    while True:
        data = f.read(size)
        if not data:
            break
        data = partial + data
        cut = data.rfind(b"\n") + 1
        partial = data[cut:]
        if cut:
            yield data[:cut]
    if partial:
        yield partial
