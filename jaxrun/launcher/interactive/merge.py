"""Pure: one statement's results from every process, merged for a reader.

Text that several processes wrote alike is shown once, each line marked with
their ranks, the way ``dshbak -c`` and ``clush -b`` gather the output of many
hosts; text that one process alone wrote is shown rank-prefixed, as a
script's output is.  Groups come in the order of their lowest rank::

    [0-3] 8
    [0] process=0 got result: -0.12398731708526611
    [1] process=1 got result: -0.12398731708526611

A traceback is a group of its own: one per distinct traceback, marked with
the ranks that raised it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from jaxrun.core.ranks import format_ranks
from jaxrun.wire import console


def label(ranks: Iterable[int]) -> str:
    return f"[{format_ranks(ranks)}]"


def groups(texts: Sequence[tuple[int, str]]) -> list[tuple[tuple[int, ...], str]]:
    """(ranks, text) for each distinct non-empty text, by lowest rank."""
    found: dict[str, list[int]] = {}
    for rank, text in sorted(texts):
        if text:
            found.setdefault(text, []).append(rank)
    return sorted(((tuple(ranks), text) for text, ranks in found.items()), key=lambda g: g[0][0])


def marked(ranks: Sequence[int], text: str) -> str:
    """Every line of ``text`` after its group's label; a last line without its
    newline gets one, so that the next group starts on a line of its own."""
    mark = label(ranks)
    return "".join(f"{mark} {line}\n" for line in text.splitlines())


def merge(texts: Sequence[tuple[int, str]]) -> str:
    return "".join(marked(ranks, text) for ranks, text in groups(texts))


def render(results: Sequence[console.Result]) -> tuple[str, str]:
    """(what goes to stdout, what goes to stderr) for one statement."""
    out = merge([(r.rank, r.out) for r in results])
    err = merge([(r.rank, r.err) for r in results]) + merge([(r.rank, r.error or "") for r in results])
    return out, err


def raised(results: Sequence[console.Result]) -> list[tuple[tuple[int, ...], str]]:
    """Each distinct traceback with the ranks that raised it."""
    return groups([(r.rank, r.error or "") for r in results])


def error_summary(results: Sequence[console.Result]) -> tuple[str, str] | None:
    """(exception name, one line naming the ranks) when any process raised."""
    failed = [r for r in results if r.error]
    if not failed:
        return None
    names = sorted({r.error_name or "Exception" for r in failed})
    last = failed[0].error.rstrip("\n").rsplit("\n", 1)[-1]
    return names[0], f"processes {format_ranks(r.rank for r in failed)} raised: {last}"
