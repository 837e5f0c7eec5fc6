"""logging.basicConfig(level=INFO) before initialize: JAX's own INFO lines show."""
import logging
import sys
import warnings

import jax

logging.basicConfig(level=logging.INFO)
coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
logging.info("before initialize")  # noqa: LOG015 - the root logger is the pattern
jax.distributed.initialize(coord, n, pid)
logging.info("process %d of %d", jax.process_index(), jax.process_count())  # noqa: LOG015
warnings.warn("a user warning")
