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
import stat

from jaxrun.contract.files import read_small
from jaxrun.contract.owned import open_own_file, private_folder_in, private_folders

# The launcher's ask: the first starts a trace, the next stops it (SIGUSR1 is the stack dump).
PROFILE_SIGNAL = _signal.SIGUSR2
TRACE_MARKER = "jaxrun-trace.json"
MARKER_LIMIT = 1 << 16


def trace_folder(value: str, tmpdir: str | None = None, make: bool = False) -> str | None:
    """The folder ``PROFILE_DIR``'s value names on this host: an absolute
    path is itself (a folder of the launching machine's log folder); a bare
    name is a folder of that name in this host's per-user base
    (``$TMPDIR/jaxrun-profile-UID``, or the private one of a random name
    beside it where another user made that first: ``trace_base``);
    anything else, None."""
    if os.path.isabs(value):
        return value
    if not value or os.sep in value or value in (os.curdir, os.pardir):
        return None
    return os.path.join(trace_base(tmpdir, make), value)


def process_trace_folder(attempt_folder: str, rank: int) -> str:
    """Process ``rank``'s trace folder in its attempt's (``profiling`` in the
    attempt's log folder): the launcher names it for each process it
    starts, and a scheduler's task agent, told the attempt's folder (one
    environment serves every task), for its own."""
    return os.path.join(attempt_folder, f"process-{rank}")


def trace_base(tmpdir: str | None = None, make: bool = False) -> str:
    """This host's per-user folder for the traces of runs started elsewhere:
    made where ``make`` (OSError: it cannot be), else the one there is."""
    import tempfile  # here: a controller that is never traced pays nothing for it

    parent, name = tmpdir or tempfile.gettempdir(), f"jaxrun-profile-{os.geteuid()}"
    if make:
        return private_folder_in(parent, name)[0]
    found = private_folders(parent, name)
    return found[0] if found else os.path.join(parent, name)


def trace_sessions(folder: str | int) -> tuple[list[str], list[str]]:
    """The session folders in ``folder`` (a path, or a folder held open)
    whose trace is over, and those still being taken, by name, oldest
    first.  A link is neither."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return [], []
    sessions = [n for n in names if _kind(folder, n) == stat.S_IFDIR]
    over = [n for n in sessions if _kind(folder, os.path.join(n, TRACE_MARKER)) == stat.S_IFREG]
    return over, [n for n in sessions if n not in over]


def _kind(folder: str | int, name: str) -> int | None:
    """What ``name`` in ``folder`` is (``stat.S_IFMT``: its last part not followed), or None."""
    try:
        if isinstance(folder, int):
            return stat.S_IFMT(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
        return stat.S_IFMT(os.lstat(os.path.join(folder, name)).st_mode)
    except OSError:
        return None


def trace_marker(session: str | int) -> dict:
    """What the session's marker says: ``host`` and ``error`` (either may be None)."""
    import json  # here: only whoever gathers the traces reads a marker

    if isinstance(session, int):
        try:
            with os.fdopen(open_own_file(TRACE_MARKER, session), "rb") as f:
                data = f.read(MARKER_LIMIT + 1)
        except OSError:
            data = None
        data = data if data is not None and len(data) <= MARKER_LIMIT else None
    else:
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
