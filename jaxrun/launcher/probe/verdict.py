"""What the probe's figures say: which hosts (or links) are slow, by a rule
relative to the median of the others, so that it holds on any hardware.

Pure: a ``wire.probe.ProbeResult`` and each rank's host in, a ``ProbeVerdict``
out.  The thresholds, and the figures that chose them, are in
docs/probe.md:

- compute: a process whose matmul takes ``COMPUTE_SLOWER`` times the median
  of the other processes' or more;
- a host's network: each process's *best* link (its fastest pair), against
  the median of the other processes' best links.  A host whose every link
  is slow has a slow best link; a healthy host has at least one healthy
  peer, so one bad host does not make its peers look bad (the bisection:
  a link is the host's when every pair through that host is slow);
- a link: among the hosts not named (for any reason: a host whose compute
  is slow has slow transfers too), a pair ``LINK_SLOWER`` times slower than
  the median of those pairs is named as a link, both ends given;
- latency: a best latency ``LATENCY_HIGHER`` times the others' median, and
  at least ``LATENCY_FLOOR_S`` above it (below that, a loaded host's
  scheduling moves a tiny transfer by as much).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from jaxrun.wire.probe import ProbeResult, Sizes, rounds

COMPUTE_SLOWER = 3.0
BANDWIDTH_SLOWER = 3.0
LINK_SLOWER = 3.0
LATENCY_HIGHER = 10.0
LATENCY_FLOOR_S = 1e-3


@dataclasses.dataclass(frozen=True)
class Link:
    peer: int
    seconds: float  # the pair's bandwidth transfer: the faster of its two ends' figures
    latency_s: float


@dataclasses.dataclass(frozen=True)
class Row:
    rank: int
    host: str  # the name jaxrun placed it by (or the host's own name where the engine placed it)
    devices: int
    compute_s: float
    compute_ratio: float  # to the median of the others; 1.0 alone
    links: tuple[Link, ...]
    why: tuple[str, ...]  # empty: fine

    def best(self) -> Link | None:
        return min(self.links, key=lambda link: link.seconds, default=None)


@dataclasses.dataclass(frozen=True)
class ProbeVerdict:
    rows: tuple[Row, ...]
    slow_links: tuple[tuple[int, int, str], ...]  # (rank, rank, why) between hosts not named
    allreduce_s: float
    sizes: Sizes
    platform: str

    def named(self) -> dict[str, str]:
        """{host: why}, every host named, in rank order; a slow link names
        its later host (the earlier one keeps process 0 where it was)."""
        out: dict[str, str] = {}
        for row in self.rows:
            if row.why:
                out.setdefault(row.host, "; ".join(row.why))
        for a, b, why in self.slow_links:
            out.setdefault(self.rows[b].host, f"link to {self.rows[a].host}: {why}")
        return out

    @property
    def exit_code(self) -> int:
        return 1 if self.named() else 0

    def mb_s(self, seconds: float) -> float:
        return self.sizes.bandwidth_bytes / seconds / 1e6 if seconds > 0 else 0.0


def median_of_others(values: Sequence[float], index: int) -> float | None:
    others = [v for i, v in enumerate(values) if i != index]
    return statistics.median(others) if others else None


def pair_figures(result: ProbeResult) -> dict[tuple[int, int], tuple[float, float]]:
    """{(a, b): (bandwidth seconds, latency seconds)} for every pair, the
    faster end's: both ends start after one barrier, but not at the same
    instant, and the end that started last waited least for its peer."""
    out = {}
    for i, pairs in enumerate(rounds(len(result.hostnames))):
        for a, b in pairs:
            out[(a, b)] = (min(result.bandwidth_s[a][i], result.bandwidth_s[b][i]),
                           min(result.latency_s[a][i], result.latency_s[b][i]))
    return out


def judge(result: ProbeResult, hosts: Sequence[str]) -> ProbeVerdict:
    n = len(result.hostnames)
    pairs = pair_figures(result)
    links = [tuple(Link(b if a == r else a, *pairs[(a, b)]) for (a, b) in pairs if r in (a, b)) for r in range(n)]
    best = [min((link.seconds for link in own), default=0.0) for own in links]
    best_latency = [min((link.latency_s for link in own), default=0.0) for own in links]
    sizes = Sizes.parse(result.sizes)
    rows = []
    for r in range(n):
        why = []
        usual = median_of_others(result.compute_s, r)
        ratio = result.compute_s[r] / usual if usual else 1.0
        if ratio >= COMPUTE_SLOWER:
            why.append(f"compute {ratio:.1f}x the others' median ({result.compute_s[r] * 1e3:.0f} ms against "
                       f"{usual * 1e3:.0f} ms)")
        usual_best = median_of_others(best, r)
        if n > 2 and usual_best and best[r] >= BANDWIDTH_SLOWER * usual_best:
            why.append(f"every link slow: {_rate(sizes, best[r])} at best, the others' best "
                       f"{_rate(sizes, usual_best)}")
        usual_latency = median_of_others(best_latency, r)
        if n > 2 and usual_latency is not None and best_latency[r] >= LATENCY_HIGHER * usual_latency \
                and best_latency[r] - usual_latency >= LATENCY_FLOOR_S:
            why.append(f"latency {best_latency[r] * 1e3:.1f} ms at best, the others' "
                       f"{usual_latency * 1e3:.2f} ms")
        rows.append(Row(r, hosts[r], int(result.devices[r]), result.compute_s[r], ratio, links[r], tuple(why)))
    # A host named for its compute is left out too: its CPU also drives its
    # transfers, so its pairs are slow for its own reason (hostD's here).
    named = {row.rank for row in rows if row.why}
    among = {pair: figures for pair, figures in pairs.items() if not set(pair) & named}
    slow_links = []
    if len(among) > 1:
        for (a, b), (seconds, _) in among.items():
            usual = statistics.median(s for pair, (s, _) in among.items() if pair != (a, b))
            if seconds >= LINK_SLOWER * usual:
                slow_links.append((a, b, f"{_rate(sizes, seconds)}, the other links' median {_rate(sizes, usual)}"))
    return ProbeVerdict(tuple(rows), tuple(slow_links), result.allreduce_s, sizes, result.platform)


def _rate(sizes: Sizes, seconds: float) -> str:
    return f"{sizes.bandwidth_bytes / seconds / 1e6:.0f} MB/s" if seconds > 0 else "-"
