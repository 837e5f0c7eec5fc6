"""What the Ray driver and the launcher say to each other: one module both ends import.

The driver (:mod:`jaxrun.backends.ray.driver`) writes ``Placed`` or
``DriverFailed`` on a pipe of its own; the launcher
(:mod:`jaxrun.backends.ray.backend`) writes ``Go`` on the driver's stdin.
They are declared with :mod:`jaxrun.wire.encoding`, so they keep the one
encoding of every message, but only these two ends speak them.
"""

from __future__ import annotations

from jaxrun.wire import encoding

# --placement's words, and the placement group strategy each one asks Ray for.
PLACEMENTS = {"pack": "PACK", "spread": "SPREAD", "strict-spread": "STRICT_SPREAD"}


@encoding.message("ray-placed")
class Placed(encoding.Message):
    nodes: list  # [node id, node address] of each bundle, in bundle order
    address: str  # the driver's own node's address, as Ray knows it


@encoding.message("ray-failed")
class DriverFailed(encoding.Message):
    why: str  # one line: the cluster cannot be reached, or refused the placement group


@encoding.message("ray-go")
class Go(encoding.Message):
    processes: list  # per rank: [bundle index, command, environment]
    cwd: str | None  # where the agents start on their nodes
