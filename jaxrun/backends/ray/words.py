"""What the Ray driver and the launcher say to each other: one module both ends import.

The driver (:mod:`jaxrun.backends.ray.driver`) writes ``Placed`` or
``Failed`` on a pipe of its own; the launcher
(:mod:`jaxrun.backends.ray.backend`) writes ``Go`` on the driver's stdin.
They are :mod:`jaxrun.wire` messages, so they keep its one encoding, but
only these two ends speak them.
"""

from __future__ import annotations

from jaxrun import wire

# --placement's words, and the placement group strategy each one asks Ray for.
PLACEMENTS = {"pack": "PACK", "spread": "SPREAD", "strict-spread": "STRICT_SPREAD"}


@wire.message("ray-placed")
class Placed(wire.Message):
    nodes: list  # [node id, node address] of each bundle, in bundle order
    address: str  # the driver's own node's address, as Ray knows it


@wire.message("ray-failed")
class Failed(wire.Message):
    why: str  # one line: the cluster cannot be reached, or refused the placement group


@wire.message("ray-go")
class Go(wire.Message):
    processes: list  # per rank: [bundle index, command, environment]
    cwd: str | None  # where the agents start on their nodes
