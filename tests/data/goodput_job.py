"""A job with known times, for the goodput test (tests/e2e/test_goodput.py).

Each attempt sleeps STARTUP seconds before its first JAX call (jaxrun's join
comes after it, so jaxrun counts it as start-up), compiles one program, and
runs steps of STEP seconds of host sleep (idle) plus that program (a collective
over both processes), saving a checkpoint every EVERY steps.  The first
attempt saves with ``jaxrun.checkpointing()`` and process 1 crashes at step
CRASH, after the save at step 20; the restart resumes from that save, so it
does steps 20-24 again, and reports its saves as Orbax does (a
``jax.monitoring`` duration event named as Orbax names it, from process 0
only).  Every process writes what it measured itself, as JSON lines, to
``FOLDER/measured-ATTEMPT-RANK.jsonl``: the test holds jaxrun's account
against these.

    jaxrun -n 2 --cpu-devices 1 --max-restarts 1 goodput_job.py FOLDER
"""

import json
import os
import sys
import time

STARTUP, STEP, SAVE = 2.0, 0.2, 0.3
EVERY, CRASH, STEPS = 10, 25, 40
ORBAX_SAVE_EVENT = "/jax/orbax/write/blocking_duration_secs"

folder = sys.argv[1]
attempt = int(os.environ["JAXRUN_RESTART_COUNT"])
rank = int(os.environ["JAXRUN_PROCESS_ID"])
out = open(os.path.join(folder, f"measured-{attempt}-{rank}.jsonl"), "a", buffering=1)


def say(**fact) -> None:
    out.write(json.dumps(fact) + "\n")


time.sleep(STARTUP)  # start-up the script spends before it touches JAX
import jax  # noqa: E402 - after the start-up, as a script that loads first would
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec  # noqa: E402

import jaxrun  # noqa: E402

say(joined=time.time())
mesh = jax.make_mesh((2,), ("p",))
sharding = NamedSharding(mesh, PartitionSpec("p"))
x = jax.make_array_from_callback((2, 64), sharding, lambda index: np.ones((1, 64), np.float32))


def body(v):
    for i in range(12):  # unrolled: a compile of a second or so, not milliseconds
        v = jnp.sin(v * 1.0001 + i) @ jnp.eye(64)
    return v.sum()


began = time.monotonic()
program = jax.jit(body).lower(x).compile()
say(compile=time.monotonic() - began)

ckpt = os.path.join(folder, "checkpoint")
start = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
say(resumed=start)


def save(step: int) -> None:
    time.sleep(SAVE)  # what writing the state costs
    if rank == 0:
        with open(ckpt + ".new", "w") as f:
            f.write(str(step))
        os.replace(ckpt + ".new", ckpt)


for step in range(start, STEPS):
    if attempt == 0 and rank == 1 and step == CRASH:
        say(crash=time.time())
        raise RuntimeError(f"injected crash at step {step}")
    began = time.monotonic()
    time.sleep(STEP)  # the host's own time, parked outside JAX: the goodput's idle
    host = time.monotonic() - began
    program(x).block_until_ready()
    jaxrun.step()
    say(step=step, seconds=time.monotonic() - began, host=host, at=time.time())
    if (step + 1) % EVERY == 0:
        began = time.monotonic()
        if attempt == 0:
            with jaxrun.checkpointing():
                save(step + 1)
        else:
            save(step + 1)
            if rank == 0:  # as Orbax does: from its primary host only
                jax.monitoring.record_event_duration_secs(ORBAX_SAVE_EVENT, time.monotonic() - began)
        say(save=time.monotonic() - began, saved=time.time())
say(done=time.time())
