"""Run through a symlink: python puts the real file's folder on sys.path."""
import os
import sys

import helper
import jax

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
print(helper.VALUE)
print("__file__", os.path.basename(__file__))
print("sys.path[0]", os.path.basename(sys.path[0]))
