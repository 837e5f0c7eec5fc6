"""Prints that it started, then waits until the file named by its first
argument exists (at most a minute), and prints that it ends."""

import os
import sys
import time

print("started", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
print("ends", flush=True)
