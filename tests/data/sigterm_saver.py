"""A controller whose SIGTERM handler takes a second to save its work.

    sigterm_saver.py OUT_DIR RANK

Writes OUT_DIR/running-RANK (its pid) once the handler is in place; on
SIGTERM, sleeps 1 s (the save), writes OUT_DIR/saved-RANK and exits 0.  A
second SIGTERM during the save runs the handler again, nested, which saves
and exits just the same: a controller may get the signal both directly and
from jaxrun.
"""

import os
import signal
import sys
import time

out, rank = sys.argv[1], sys.argv[2]


def save(signum, frame):
    time.sleep(1)
    with open(os.path.join(out, "saved-" + rank), "w") as f:
        f.write(str(signum))
    sys.exit(0)


signal.signal(signal.SIGTERM, save)
with open(os.path.join(out, "running-" + rank), "w") as f:
    f.write(str(os.getpid()))
while True:
    time.sleep(0.1)
