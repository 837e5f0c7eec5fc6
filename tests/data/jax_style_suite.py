"""A multi-process test written the way JAX writes its own.

``jax._src.test_multiprocess.main()`` either starts the workers itself
(``--num_processes=4``), or, given ``--multiprocess_test_worker_id``, is one
of them: it initializes the distributed system with the controller address
it was given and runs the absltest cases.
"""
import unittest

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import test_multiprocess
from jax.experimental import multihost_utils
from jax.sharding import PartitionSpec as P


class CollectivesTest(test_multiprocess.MultiProcessTest):
    def test_process_count(self):
        self.assertEqual(jax.process_count(), 4)
        self.assertEqual(jax.device_count(), 4 * jax.local_device_count())

    def test_allgather(self):
        gathered = multihost_utils.process_allgather(np.array([jax.process_index()]))
        self.assertEqual(gathered.ravel().tolist(), [0, 1, 2, 3])

    def test_psum_over_a_global_array(self):
        mesh = jax.make_mesh((jax.device_count(),), ("i",))
        local = np.full((jax.local_device_count(),), jax.process_index() + 1.0)
        x = multihost_utils.host_local_array_to_global_array(local, mesh, P("i"))
        total = jax.jit(jnp.sum, out_shardings=jax.sharding.NamedSharding(mesh, P()))(x)
        self.assertEqual(float(total), jax.local_device_count() * (1.0 + 2.0 + 3.0 + 4.0))

    @unittest.skip("counted as skipped in every worker")
    def test_skipped(self):
        raise AssertionError("never runs")


if __name__ == "__main__":
    test_multiprocess.main()
