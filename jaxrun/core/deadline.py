"""``--timeout``: one deadline per attempt, on one clock.

The run loop makes an attempt's ``Deadline`` once, as the attempt begins and
before it is placed, and hands the same object to everything that waits for
that attempt: the stop flag that cuts start-up waits short (a backend's
placement, connections, a preloading server), and the supervisor, which asks
for stack dumps and stops the job when it passes.  So ``--timeout S`` is the
most any attempt lives, start-up and placement included; a restart gets a
deadline of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Deadline:
    """A moment ``seconds`` after this object was made, on ``clock``
    (monotonic seconds); ``seconds`` None: never."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self.at = None if seconds is None else clock() + seconds

    def passed(self) -> bool:
        return self.at is not None and self.clock() >= self.at

    def left(self) -> float | None:
        """Seconds until it passes (0 once it has), or None for never."""
        return None if self.at is None else max(0.0, self.at - self.clock())

    def __repr__(self) -> str:
        return f"Deadline({self.seconds!r}, left={self.left()!r})"


NEVER = Deadline(None)
