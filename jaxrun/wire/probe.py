"""The probe's protocol (``jaxrun probe``, ``--probe``): what the launcher
asks of the probe job, and what process 0 of that job says back.

The ask travels as the probe module's arguments (``Sizes.args``, read back
with ``Sizes.parse``); the answer is one ``ProbeResult`` line on process
0's stdout, which every backend already brings home into the run's log
folder.  The schedule of pairs is here because both ends must agree on it:
the job runs one transfer round per entry, and the launcher reads each
round's figures by the same pairs.
"""

from __future__ import annotations

import dataclasses

from jaxrun.wire.encoding import Message, message


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much work the probe does: a matmul of ``matmul`` x ``matmul``
    float32, ``reps`` times per device; ``bandwidth_bytes`` per pair for
    the bandwidth, ``latency_bytes`` for the latency, each transfer
    repeated ``reps`` times, or fewer once ``budget_ms`` is spent (the
    median is kept)."""

    matmul: int = 512
    matmul_iters: int = 24
    bandwidth_bytes: int = 8 << 20
    latency_bytes: int = 64
    reps: int = 5
    budget_ms: int = 250  # a transfer's repetitions stop once they took this long (at least one)

    def args(self) -> tuple[str, ...]:
        return tuple(f"{f.name}={getattr(self, f.name)}" for f in dataclasses.fields(self))

    @classmethod
    def parse(cls, args) -> Sizes:
        values = dict(arg.split("=", 1) for arg in args)
        return cls(**{f.name: int(values[f.name]) for f in dataclasses.fields(cls) if f.name in values})


def rounds(n: int) -> list[list[tuple[int, int]]]:
    """Every pair of ``n`` processes once, in ``n - 1`` rounds (``n`` rounds
    when ``n`` is odd) of disjoint pairs: the circle method, process 0 fixed
    while the others turn; with ``n`` odd, a ghost partner gives one
    process a round off."""
    if n < 2:
        return []
    ring = list(range(n)) + ([None] if n % 2 else [])
    m = len(ring)
    out = []
    for _ in range(m - 1):
        pairs = [(ring[i], ring[m - 1 - i]) for i in range(m // 2)]
        out.append(sorted((min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return out


@message("probe-result")
class ProbeResult(Message):
    """Every process's figures, as process 0 gathered them (index = rank):
    its host's name as the process saw it, its slowest device's median
    matmul time, and for each round of ``rounds(len(hostnames))`` its
    median bandwidth and latency transfer times with its partner that
    round (0 for a round off); the median time of one all-reduce of
    ``bandwidth_bytes`` over everyone."""

    sizes: list  # Sizes's fields, in order
    hostnames: list
    devices: list  # each process's device count
    compute_s: list
    bandwidth_s: list  # [rank][round]
    latency_s: list  # [rank][round]
    allreduce_s: float
    platform: str
