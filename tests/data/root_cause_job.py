"""Process 3 dies right after a collective; process 2 fails because of it.

Run under jaxrun with 4 processes: ``root_cause_job.py STATE_DIR``.  Every
process takes part in a cross-process sum; then process 3 leaves with
``os._exit(7)``, and the others go on to the next one.  There process 2
talks to process 3 over a socket, as Gloo's pairs do, and fails the way a
Gloo collective fails when its peer is gone: the connection closes, and it
raises "Gloo all-reduce failed: ... Connection closed by peer" within a few
milliseconds of process 3's end.  (On some machines JAX's own collective
fails so; on others it waits for the heartbeat timeout, so the socket makes
the race the same everywhere.)  Processes 0 and 1 block in the next real
collective until jaxrun stops them.

The root cause is process 3, and jaxrun's status 7, whichever exit jaxrun
hears first.
"""

import os
import socket
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

state = sys.argv[1]
rank = jax.process_index()
mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.arange(jax.device_count() * 4.0), NamedSharding(mesh, P("i")))
address = os.path.join(state, "pair")

if rank == 2:  # the pair's listening end, like Gloo's, ready before the first collective
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".new")
    listener.listen(1)
    os.rename(address + ".new", address)  # it appears listening already
elif rank == 3:
    while not os.path.exists(address):
        time.sleep(0.01)
    pair = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    pair.connect(address)

float(jnp.sum(x))  # every process is here: the collective completes

if rank == 3:
    with open(os.path.join(state, "died"), "w") as f:
        f.write(repr(time.time()))
    os._exit(7)
if rank == 2:
    peer, _ = listener.accept()
    if not peer.recv(1):  # the next collective's read from process 3
        raise jax.errors.JaxRuntimeError(
            "INTERNAL: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:534] "
            "Connection closed by peer [127.0.0.1]:40123")
float(jnp.sum(x))
