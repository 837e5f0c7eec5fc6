"""A job that survives restarts: it saves a checkpoint after every step and
resumes from the last one, on however many processes the restart has.

    jaxrun -n 4 --cpu-devices 2 examples/resume.py
    jaxrun --hosts hosts.txt --max-restarts 2 --min-hosts 1 --cpu-devices 2 \\
        examples/resume.py CKPT_DIR [STEPS]

Across hosts, CKPT_DIR must be one folder that every host sees (a shared
file system).  Without it the checkpoint goes to a folder of this run under
the temporary folder, which every restart of the run finds again.
The state is one global array sharded over every device; each step runs a
collective (a sum over all devices), so every process takes part.  The
arithmetic is on integers, so the result is the same whatever the number of
processes and devices: a run that lost a host and went on with fewer
processes ends with the uninterrupted run's result.

Process 0 writes the checkpoint (a step counter and the state) once the
step's values are gathered, to a new file renamed over the old one, so a
crash never leaves half a checkpoint.  A real job would use orbax the same
way: ``CheckpointManager.latest_step()`` is the step counter.
"""

import json
import os
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec

SIZE = 8  # elements of the state: a multiple of every device count used here
MODULUS = 1_000_003
ckpt = sys.argv[1] if len(sys.argv) > 1 else os.path.join(tempfile.gettempdir(),
                                                           f"jaxrun-resume-{os.environ['JAXRUN_RUN_ID']}")
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 12
pause = float(os.environ.get("RESUME_STEP_SECONDS", "0.1"))  # how slow a step is, for the demo
os.makedirs(ckpt, exist_ok=True)
path = os.path.join(ckpt, "latest.json")


def load() -> tuple[int, np.ndarray]:
    try:
        with open(path) as f:
            saved = json.load(f)
    except FileNotFoundError:
        return 0, np.zeros(SIZE, np.int32)
    return saved["step"], np.array(saved["state"], np.int32)


def save(step: int, state: np.ndarray) -> None:
    new = f"{path}.{os.getpid()}"
    with open(new, "w") as f:
        json.dump({"step": step, "state": state.tolist()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(new, path)


@jax.jit
def advance(x, step):
    total = jnp.sum(x) % MODULUS  # a collective across every process's devices
    return (x * 3 + total + jnp.arange(SIZE, dtype=jnp.int32) * step) % MODULUS


mesh = jax.make_mesh((jax.device_count(),), ("data",))
start, state = load()
x = jax.make_array_from_callback((SIZE,), NamedSharding(mesh, PartitionSpec("data")), lambda index: state[index])
print(f"process {jax.process_index()} of {jax.process_count()}: starting at step {start} at {time.time():.3f}",
      flush=True)
for step in range(start, steps):
    x = advance(x, step)
    values = multihost_utils.process_allgather(x, tiled=True)
    if jax.process_index() == 0:
        save(step + 1, np.asarray(values))
    print(f"step {step + 1} of {steps}", flush=True)
    time.sleep(pause)
print(f"result {int(np.asarray(multihost_utils.process_allgather(x, tiled=True)).sum())}", flush=True)
