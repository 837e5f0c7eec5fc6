"""A python subprocess of a controller is a separate program, not a job member."""
import subprocess
import sys

import jax

coord, n, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
jax.distributed.initialize(coord, n, pid)
print("controller process count", jax.process_count(), flush=True)
done = subprocess.run([sys.executable, "-c", "import jax; print('grandchild process count', jax.process_count())"], check=False)
print("grandchild exit", done.returncode)
