"""jaxrun's command line with the local backend made slow to place each
attempt, as a cluster that takes its time (Ray's placement group, a queued
srun step): ``place`` waits PLACE_SECONDS, through the run's stop flag as a
real backend's waits do.

    python slow_place.py JAXRUN-ARGS...
"""

import dataclasses
import os
import sys
import time

from jaxrun import backends, cli
from jaxrun.backends.local import LocalBackend
from jaxrun.core.backend import wait_until

PLACE_SECONDS = float(os.environ["PLACE_SECONDS"])


class SlowToPlace(LocalBackend):
    def place(self, ask):
        print(f"placing at {time.time():.3f}", file=sys.stderr, flush=True)  # the attempt's start, for the test
        began = time.monotonic()
        wait_until(lambda: False, self.hooks, timeout=PLACE_SECONDS)  # Interrupted once --timeout passes
        print(f"placed after {time.monotonic() - began:.1f} s", file=sys.stderr, flush=True)
        return super().place(ask)


backends.BACKENDS["local"] = dataclasses.replace(backends.BACKENDS["local"],
                                                 start=lambda config, console, early=None: SlowToPlace())
cli.entry_point(sys.argv[1:])
