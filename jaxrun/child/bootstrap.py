"""Child side: join the distributed system from the launcher's environment.

Imported by the shim only, after its lifeline and stack-dump hooks are in
place.  This is the one place where jax is imported on purpose.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import sys
from typing import Any

from jaxrun import contract
from jaxrun.child import mesh


class BootstrapError(RuntimeError):
    """The process cannot join the job; the message says why."""


_launched: dict[str, object] = {}


def identity_from_env(environ=os.environ) -> tuple[int, int, int]:
    """(process id, process count, local process id) from the launcher or scheduler."""
    source = environ.get(contract.RANK_SOURCE, "jaxrun")
    names = contract.RANK_SOURCES.get(source, contract.LAUNCHER_RANK_NAMES)
    try:
        rank, count, local = (int(environ[n]) for n in names)
    except KeyError as e:
        raise BootstrapError(f"{e.args[0]} is not set; start this process with jaxrun") from None
    except ValueError as e:
        raise BootstrapError(f"bad rank variable: {e}") from None
    return rank, count, local


def _transfer_address(coordinator: str) -> str:
    """A free address of our own for cross-process device_put, reachable by peers."""
    host = coordinator.rsplit(":", 1)[0]
    if contract.is_loopback(host):
        ip = "127.0.0.1"
    else:
        # The local address that routes towards the coordinator's host.
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            probe.connect((host, 9))
            ip = probe.getsockname()[0]
        finally:
            probe.close()
    return contract.join_address(ip, contract.free_port(ip))


def initialize_from_env() -> None:
    environ = os.environ
    coordinator = environ.get(contract.COORDINATOR_ADDRESS)
    if not coordinator:
        raise BootstrapError(f"{contract.COORDINATOR_ADDRESS} is not set; start this process with jaxrun")
    rank, count, local = identity_from_env(environ)
    # The scheduler gave us our rank; publish it in jaxrun's own names too.
    environ[contract.PROCESS_ID] = str(rank)
    environ[contract.NUM_PROCESSES] = str(count)
    environ[contract.LOCAL_PROCESS_ID] = str(local)

    import jax

    try:
        jax.config.update("jax_cross_host_transfer_socket_address", _transfer_address(coordinator))
    except (AttributeError, OSError):
        pass  # older jax without the option, or no route: transfers stay unavailable
    kwargs = dict(
        coordinator_address=coordinator,
        num_processes=count,
        process_id=rank,
        cluster_detection_method="deactivate",
    )
    device_ids = environ.get(contract.JAX_LOCAL_DEVICE_IDS)
    if device_ids:
        kwargs["local_device_ids"] = [int(i) for i in device_ids.split(",")]
    bind = environ.get(contract.COORDINATOR_BIND_ADDRESS)
    if bind and rank == 0:
        kwargs["coordinator_bind_address"] = bind
    jax.distributed.initialize(**kwargs)
    _launched.update(coordinator=coordinator, num_processes=count, process_id=rank)
    jax.distributed.initialize = _checked_initialize

    rows = preflight(verbose=environ.get(contract.VERBOSE) == "1")
    try:
        mesh.install_from_env(environ, hosts={r["host"] for r in rows})
    except mesh.MeshSetupError as e:
        raise BootstrapError(str(e)) from None


# Every process must run the same jax and jaxlib: mixed versions fail later in
# obscure ways (mismatched HLO, hangs in collectives).
_MUST_MATCH = ("jax", "jaxlib")


def preflight(verbose: bool = False) -> list[dict]:
    """Exchange host, pid, devices and versions; fail fast on mismatched versions.

    One key-value set, one barrier and one directory read per process, so it
    is cheap enough to run on every launch.
    """
    import jax
    import jaxlib

    me = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "devices": [str(d) for d in jax.local_devices()],
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "python": sys.version.split()[0],
    }
    everyone = allgather_json("preflight", me, timeout_s=120)
    rows = [dict(everyone[p], process=p) for p in sorted(everyone)]
    if verbose and jax.process_index() == 0:
        print(format_preflight(rows), file=sys.stderr, flush=True)
    check_versions(rows)
    return rows


def check_versions(rows: list[dict]) -> None:
    """BootstrapError naming the processes when jax or jaxlib versions differ."""
    for field in _MUST_MATCH:
        seen: dict[str, list[int]] = {}
        for row in rows:
            seen.setdefault(row[field], []).append(row["process"])
        if len(seen) > 1:
            parts = "; ".join(
                f"{v} on process{'es' if len(ps) > 1 else ''} {', '.join(map(str, ps))}" for v, ps in seen.items()
            )
            raise BootstrapError(f"{field} versions differ across processes: {parts}")


def format_preflight(rows: list[dict]) -> str:
    header = ("process", "host", "pid", "devices", "jax", "jaxlib", "python")
    table = [header] + [
        (str(r["process"]), r["host"], str(r["pid"]), ",".join(r["devices"]), r["jax"], r["jaxlib"], r["python"])
        for r in rows
    ]
    return "jaxrun: preflight\n" + "\n".join("  " + line for line in contract.align_columns(table))


_noted_address = False


def _checked_initialize(coordinator_address=None, num_processes=None, process_id=None, *args, **kwargs):
    """Stands in for jax.distributed.initialize once jaxrun has initialized."""
    global _noted_address
    for name, given in (("process_id", process_id), ("num_processes", num_processes)):
        expected = _launched[name]
        if given is not None and int(given) != expected:
            raise RuntimeError(
                f"jax.distributed.initialize({name}={given}) disagrees with jaxrun, "
                f"which started this process with {name}={expected}"
            )
    if coordinator_address and coordinator_address != _launched["coordinator"] and not _noted_address:
        _noted_address = True
        print(
            f"jaxrun: ignoring coordinator_address={coordinator_address!r} in "
            f"jax.distributed.initialize(); using jaxrun's {_launched['coordinator']}",
            file=sys.stderr,
        )


_rounds = itertools.count()


def allgather_json(tag: str, payload: Any, timeout_s: float = 300.0) -> dict[int, Any]:
    """*Collective*: every process's JSON-able ``payload``, keyed by process id.

    Goes through the coordination service's key-value store, so it needs no
    device and works before any mesh exists.  One set, one barrier and one
    directory read per process.
    """
    from jax._src import distributed

    client = distributed.global_state.client
    import jax

    me = jax.process_index()
    if client is None or jax.process_count() == 1:
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


_previous_key: list[str] = []
