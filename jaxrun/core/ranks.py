"""Rank lists as users write them (``0``, ``0,2-3``, ``all``, ``none``):
--console-ranks, and ``jaxrun logs --ranks``."""

from __future__ import annotations

import re

from jaxrun.core.config import LaunchError

DIGITS = re.compile(r"[0-9]{1,18}\Z")  # ASCII only: str.isdigit() accepts "²", which int() refuses


def parse_ranks(text: str) -> tuple[range, ...] | None:
    """0 | 0,2 | 0-3,6 | all | none: the ranges (None for all), checked
    against -n once that is known; ValueError for anything else.

    Kept as ranges until then: "0-100000000000" is one range object, where a
    set of its members would exhaust memory before -n could refuse it."""
    text = str(text).strip().lower()
    if text in ("all", "none"):
        return None if text == "all" else ()
    ranges = []
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not DIGITS.match(first) or (dash and not DIGITS.match(last)) or (dash and int(last) < int(first)):
            raise ValueError("not a list of ranks like 0 or 0,2-3 (or all, or none)")
        ranges.append(range(int(first), int(last or first) + 1))
    return tuple(ranges)


def console_rank_set(ranges: tuple[range, ...] | None, num_processes: int) -> frozenset[int] | None:
    """--console-ranks as the set the printer asks, once every rank in it is known to exist."""
    if ranges is None:
        return None
    highest = max((r[-1] for r in ranges), default=-1)
    if highest >= num_processes:
        raise LaunchError(f"--console-ranks: there is no process {highest} among {num_processes}")
    return frozenset(rank for r in ranges for rank in r)


def format_ranks(ranks) -> str:
    """Ranks as a list users write: [0, 1, 2, 3, 6] -> "0-3,6"."""
    parts: list[str] = []
    run: list[int] = []
    for rank in sorted(set(ranks)):
        if run and rank != run[-1] + 1:
            parts.append(_span(run))
            run = []
        run.append(rank)
    if run:
        parts.append(_span(run))
    return ",".join(parts)


def _span(run: list[int]) -> str:
    return str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
