"""The guide's distributed relu(x @ y): the compiler picks the sharding.

    jaxrun -n 4 --cpu-devices 2 examples/matmul.py

With Auto axes, z = relu(x @ y) comes out sharded along "a" and replicated
along "b": PartitionSpec('a', None).  Each process prints the rows it holds;
its two devices hold the same rows (the replicas along "b").  With the default
Explicit axes the same expression is an error until you say what the output
sharding should be.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import jaxrun

mesh = jax.make_mesh((jax.device_count() // 2, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)


def device_put(x, spec, on=mesh):
    return jax.device_put(x, NamedSharding(on, spec))


# The guide multiplies (4096, 2048) by (2048, 4096); that is ~69 GFLOP, fine on
# accelerators but seconds of work on two CPU cores, so the shapes are smaller.
# The sharding story is the same.
x = device_put(jnp.ones((256, 128)), P("a", "b"))
y = device_put(jnp.ones((128, 256)), P("b", None))
z = jax.nn.relu(x @ y)  # x and y are both sharded on the contracted dimension:
                        # the compiler inserts a sum across "b".

jaxrun.print0(f"z.sharding = {z.sharding}")
# JAX drops trailing Nones when it prints a spec: P('a',) is P('a', None).
same = z.sharding.is_equivalent_to(NamedSharding(mesh, P("a", None)), z.ndim)
jaxrun.print0(f"sharded along a, replicated along b, i.e. P('a', None): {same}")
for shard in z.addressable_shards:
    rows = shard.index[0]
    print(f"device {shard.device} holds z[{rows.start}:{rows.stop}, :], "
          f"values {np.unique(np.asarray(shard.data)).tolist()}")

# Explicit axes (jax.make_mesh's default) put shardings into the types, and a
# contraction over a sharded dimension has no single obvious output sharding,
# so JAX refuses to guess.
explicit = jax.make_mesh((jax.device_count() // 2, 2), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)
xe = device_put(jnp.ones((256, 128)), P("a", "b"), explicit)
ye = device_put(jnp.ones((128, 256)), P("b", None), explicit)
try:
    jax.nn.relu(xe @ ye)
except Exception as e:  # noqa: BLE001 - jax's ShardingTypeError has no public name
    # Every process raises it alike, before anything runs, so no one is left
    # waiting in a collective.
    jaxrun.print0(f"Explicit axes: {type(e).__name__}: {str(e).splitlines()[0]}")
# The fix the error asks for: name the output sharding.
ze = jax.nn.relu(jnp.matmul(xe, ye, out_sharding=NamedSharding(explicit, P("a", None))))
jaxrun.print0(f"Explicit axes with out_sharding: {jax.typeof(ze)}, spec {ze.sharding.spec}")
