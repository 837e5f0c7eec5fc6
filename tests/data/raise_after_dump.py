"""Every process raises the same error, process 0 first (issue 74: "was at"
is where a process ended, never an older stack dump).  No JAX, so that no
coordination service ends the others: process 0 writes GO (argv[1]) and
raises; each other process, once it sees GO, sleeps a moment at OLDER (where
jaxrun's stop asks it for a stack dump), then raises at ENDS."""

import os
import sys
import time

go = sys.argv[1]
if os.environ["JAXRUN_PROCESS_ID"] == "0":
    open(go, "w").close()
    raise ValueError("bad batch")
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.15)  # OLDER
raise ValueError("bad batch")  # ENDS
