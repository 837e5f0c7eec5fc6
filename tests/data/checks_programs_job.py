"""Jobs for the default programs check (tests/e2e/test_checks_programs.py).

    checks_programs_job.py part RANK     the guide's parted matmul: every process runs
                                         x @ y on global sharded x, y; process RANK y @ x
    checks_programs_job.py subset        a mesh over the devices of processes 0-2: process 2
                                         parts there; process 3 runs programs of its own
    checks_programs_job.py square RANK   the same with square matrices: only the shardings differ
    checks_programs_job.py pool ROUNDS   each round, four programs with different collectives
                                         compiled ahead of time by a ThreadPoolExecutor(2),
                                         process 1's first compile 0.5 s late, so that each
                                         process's workers compile them in another order
    checks_programs_job.py constant      a per-process constant in a program whose collectives
                                         agree: x * (jax.process_index() + 1), summed
    checks_programs_job.py agree DIR COLD SALT
                                         programs that agree, a process-local program that
                                         differs on purpose, one that process 0 alone runs
                                         with no collective, and JAX's persistent compile
                                         cache in DIR/warm (process COLD: DIR/cold, empty);
                                         the last program, salted, is never in the cache
"""

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

what = sys.argv[1]
rank = jax.process_index()


def global_array(mesh, spec, shape):
    """The same values in every process, each building only its own shards."""
    whole = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
    return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda index: whole[index])


def matmul(a, b):
    return a @ b


if what == "part":
    mesh = Mesh(np.array(jax.devices()), ("b",))
    n = mesh.size
    x, y = global_array(mesh, P("b", None), (n, 4)), global_array(mesh, P(None, "b"), (4, n))
    print(f"process {rank} parts at {time.time():.3f}", flush=True)
    if rank != int(sys.argv[2]):
        z = x @ y  # the guide's matmul
    else:
        z = y @ x  # ... parted
    print(f"process {rank}: sum {float(jnp.sum(z))}", flush=True)
elif what == "square":
    mesh = Mesh(np.array(jax.devices()), ("b",))
    x, y = global_array(mesh, P("b", None), (8, 8)), global_array(mesh, P(None, "b"), (8, 8))
    if rank != int(sys.argv[2]):
        z = jax.jit(matmul)(x, y)  # the square matmul
    else:
        z = jax.jit(matmul)(y, x)  # the square one, parted: its shapes alike
    print(f"process {rank}: sum {float(jnp.sum(z))}", flush=True)
elif what == "pool":
    mesh = Mesh(np.array(jax.devices()), ("b",))
    reductions = (lambda v: v.sum(), lambda v: v.sum(axis=0), lambda v: v @ v.T, lambda v: jnp.cumsum(v, axis=0))
    for round_ in range(int(sys.argv[2])):
        x = global_array(mesh, P("b", None), (mesh.size * 2, 3 + round_))  # new shapes: new programs each round

        def compile_(k, x=x):
            if rank == 1 and k == 0:
                time.sleep(0.5)  # one process's first compile is slow: its workers take the others in turn
            return jax.jit(reductions[k]).lower(x).compile()

        with ThreadPoolExecutor(2) as pool:
            compiled = list(pool.map(compile_, range(4)))
        sums = [float(jnp.sum(c(x))) for c in compiled]
        print(f"process {rank}: round {round_} {sums}", flush=True)
elif what == "constant":
    mesh = Mesh(np.array(jax.devices()), ("b",))
    x = global_array(mesh, P("b"), (mesh.size * 2,))
    total = jax.jit(lambda v: (v * (jax.process_index() + 1)).sum())(x)  # the per-process constant
    print(f"process {rank}: total {float(total)}", flush=True)
elif what == "subset":
    if rank < 3:
        mesh = Mesh(np.array([d for d in jax.devices() if d.process_index < 3]), ("b",))
        x, y = global_array(mesh, P("b", None), (mesh.size, 4)), global_array(mesh, P(None, "b"), (4, mesh.size))
        if rank != 2:
            z = jax.jit(matmul)(x, y)  # the subset's matmul
        else:
            z = jax.jit(matmul)(y, x)  # ... parted
        print(f"process {rank}: sum {float(jnp.sum(z))}", flush=True)
    else:
        own = jax.jit(lambda v: jnp.cumsum(v * 3))(jnp.arange(16.0))  # this process's devices only
        print(f"process {rank}: own {float(own[-1])}", flush=True)
else:
    folder, cold, salt = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    jax.config.update("jax_compilation_cache_dir", f"{folder}/{'cold' if rank == cold else 'warm'}")
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    hits = []
    jax.monitoring.register_event_listener(
        lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)
    mesh = Mesh(np.array(jax.devices()), ("b",))
    x, y = global_array(mesh, P("b", None), (mesh.size, 4)), global_array(mesh, P(None, "b"), (4, mesh.size))
    if rank == 0:
        z = jax.jit(matmul)(x, y)  # spans the processes: compiled, or from the cache
    else:
        z = jax.jit(matmul)(x, y)  # the same program, made at another line
    total = jnp.sum(z)  # an eager operation on a global array
    doubled = jax.jit(lambda v: v * 2).lower(x).compile()(x)  # ahead of time
    # Each process its own program, on its own devices only: differs on purpose.
    mine = jax.jit(lambda v: jnp.sin(v) * rank if rank % 2 else jnp.cos(v) + rank)(jnp.ones((3, rank + 1)))
    if rank == 0:  # process 0 alone logs a replicated mean: a program over every device, no collective
        replicated = global_array(mesh, P(), (4,))
        print(f"process 0 logs {float(jnp.mean(replicated * 3))}", flush=True)
    # New in every run: a warm process that skipped its cached programs would count it first.
    salted = jax.jit(lambda v: v + salt)(x)
    print(f"process {rank}: sum {float(total)} doubled {float(jnp.sum(doubled))} salted {float(jnp.sum(salted))} "
          f"own {float(jnp.sum(mine)):.3f} hits {len(hits)}", flush=True)
