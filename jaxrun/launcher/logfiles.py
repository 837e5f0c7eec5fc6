"""Where a run's files live, and how they are created.

Every file a run writes into its log folder is made here, so that the rules
for a folder other users may share (ownership, modes, no symlinks followed)
live in one place.
"""

from __future__ import annotations

import os
from typing import BinaryIO


def log_paths(log_dir: str, rank: int) -> tuple[str, str, str]:
    base = os.path.join(log_dir, f"process-{rank}")
    return base + ".stdout", base + ".stderr", base + ".error.json"


def prepare_log_dir(path: str) -> None:
    """The attempt's folder, before any process starts."""
    os.makedirs(path, exist_ok=True)


def open_log(path: str) -> int:
    """A log file for a child to write itself.  O_APPEND: grandchildren that
    share it interleave their writes instead of overwriting each other's."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o644)


def open_pumped_log(path: str) -> BinaryIO:
    """A log file jaxrun writes itself, from a remote process's pipe."""
    return open(path, "wb", buffering=0)
