"""The preflight's table: every process's host, pid and versions, and the
check that jax and jaxlib match across processes (rows in, a line out; the
table shown in one write)."""

from __future__ import annotations

from typing import TextIO

from jaxrun import contract
from jaxrun.child.join.errors import BootstrapError

# Every process must run the same jax and jaxlib: mixed versions fail later in
# obscure ways (mismatched HLO, hangs in collectives).
_MUST_MATCH = ("jax", "jaxlib")


def check_versions(rows: list[dict]) -> None:
    """BootstrapError naming the processes when jax or jaxlib versions differ."""
    for field in _MUST_MATCH:
        seen: dict[str, list[int]] = {}
        for row in rows:
            seen.setdefault(row[field], []).append(row["process"])
        if len(seen) > 1:
            parts = "; ".join(
                f"{v} on process{'es' if len(ps) > 1 else ''} {', '.join(map(str, ps))}" for v, ps in seen.items()
            )
            raise BootstrapError(f"{field} versions differ across processes: {parts}")


def format_preflight(rows: list[dict]) -> str:
    header = ("process", "host", "pid", "jax", "jaxlib", "python")
    table = [header] + [(str(r["process"]), r["host"], str(r["pid"]), r["jax"], r["jaxlib"], r["python"]) for r in rows]
    return "jaxrun: preflight\n" + "\n".join("  " + line for line in contract.align_columns(table))


def show_preflight(rows: list[dict], stream: TextIO) -> None:
    """The table in one write, its last newline included.

    ``print`` writes the text and then its newline, and a line-buffered
    stream flushes the first write at its first newline: the table's last row
    then reaches the launcher apart from the rest, and a line of the
    launcher's own ("4/4 processes joined") could land inside the table.
    """
    stream.write(format_preflight(rows) + "\n")
    stream.flush()
