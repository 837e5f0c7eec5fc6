"""The probe job (``jaxrun probe``, ``--probe``): each process measures its
devices and its links with JAX itself, and process 0 prints every figure
as one ``wire.probe.ProbeResult`` line.

    python -m jaxrun.shim -m jaxrun.child.controllers.probe matmul=384 reps=5 ...

What it measures, in this order, every process at once:

- compute: a fixed float32 matmul chain on each local device, ``reps``
  times after one warm-up, every process starting each repetition
  together; the fastest of each device, the slowest device's kept (a
  device, not a host, is what a slow GPU or a throttled core is);
- links: one device per process forms a mesh over all processes; in each
  round of ``wire.probe.rounds`` the disjoint pairs of that round swap a
  buffer with ``lax.ppermute`` (the job's own collectives: Gloo on CPU,
  NCCL on GPU, ICI/DCN on TPU), every process entering together after a
  barrier; a process's time is its pair's transfer, at ``bandwidth_bytes``
  and at ``latency_bytes``, the fastest of up to ``reps``;
- one all-reduce (``psum``) of ``bandwidth_bytes`` over everyone.

Nothing here decides what is slow: the launcher reads the figures
(``launcher.probe``).
"""

from __future__ import annotations

import socket
import sys
import time

from jaxrun import contract
from jaxrun.wire.probe import ProbeResult, Sizes, rounds


def fastest(run, reps: int, sync) -> float:
    """The fastest of ``reps`` timed calls of ``run()`` (which blocks until
    its result is ready), each started with every process after ``sync()``,
    after one untimed call that compiles it.  The fastest, because on a
    shared host noise only ever adds time, while a slow device or a
    throttled core is slow in every call that outlasts its throttle."""
    run()
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def compute_time(sizes: Sizes, sync) -> float:
    import jax
    import jax.numpy as jnp

    def chain(a):
        def body(_, x):
            return jnp.tanh(x @ a)  # tanh keeps the values bounded; the matmul is the work
        return jax.lax.fori_loop(0, sizes.matmul_iters, body, a)

    program = jax.jit(chain)
    worst = 0.0
    for device in jax.local_devices():
        a = jax.device_put(jnp.full((sizes.matmul, sizes.matmul), 0.01, jnp.float32), device)
        worst = max(worst, fastest(lambda a=a: program(a).block_until_ready(), sizes.reps, sync))
    return worst


# On CPU, one thread per process: a device's matmul then measures a core,
# and processes that share a machine share its cores evenly (with Eigen's
# pool, one process's threads could crowd onto a busy core: 2.2x apart on
# healthy hosts here).  Read by XLA's CPU backend only, when it starts.
ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"


def main(argv: list[str]) -> None:
    import os

    flags = os.environ.get(contract.XLA_FLAGS, "")
    if "xla_cpu_multi_thread_eigen" not in flags:  # before the first backend: the shim joins the job lazily
        os.environ[contract.XLA_FLAGS] = f"{flags} {ONE_THREAD}".strip()
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    sizes = Sizes.parse(argv)
    n, me = jax.process_count(), jax.process_index()
    began = time.perf_counter()

    def said(what: str) -> None:  # where the probe's time goes, in this process's log
        print(f"probe: {what} at {time.perf_counter() - began:.2f} s", flush=True)

    # One device per process: the links are between processes (hosts).
    firsts = [min((d for d in jax.devices() if d.process_index == p), key=lambda d: d.id) for p in range(n)]
    mesh = Mesh(np.array(firsts), ("p",))
    sharding = NamedSharding(mesh, P("p"))

    def global_rows(nbytes: int, value: float):
        row = np.full((1, max(1, nbytes // 4)), value, np.float32)
        local = jax.device_put(row, firsts[me])
        return jax.make_array_from_single_device_arrays((n, row.shape[1]), sharding, [local])

    def compiled(body, rows):
        program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("p"), out_specs=P("p")))
        return program.lower(rows).compile()

    tick = global_rows(4, 0.0)
    barrier = compiled(lambda x: jax.lax.pmax(x, "p"), tick)
    # Every process computes at once, each repetition started together: a
    # process that started early would otherwise have the machine's cores
    # to itself where hosts share them (a test bed), and look fast.
    compute = compute_time(sizes, lambda: barrier(tick).block_until_ready())
    said(f"compute {compute * 1e3:.1f} ms")

    def together(step, rows) -> float:
        """The fastest of up to ``reps`` timed runs of ``step(rows)``, every
        process starting each after a barrier.  The barrier carries the
        slowest time of the run before, so that every process stops after
        the same run: once ``budget_ms`` is spent (a slow link's round costs
        one run, not ``reps``)."""
        times: list[float] = []
        spent, last = 0.0, 0.0
        while len(times) < sizes.reps:
            slowest = barrier(global_rows(4, last))
            spent += float(np.asarray(slowest.addressable_shards[0].data).ravel()[0])
            if times and spent * 1000 >= sizes.budget_ms:
                break
            start = time.perf_counter()
            step(rows).block_until_ready()
            last = time.perf_counter() - start
            times.append(last)
        barrier(tick).block_until_ready()  # the last run's time is not needed: the peers just leave together
        return min(times)

    schedule = rounds(n)
    big, small = global_rows(sizes.bandwidth_bytes, me + 1.0), global_rows(sizes.latency_bytes, me + 1.0)
    bandwidth, latency = [0.0] * len(schedule), [0.0] * len(schedule)
    for i, pairs in enumerate(schedule):
        perm = [(a, b) for a, b in pairs] + [(b, a) for a, b in pairs]
        swap_big = compiled(lambda x, perm=perm: jax.lax.ppermute(x, "p", perm), big)
        swap_small = compiled(lambda x, perm=perm: jax.lax.ppermute(x, "p", perm), small)
        swap_small(small).block_until_ready()  # the pair's first contact (connections), untimed
        t_small = together(swap_small, small)
        t_big = together(swap_big, big)
        if any(me in pair for pair in pairs):
            bandwidth[i], latency[i] = t_big, t_small
        said(f"round {i + 1} of {len(schedule)}: {t_big * 1e3:.1f} ms, {t_small * 1e3:.2f} ms")
    allreduce = 0.0
    if n > 1:
        reduce = compiled(lambda x: jax.lax.psum(x, "p"), big)  # its peers are the barrier's: no first contact
        allreduce = together(reduce, big)
        said(f"all-reduce {allreduce * 1e3:.1f} ms")
    mine = np.array([compute, float(len(jax.local_devices())), *bandwidth, *latency], np.float32)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(n, -1)
    names = multihost_utils.process_allgather(np.frombuffer(socket.gethostname().encode()[:64].ljust(64), np.uint8))
    if me != 0:
        return
    k = len(schedule)
    hostnames = [bytes(np.asarray(row, np.uint8)).rstrip(b" ").decode(errors="replace")
                 for row in np.asarray(names).reshape(n, 64)]
    result = ProbeResult(list(sizes.args()), hostnames, [int(r[1]) for r in every],
                         [float(r[0]) for r in every], [[float(v) for v in r[2:2 + k]] for r in every],
                         [[float(v) for v in r[2 + k:2 + 2 * k]] for r in every], float(allreduce),
                         firsts[0].platform)
    sys.stdout.write(result.line().decode())
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
