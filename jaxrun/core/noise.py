"""JAX's per-run noise and its fatal-error pages, which the console hides
and the logs keep, and reading a log a run of lines at a time."""

from __future__ import annotations

import re
from typing import BinaryIO

from jaxrun.core.ranks import format_ranks

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


# JAX's fatal-error pages (issue 74): when a peer is gone (the root cause
# ended first), every other process aborts on its own as the coordination
# service goes away, and prints a page: the agent's and the preemption
# manager's error lines, the fatal line of the service's client, each RPC's
# details under them, then the check's C++ stack ("@ 0x..." frames).  A page
# starts at one of its head lines; the lines under it belong to it while they
# have a page's shape.
_PAGE_HEAD = re.compile(
    rb"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+(?:\s+\d+)? "
    rb"(?:coordination_service_agent|coordination_service|preemption_sync_manager)\.cc:\d+\]"
    rb"|^F\d{4} \d\d:\d\d:\d\d\.\d+(?:\s+\d+)? client\.h:\d+\] Terminating process because"
    rb"|^\*\*\* Check failure stack trace: \*\*\*"
)
_PAGE_BODY = re.compile(
    rb"^Additional GRPC error information from remote target"
    rb"|^:UNKNOWN:Error received from peer"
    rb"|^\s+@\s+0x[0-9a-f]+"
    # The end of a JAX error's message (a lost peer's, which the console's
    # traceback fold hides as part of a page: ``FatalPages.enter``).
    rb"|^-{20}\r?$"
    rb"|^For simplicity, JAX has removed its internal frames"
    # Between a chain's tracebacks (the next one is read as a traceback again).
    rb"|^During handling of the above exception, another exception occurred:"
    rb"|^The above exception was the direct cause of the following exception:"
    rb"|^\s*$"
)
# Substrings a chunk holds where it may hold a page's head (the console's quick test).
PAGE_MARKS = (b"coordination_service", b"preemption_sync_manager", b"client.h:", b"*** Check failure")


class FatalPages:
    """Which lines of each process's stderr are JAX's fatal-error pages, and
    how many there were: the console hides them and says so in one line."""

    def __init__(self) -> None:
        self.inside: set[int] = set()  # ranks whose stderr is inside a page
        self.counts: dict[int, int] = {}  # rank -> the lines hidden
        self.tracebacks: set[int] = set()  # ranks whose lost peer's traceback was hidden too
        self.message: set[int] = set()  # ranks inside that traceback's message (its indented lines are the page's)

    def hides(self, rank: int, line: bytes) -> bool:
        """Whether ``line`` (a line of the process's stderr) is a page's."""
        inside = rank in self.inside
        if _PAGE_HEAD.match(line) or (inside and (_PAGE_BODY.match(line) or
                                                  (rank in self.message and line.startswith((b" ", b"\t"))))):
            self.inside.add(rank)
            self.counts[rank] = self.counts.get(rank, 0) + 1
            return True
        self.inside.discard(rank)
        self.message.discard(rank)
        return False

    def enter(self, rank: int, lines: int) -> None:
        """A lost peer's traceback of ``lines`` lines, hidden by the console's
        fold: it counts as a page, and what JAX writes under it belongs to it."""
        self.inside.add(rank)
        self.message.add(rank)
        self.tracebacks.add(rank)
        self.counts[rank] = self.counts.get(rank, 0) + lines

    def said(self) -> str | None:
        """"processes 1-3: JAX's fatal-error pages, 36 lines", for the
        summary's last line, or None where none was hidden."""
        if not self.counts:
            return None
        ranks = sorted(self.counts)
        many = len(ranks) > 1
        what = "JAX's fatal-error pages" if many else "JAX's fatal-error page"
        if self.tracebacks:
            what += " and lost-peer tracebacks" if len(self.tracebacks) > 1 else " and a lost-peer traceback"
        total = sum(self.counts.values())
        lines = "1 line" if total == 1 else f"{total} lines"
        return f"{'processes' if many else 'process'} {format_ranks(ranks)}: {what}, {lines}"


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
