"""The preflight: right after the join, every process's host, pid and
versions, exchanged through the coordination service; mixed versions stop
the job before the script's first program.  And the exchange itself
(``gather``), which the runtime's ``allgather_json`` uses too."""

from __future__ import annotations

import itertools
import json
import os
import sys

from jaxrun.child import ending
from jaxrun.child.join.errors import BootstrapError
from jaxrun.child.join.versions import check_versions, show_preflight


def exchange(rank: int, count: int, verbose: bool) -> list[dict]:
    """Exchange host, pid and versions; fail fast on mismatched versions.

    Through the coordination service only: no device is listed, so the
    backend is still the script's to create.  One key-value set, one barrier
    and one directory read per process, cheap enough for every launch.
    """
    import socket

    import jax
    import jaxlib

    me = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": sys.version.split()[0],
    }
    everyone = gather("preflight", me, rank, count, timeout_s=120)
    rows = [dict(everyone[p], process=p) for p in sorted(everyone)]
    if verbose and rank == 0:
        show_preflight(rows, sys.stderr)
    try:
        check_versions(rows)
    except BootstrapError as e:
        ending.fail(e)  # mixed versions: nothing the script does can go right
    return rows


_rounds = itertools.count()
_previous_key: list[str] = []


def gather(tag: str, payload: object, me: int, count: int, timeout_s: float = 300.0) -> dict[int, object]:
    """*Collective*: every process's JSON-able ``payload``, keyed by process id.

    Goes through the coordination service's key-value store, so it needs no
    device (it never creates jax's backend) and works before any mesh exists.
    One set, one barrier and one directory read per process.
    """
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None or count == 1:
        return {me: payload}
    # Every process numbers its calls the same way, as collectives require.
    prefix = f"jaxrun/{tag}/{next(_rounds)}"
    client.key_value_set(f"{prefix}/{me}", json.dumps(payload))
    client.wait_at_barrier(prefix, int(timeout_s * 1000))
    found = {int(k.rsplit("/", 1)[1]): json.loads(v) for k, v in client.key_value_dir_get(prefix + "/")}
    # Past this barrier every process has read the previous round, so its key
    # can go: a helper called every step must not grow the store forever.
    if _previous_key:
        client.key_value_delete(_previous_key.pop())
    _previous_key.append(f"{prefix}/{me}")
    return found
