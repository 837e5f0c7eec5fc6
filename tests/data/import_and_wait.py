"""Joins its job (imports jax: the coordination service starts), prints
that it joined and the coordinator's address, then waits until the file named by its first argument
exists (at most a minute)."""

import os
import sys
import time

import jax

print("joined", jax.process_index(), os.environ.get("JAXRUN_COORDINATOR_ADDRESS"), flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
