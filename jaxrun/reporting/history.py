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


def runs(base: str) -> list[tuple[str, dict]]:
    """(folder, record) of each finished run under ``base``, newest first."""
    found = []
    try:
        names = os.listdir(base)
    except OSError:
        return []
    for name in names:
        data = contract.read_small(os.path.join(base, name, RECORD), RECORD_MAX)
        try:
            record = json.loads(data) if data is not None else None
        except ValueError:  # bad bytes too (UnicodeDecodeError)
            continue
        if isinstance(record, dict):
            found.append((os.path.join(base, name), record))
    return sorted(found, key=lambda item: item[1].get("started", 0), reverse=True)


def ranks_in(folder: str) -> list[int]:
    ranks = set()
    for name in os.listdir(folder):
        head, _, tail = name.partition(".")
        if head.startswith("process-") and head[8:].isdigit() and tail in ("stdout", "stderr"):
            ranks.add(int(head[8:]))
    return sorted(ranks)
