"""Where a controller keeps the traces the launcher asks for
(``PROFILE_DIR``), as the child writes them and whoever gathers them reads
them: the launcher for a folder on its own machine, an SSH host's far end
for one of its own.

A trace folder holds one session folder per trace a process took, named
when it began (its pid and a count, so that every life of a process has
its own); inside, what ``jax.profiler`` wrote
(``plugins/profile/STAMP/HOST.xplane.pb`` and its kin), and, once the trace
is over, the marker ``TRACE_MARKER``: JSON with the host name jax used and
an error, if the trace could not be taken.  A session without its marker
is not finished yet.  Nothing here imports jax or reads what jax wrote.
"""

from __future__ import annotations

import _signal  # not signal: contract.STOP_SIGNALS says why
import os

from jaxrun.contract.files import read_small

# The launcher's ask: the first starts a trace, the next stops it (SIGUSR1 is the stack dump).
PROFILE_SIGNAL = _signal.SIGUSR2
TRACE_MARKER = "jaxrun-trace.json"
MARKER_LIMIT = 1 << 16


def trace_folder(value: str, tmpdir: str | None = None) -> str | None:
    """The folder ``PROFILE_DIR``'s value names on this host: an absolute
    path is itself (a folder of the launching machine's log folder); a bare
    name is a folder of that name in this host's per-user base
    (``$TMPDIR/jaxrun-profile-UID``); anything else, None."""
    if os.path.isabs(value):
        return value
    if not value or os.sep in value or value in (os.curdir, os.pardir):
        return None
    return os.path.join(trace_base(tmpdir), value)


def process_trace_folder(attempt_folder: str, rank: int) -> str:
    """Process ``rank``'s trace folder in its attempt's (``profiling`` in the
    attempt's log folder): the launcher names it for each process it
    starts, and a scheduler's task agent, told the attempt's folder (one
    environment serves every task), for its own."""
    return os.path.join(attempt_folder, f"process-{rank}")


def trace_base(tmpdir: str | None = None) -> str:
    """This host's per-user folder for the traces of runs started elsewhere."""
    import tempfile  # here: a controller that is never traced pays nothing for it

    return os.path.join(tmpdir or tempfile.gettempdir(), f"jaxrun-profile-{os.geteuid()}")


def trace_sessions(folder: str) -> tuple[list[str], list[str]]:
    """The session folders in ``folder`` whose trace is over, and those still
    being taken, by name, oldest first."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return [], []
    sessions = [n for n in names
                if os.path.isdir(os.path.join(folder, n)) and not os.path.islink(os.path.join(folder, n))]
    over = [n for n in sessions if os.path.isfile(os.path.join(folder, n, TRACE_MARKER))]
    return over, [n for n in sessions if n not in over]


def trace_marker(session: str) -> dict:
    """What the session's marker says: ``host`` and ``error`` (either may be None)."""
    import json  # here: only whoever gathers the traces reads a marker

    data = read_small(os.path.join(session, TRACE_MARKER), MARKER_LIMIT)
    try:
        said = json.loads(data) if data else {}
    except ValueError:
        said = {}
    said = said if isinstance(said, dict) else {}
    host, error = said.get("host"), said.get("error")
    return {"host": host if isinstance(host, str) else None, "error": error if isinstance(error, str) else None}




def session_lines(prefix: str, head: str, parts, folder: str, command: str) -> list[str]:
    """What a taken trace comes to, each line after ``prefix`` ("jaxrun:
    profile:"): how many processes it holds and where (after ``head``, as
    "run ID:"), each process without one and why, and the command that
    opens it.  ``parts``: each process's ``rank``, ``files`` and ``problem``."""
    got = [part for part in parts if part.files]
    lines = [f"{prefix} {head}{len(got)} of {len(parts)} processes traced into {folder}"]
    lines += [f"{prefix} process {part.rank}: {part.problem}" for part in parts if part.problem]
    if got:
        lines.append(f"{prefix} open it with: {command}")
    return lines
