"""The record of finished runs that ``jaxrun logs`` reads (its view is
``jaxrun.launcher.output.logs``).

What torchrun and Slurm users reach for after a run (``sacct``, ``cat
slurm-*.out``).  Every run leaves ``run.json`` in its log folder (written by
:func:`record_run` at the end); runs in the per-user default folder are
listed from there.
"""

from __future__ import annotations

import datetime
import json
import os

from jaxrun import contract
from jaxrun.core import logfiles

RECORD = "run.json"
RECORD_MAX = 1 << 20  # a run's argv and times; anything larger is not one of ours


def record_run(log_dir: str, argv: list[str], exit_code: int, started: float) -> None:
    """What ``jaxrun logs`` lists: written once the run is over (best effort)."""
    data = {"argv": argv, "exit_code": exit_code, "started": started, "ended": datetime.datetime.now().timestamp()}
    try:
        logfiles.write_atomically(os.path.join(log_dir, RECORD), json.dumps(data).encode())
    except OSError:
        pass


def runs(base: str, skipped: list[str] | None = None) -> list[tuple[str, dict]]:
    """(folder, record) of each finished run under ``base``, newest first.
    Only this user's runs count (``foreign``); a folder of another user's,
    or a record that is not one jaxrun wrote (``malformed``), is left out,
    and one line each says why in ``skipped``."""
    found = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in sorted(names):
        folder = os.path.join(base, name)
        if not os.path.lexists(os.path.join(folder, RECORD)):
            continue  # not a run
        why = foreign(folder)
        if why is None:
            data = contract.read_small(os.path.join(folder, RECORD), RECORD_MAX)
            if data is None:
                continue  # too large, a link, not a file: not one of ours
            try:
                record = json.loads(data)
            except ValueError:  # bad bytes too (UnicodeDecodeError)
                record = None
            why = malformed(record)
        if why:
            if skipped is not None:
                skipped.append(f"jaxrun: skipped {folder}: {why}")
            continue
        found.append((folder, record))
    return sorted(found, key=lambda item: item[1].get("started", 0), reverse=True)


def foreign(folder: str) -> str | None:
    """Why the run folder ``folder`` is not this user's to trust (a link,
    another user's), or None.  Its mode is the user's business: an explicit
    --log-dir may be a folder they made open to read."""
    try:
        why = contract.private_problem(os.lstat(folder), any_mode=True)
    except OSError as e:
        return e.strerror or str(e)
    return why and why.replace("it belongs to", "another user's run: it belongs to")


def malformed(record) -> str | None:
    """What makes ``record`` not a run.json jaxrun wrote, or None."""
    if not isinstance(record, dict):
        return f"its {RECORD} is not a record"
    for key, kinds in (("started", (int, float)), ("ended", (int, float)), ("exit_code", (int, type(None))),
                       ("argv", (list,))):
        value = record.get(key)
        if key in record and (not isinstance(value, kinds) or isinstance(value, bool)):
            return f"its {RECORD}'s {key} is of the wrong kind ({type(value).__name__})"
    if not all(isinstance(word, str) for word in record.get("argv", [])):
        return f"its {RECORD} has an argv that is not a list of words"
    if not -1e11 < record.get("started", 0) < 1e11:
        return f"its {RECORD} has a started time out of range"
    return None


def ranks_in(folder: str) -> list[int]:
    ranks = set()
    for name in os.listdir(folder):
        head, _, tail = name.partition(".")
        if head.startswith("process-") and head[8:].isdigit() and tail in ("stdout", "stderr"):
            ranks.add(int(head[8:]))
    return sorted(ranks)
