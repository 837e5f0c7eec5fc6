"""The same smoke test through pytest: the marked test runs in 4 controllers.

    python -m pytest -p jaxrun.pytest_plugin examples/ci/test_smoke.py
"""

import pytest


@pytest.mark.jaxrun(n=4, cpu_devices=2, timeout=300)
def test_global_sum_matches_the_guide():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    assert jax.process_count() == 4
    mesh = jax.make_mesh((4, 2), ("i", "j"))
    data = np.arange(32).reshape(4, 8)
    x = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P("i", "j")), lambda idx: data[idx])
    assert float(jnp.sum(jnp.sin(x))) == pytest.approx(-0.12398731708526611)
