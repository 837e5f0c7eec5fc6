"""jaxrun's command line, with the local backend made to fail a restart's
start-up at one stage (PROBE_STAGE): its planning, its preflight, its spawn,
or an interrupt while it waits there.  The first attempt runs for real.

    python restart_probe.py JAXRUN-ARGS...
"""

import dataclasses
import os
import signal
import sys

from jaxrun import backends, cli
from jaxrun.backends.local import LocalBackend
from jaxrun.core.backend import wait_until
from jaxrun.core.config import LaunchError
from jaxrun.core.spec import PlanError

STAGE = os.environ["PROBE_STAGE"]


class FailsOnRestart(LocalBackend):
    attempts = 0

    def place(self, ask):  # the first call of each attempt
        self.attempts += 1
        if self.attempts == 2 and STAGE == "plan":
            raise PlanError("4 devices on hostB cannot be split evenly among 3 processes; pass --devices-per-process")
        return super().place(ask)

    def choose_coordinator(self, fixed):
        if self.attempts == 2 and STAGE == "preflight":
            raise LaunchError("hostB: no answer while checking that it reaches the coordinator")
        if self.attempts == 2 and STAGE == "interrupt":
            os.kill(os.getpid(), signal.SIGINT)  # as a user's Ctrl-C while a preflight waits
            wait_until(lambda: False, self.hooks, timeout=30)
        return super().choose_coordinator(fixed)

    def begin_attempt(self, specs, log_dir):
        if self.attempts == 2 and STAGE == "spawn":
            raise LaunchError("hostB: cannot start python3 there (No such file or directory)")


backends.BACKENDS["local"] = dataclasses.replace(backends.BACKENDS["local"],
                                                 start=lambda config, console, early=None: FailsOnRestart())
cli.entry_point(sys.argv[1:])
