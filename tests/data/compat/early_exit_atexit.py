"""Rank 1 calls sys.exit(0) early; atexit hooks run, in order, around JAX's own."""
import atexit
import sys


def first_registered():
    # Registered before jax is imported, so in a plain run it runs after
    # JAX's exit-time shutdown.
    from jax._src import distributed

    print("first hook: distributed still up", distributed.global_state.client is not None, flush=True)


atexit.register(first_registered)

import jax

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
atexit.register(lambda: print("last hook: process", jax.process_index(), flush=True))
if pid == 1:
    print("rank 1 exits early", flush=True)
    sys.exit(0)
print("rank 0 carries on", flush=True)
print("sum", int(jax.numpy.arange(4).sum()))
