"""A JAX process that prints about 4 MB in 1 KB lines, 40 steps of 100
lines, and writes each step it finished to a side file on another disk: how
far it got, whatever became of its logs.  ``fail`` as the second argument: it then
raises, after all of it (its traceback comes after the log disk filled)."""

import os
import sys
import time

import jax

rank = jax.process_index()  # joined: its joined, activity and marks files are in the full folder too
side = os.path.join(sys.argv[1], f"steps-{rank}")
line = "x" * 1023
for step in range(40):
    jax.numpy.ones(4).sum().block_until_ready()
    for _ in range(100):
        print(line)
    with open(side, "w") as f:
        f.write(str(step))
if sys.argv[2:] == ["fail"]:
    # Only once every process has done all its steps: the first to raise has fail-fast stop
    # the others, which on a loaded machine cut a slower one's last step short (38 of 39).
    steps = [os.path.join(sys.argv[1], f"steps-{r}") for r in range(jax.process_count())]
    while not all(os.path.exists(path) and open(path).read() == "39" for path in steps):
        time.sleep(0.05)
    raise RuntimeError("failed after the log disk filled")
