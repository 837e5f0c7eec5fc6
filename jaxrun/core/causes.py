"""Which process failed first: the root cause from evidence, not arrival order.

Exits reach the launcher in an order that says little about which failure
came first: a fork server reaps every controller that ended in one pass, in
rank order; a host agent's exit crosses a network; a loaded machine runs the
waiter threads late.  When one process dies, its peers fail moments later,
and their exits may be heard first.

So the supervisor gathers every failure heard before its SIGKILL went out
and settles the root cause from what each process left (``first_failure``):

1. a process that ended on its own, without evidence of a lost peer, comes
   before one whose helper was lost (its end never came home: the ssh
   client, the connection to its host, the preloading server, the task
   agent), which comes before one that failed as a consequence of a lost
   peer (``LOST_PEER``: Gloo's or NCCL's closed and reset connections, the
   coordination service's heartbeat, barrier and error-polling messages);
2. within that class, the first one heard; but among those that ended on
   their own, one that ended earlier on the same machine, by the same
   clock, comes first: by the time of its error record if it left one, else
   the time its reaper saw it end.  Times from different machines are never
   compared (their clocks may differ), and neither are the ends of helpers
   or of peers that failed in turn, which say nothing about the first.

A process whose end was heard only after jaxrun's SIGKILL went out was
taken as stopped by jaxrun; but where it died of a signal jaxrun never
sends (a SIGSEGV, a SIGBUS, an abort of its own: ``CRASH_SIGNALS``), it
ended on its own before the kill, and its news was late (Ray's word of an
actor's death, on a loaded machine), so it is judged with the others.

The evidence is the process's error record (``contract.ErrorRecord``) or,
where it left none (``os._exit``, a signal, a C++ check that aborts), the
end of its stderr log.  ``docs/contract.md`` states the rule for users.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import signal
import socket
from collections.abc import Mapping, Sequence

from jaxrun import contract
from jaxrun.core.outcome import ProcessRecord, Verdict

# How much of the end of a stderr log is read for evidence: a C++ check's
# fatal line is followed by its stack and a Python stack dump, both short.
STDERR_TAIL = 64 * 1024

# What a process prints or raises when a peer is gone: its failure is a
# consequence.  Each is a message of the library named, as JAX 0.10 spells it.
LOST_PEER = re.compile("|".join((
    # Gloo (CPU collectives): "Gloo all-reduce failed: [.../pair.cc:...] Connection closed by peer [addr]"
    r"Gloo [\w -]+ failed",
    r"Connection closed by (remote )?peer",
    r"\b(Read|Write) error \[",  # "Read error [10.0.0.2]:40123: Connection reset by peer"
    # NCCL (GPU collectives)
    r"remote process exited or there was a network error",
    # The coordination service: a peer's heartbeat stopped, a barrier lost a
    # member, the error another task raised was polled and this one aborts.
    r"stopped sending heartbeats",
    r"heartbeat timeout",
    r"distributed service detected fatal errors",
    r"Polled an error from coordination service",
    r"Barrier timed out",
    r"Barrier failed because",
    r"already in error before the barrier",
    r"Shutdown barrier (in coordination service )?has failed",
    r"Failed to send RPC to coordination service",
    r"has disconnected from coordination service",
    r"Coordination service has stopped",
    # An RPC to the coordination service when its process is gone (issue 74:
    # a process still starting, or in a key-value wait, as process 0 ends).
    r"UNAVAILABLE: \w+: ?Connection reset by peer",  # "sendmsg: Connection...", "recvmsg:Connection..."
    r"UNAVAILABLE: Socket closed",
)), re.IGNORECASE)


# What the coordination service says when a task registers while the job's
# process of that id is connected: another process registered as it, from
# outside the job (the service has no authentication) or the same process
# joining twice.  The service then puts every task in error and each one
# aborts, which says nothing about which process of the job failed.
SECOND_REGISTRATION = re.compile(r"\b(\d+) unexpectedly tried to connect with a different incarnation")


# Signals jaxrun never sends a process (it sends SIGUSR1 for stack dumps, the
# stop signals, SIGKILL, and what the user forwards): a death by one of them
# is the process's own, whenever its news arrived.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT,
                           signal.SIGSYS, signal.SIGTRAP})


def crashed(record: ProcessRecord) -> bool:
    """Whether the process died of a signal jaxrun never sends."""
    return record.returncode is not None and -record.returncode in CRASH_SIGNALS


def second_registration(text: str) -> int | None:
    """The task id the coordination service saw register a second time, in
    ``text`` (a log's end), or None."""
    found = SECOND_REGISTRATION.search(text)
    return int(found.group(1)) if found else None


class FailureKind(enum.IntEnum):
    """A failure's class; a lower one came first."""

    OWN = 0  # it ended on its own: an exception, an exit code, a signal from elsewhere
    HELPER_LOST = 1  # its end never came home; a helper's end stands in for it
    LOST_PEER = 2  # it failed because a peer was gone


@dataclasses.dataclass(frozen=True)
class Failure:
    """One process that failed before jaxrun's SIGKILL, in the order heard."""

    rank: int
    kind: FailureKind
    at: float | None = None  # wall clock of ``clock``'s machine: its error record's time, else its reap
    clock: str | None = None  # the machine whose clock ``at`` reads; None: never compared


def clock_id() -> str:
    """This machine, as reapers name the clock of their ``reaped_at``."""
    return socket.gethostname()


def is_lost_peer(text: str) -> bool:
    """Whether ``text`` (an exception's headline, or the end of a log) says
    that a peer of the job was gone."""
    return LOST_PEER.search(text) is not None


def classify(record: contract.ErrorRecord | None, stderr_tail: str, lost: str | None = None) -> FailureKind:
    """A failure's class from its evidence: the error record if the process
    left one, else the end of its stderr log."""
    evidence = record.headline if record is not None else stderr_tail
    if is_lost_peer(evidence):
        return FailureKind.LOST_PEER
    return FailureKind.HELPER_LOST if lost else FailureKind.OWN


def first_failure(failures: Sequence[Failure]) -> int | None:
    """The rank of the root cause among ``failures`` (in the order heard):
    the first of the lowest class, or, among those that ended on their own,
    one that ended earlier on the same clock."""
    if not failures:
        return None
    lowest = min(f.kind for f in failures)
    first = next(f for f in failures if f.kind == lowest)
    if lowest is not FailureKind.OWN or first.at is None or first.clock is None:
        return first.rank
    same_clock = [f for f in failures if f.kind == lowest and f.clock == first.clock and f.at is not None]
    return min(same_clock, key=lambda f: f.at).rank  # min keeps the first heard of equal times


def settle(records: Mapping[int, ProcessRecord], heard: Sequence[int], root: int) -> int:
    """The root cause among the failures ``heard`` (ranks, in order), where
    the run took ``root`` for it as it heard them; the verdicts follow.  A
    process taken as stopped that crashed on its own (``crashed``) is
    among them: its end's news came after the kill."""
    failures = [failure_of(rec.spec.rank, rec.error_file, rec.stderr_log, rec.reaped_at, rec.clock, rec.lost)
                for rec in (records[rank] for rank in heard)
                if rec.verdict in (Verdict.ROOT_CAUSE, Verdict.CONSEQUENCE)
                or (rec.verdict is Verdict.STOPPED and crashed(rec))]
    first = first_failure(failures)
    if first is None or first == root:
        return root
    records[root].verdict, records[first].verdict = Verdict.CONSEQUENCE, Verdict.ROOT_CAUSE
    return first


def failure_of(rank: int, error_file: str | None, stderr_log: str | None, reaped_at: float | None,
               clock: str | None, lost: str | None) -> Failure:
    """What a finished process's files say about its failure."""
    record = contract.ErrorRecord.load(error_file)
    tail = "" if record is not None else read_tail(stderr_log)
    at = record.at if record is not None and record.at else reaped_at
    return Failure(rank, classify(record, tail, lost), at, clock)


def read_tail(path: str | None, size: int = STDERR_TAIL) -> str:
    """The last ``size`` bytes of a log, as text ("" if it cannot be read, or
    is not a regular file: see ``contract.read_tail``)."""
    data = contract.read_tail(path, size) if path else None
    return "" if data is None else data.decode("utf-8", "replace")
