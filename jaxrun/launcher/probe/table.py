"""The probe's verdict as people and machines read it: the table
(``jaxrun probe``, ``--probe``, ``jaxrun logs``), its JSON (``--json``,
``probe.json`` in the run's folder), and the plan ``--dry-run`` prints.
Pure."""

from __future__ import annotations

from collections.abc import Sequence

from jaxrun.launcher.probe.verdict import (
    BANDWIDTH_SLOWER,
    COMPUTE_SLOWER,
    LATENCY_FLOOR_S,
    LATENCY_HIGHER,
    LINK_SLOWER,
    ProbeVerdict,
)
from jaxrun.wire.probe import Sizes, rounds

ALL_PEERS = 6  # up to this many peers a row lists each; beyond, its best and worst


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):g} MiB" if nbytes >= 1 << 20 else f"{nbytes} B"


def table_lines(verdict: ProbeVerdict) -> list[str]:
    rows = verdict.rows
    head = ("HOST", "COMPUTE", "BANDWIDTH TO PEERS (MB/s)", "LATENCY TO PEERS (ms)", "VERDICT")
    body = []
    for row in rows:
        links = sorted(row.links, key=lambda link: link.seconds)
        if len(links) > ALL_PEERS:
            links = [links[0], links[-1]]
        bandwidth = ", ".join(f"{rows[link.peer].host} {verdict.mb_s(link.seconds):.0f}" for link in links) or "-"
        latency = ", ".join(f"{rows[link.peer].host} {link.latency_s * 1e3:.2f}" for link in links) or "-"
        ratio = row.compute_ratio  # two digits below 0.1x: a fast host beside a slow one read "0.0x"
        compute = f"{row.compute_s * 1e3:.0f} ms ({ratio:.1f}x)" if ratio >= 0.095 else \
            f"{row.compute_s * 1e3:.0f} ms ({ratio:.2f}x)"
        said = "SLOW: " + "; ".join(row.why) if row.why else "ok"
        for a, b, why in verdict.slow_links:
            if row.rank in (a, b):
                said = f"slow link to {rows[b if row.rank == a else a].host}: {why}" + ("" if said == "ok" else
                                                                                        f"; {said}")
        body.append((row.host, compute, bandwidth, latency, said))
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(4)]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 4 else cell for i, cell in enumerate(line)).rstrip()
             for line in [head, *body]]
    n = len(rows)
    if n > 1:
        lines.append(f"all-reduce of {_mib(verdict.sizes.bandwidth_bytes)} over {n} processes: "
                     f"{verdict.allreduce_s * 1e3:.0f} ms")
    named = verdict.named()
    lines.append(f"named: {', '.join(named)}" if named else "all fine")
    return lines


def as_dict(verdict: ProbeVerdict) -> dict:
    rows = verdict.rows
    return {
        "platform": verdict.platform,
        "sizes": {name: int(value) for name, value in (arg.split("=") for arg in verdict.sizes.args())},
        "rule": {"compute_slower": COMPUTE_SLOWER, "bandwidth_slower": BANDWIDTH_SLOWER, "link_slower": LINK_SLOWER,
                 "latency_higher": LATENCY_HIGHER, "latency_floor_ms": LATENCY_FLOOR_S * 1e3},
        "hosts": [{"rank": row.rank, "host": row.host, "devices": row.devices,
                   "compute_ms": round(row.compute_s * 1e3, 3), "compute_ratio": round(row.compute_ratio, 3),
                   "links": {rows[link.peer].host: {"mb_s": round(verdict.mb_s(link.seconds), 1),
                                                    "latency_ms": round(link.latency_s * 1e3, 3)}
                             for link in row.links},
                   "verdict": "slow" if row.why else "ok", "why": list(row.why)} for row in rows],
        "slow_links": [{"hosts": [rows[a].host, rows[b].host], "why": why} for a, b, why in verdict.slow_links],
        "allreduce_ms": round(verdict.allreduce_s * 1e3, 3),
        "named": verdict.named(),
        "exit": verdict.exit_code,
    }


def plan_lines(hosts: Sequence[str], sizes: Sizes) -> list[str]:
    """What the probe would do on these processes' hosts (``--dry-run``)."""
    n = len(hosts)
    lines = [f"# probe: {n} process{'' if n == 1 else 'es'}, one job",
             f"# compute: a {sizes.matmul}x{sizes.matmul} float32 matmul, {sizes.matmul_iters} in a row, "
             f"{sizes.reps} times on each device, each started together (the fastest)"]
    schedule = rounds(n)
    if schedule:
        lines.append(f"# links: {len(schedule)} round{'' if len(schedule) == 1 else 's'} of disjoint pairs, "
                     f"{_mib(sizes.bandwidth_bytes)} "
                     f"(bandwidth) and {_mib(sizes.latency_bytes)} (latency) each way, up to {sizes.reps} times "
                     f"or {sizes.budget_ms} ms a round (the fastest, of the pair's faster end)")
        for i, pairs in enumerate(schedule):
            lines.append(f"#   round {i + 1}: " + ", ".join(f"{hosts[a]}-{hosts[b]}" for a, b in pairs))
        lines.append(f"# then one all-reduce of {_mib(sizes.bandwidth_bytes)} over every process")
    return lines
