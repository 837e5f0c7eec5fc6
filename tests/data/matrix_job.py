"""The job of the fault x backend matrix (tests/e2e/test_matrix.py, bench/matrix.py).

    jaxrun ... matrix_job.py FAULT STATE_DIR

A tiny real JAX job: every process holds a shard of one global array and sums
it with the others (a Gloo all-reduce on CPU), then installs a SIGTERM handler
that "checkpoints" for SAVE_SECONDS, and says so in STATE_DIR, a folder every
host sees:

- ``ready-R``  (its pid) once process R has finished the first collective and
  its handler is in place: from then on a signal finds it ready to save;
- ``fault-R``  (``time.time()``) just before process R faults on purpose;
- ``saved-R``  (``time.time()``) when its SIGTERM handler has finished saving;
  the handler then ends the process with status 0, as a job that saved its
  work and leaves does;
- ``done-R``   when process R reached its end without a fault.

FAULT is one of: ``exit`` (process 2 calls ``os._exit(7)``), ``exception``
(process 2 raises), ``segv`` (process 1 sends itself SIGSEGV), in each case
while the others have entered a second collective; ``idle`` (every process
waits, in Python, for the signal the test sends); ``hang`` (process 2 sleeps
while the others wait for it in a collective, until ``--timeout``); ``stuck``
(process 2 sleeps in one call, marking ``fault`` first, while the others wait
for it in a collective, until the stall watchdog stops the job); ``spin``
(a hang as GPU jobs show it: process 2 starts two native threads that spin
on ``sched_yield``, from ``libspin.so`` beside this script, which the test
compiles (tests/fixtures/spinner.py), marks ``fault`` and parks its main
thread in ``threading.Event().wait()``, while the others wait for it in a
collective, until the stall watchdog stops the job); ``parked`` (every
process, marking ``fault`` first, parks in ``while True: time.sleep(1)``,
outside JAX, until the stall watchdog stops the job); ``queue`` (every
process waits for a batch from an empty queue whose loader thread died,
until the stall watchdog stops the job).
"""

import os
import signal
import sys
import threading
import time

FAULT, STATE = sys.argv[1], sys.argv[2]
SAVE_SECONDS = 1.0
# The processes faulting on purpose, one per crash; they wait this long first,
# so that the others are inside the second collective when it happens.
FAULTY = {"exit": 2, "exception": 2, "segv": 1}
SETTLE = 0.5

import jax  # noqa: E402 - after the arguments: a bad call fails before the slow import
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

RANK = jax.process_index()
mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.arange(jax.device_count() * 2.0), NamedSharding(mesh, P("i")))


def mark(name: str, text: str = "") -> None:
    """Whole or not at all: a reader never sees half a marker."""
    path = os.path.join(STATE, f"{name}-{RANK}")
    with open(path + ".part", "w") as f:
        f.write(text)
    os.replace(path + ".part", path)


def collective() -> float:
    return float(jnp.sum(x))


saving = False


def save_and_leave(signum, frame):
    # A second SIGTERM (jaxrun relays one, a whole-tree stop sends its own)
    # must not start the save again: the first one finishes it.
    global saving
    if saving:
        return
    saving = True
    time.sleep(SAVE_SECONDS)
    mark("saved", repr(time.time()))
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit: the test is about jaxrun's supervision, not JAX's shutdown
    # barrier, which a normal exit would wait in for the other processes.
    os._exit(0)


assert collective() == float(np.arange(jax.device_count() * 2.0).sum())
signal.signal(signal.SIGTERM, save_and_leave)
mark("ready", str(os.getpid()))

if FAULT in FAULTY:
    if RANK == FAULTY[FAULT]:
        time.sleep(SETTLE)
        mark("fault", repr(time.time()))
        if FAULT == "exit":
            os._exit(7)
        if FAULT == "exception":
            raise RuntimeError(f"matrix fault in process {RANK}")
        os.kill(os.getpid(), signal.SIGSEGV)
        time.sleep(60)  # never reached: SIGSEGV's default action ends the process
    collective()
elif FAULT == "hang" and RANK == 2:
    while True:
        time.sleep(0.05)
elif FAULT == "hang":
    collective()
elif FAULT == "stuck" and RANK == 2:
    mark("fault", repr(time.time()))
    time.sleep(600)
elif FAULT == "stuck":
    collective()
elif FAULT == "spin" and RANK == 2:
    import ctypes

    ctypes.CDLL(os.path.join(os.path.dirname(os.path.abspath(__file__)), "libspin.so")).spin_start(2)
    mark("fault", repr(time.time()))
    threading.Event().wait()  # parked, while its threads spin
elif FAULT == "spin":
    collective()
elif FAULT == "parked":
    mark("fault", repr(time.time()))
    while True:
        time.sleep(1)  # every process parked here
elif FAULT == "queue":
    import queue

    batches: queue.Queue = queue.Queue()

    def load() -> None:
        raise RuntimeError("the loader died")  # and nothing will come

    threading.Thread(target=load, daemon=True).start()
    mark("fault", repr(time.time()))
    batch = batches.get()  # every process waits here for a batch
elif FAULT == "idle":
    # Python code between short sleeps, so that the handler runs at once.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        time.sleep(0.05)
else:
    raise SystemExit(f"matrix_job.py: unknown fault {FAULT!r}")
mark("done")
