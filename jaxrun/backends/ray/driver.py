"""The Ray driver of one attempt: ``python -m jaxrun.backends.ray.driver FD SETTINGS``.

jaxrun starts it on this machine (:class:`jaxrun.backends.ray.backend.Driver`).
It connects to the cluster, asks for a placement group of one bundle per
controller, tells the launcher each bundle's node (``Placed``, on pipe FD),
waits for ``Go`` on its stdin, starts one actor
(:class:`jaxrun.backends.ray.actor.ControllerHost`) per bundle, and exits
once every actor's agent has, with the first failing status.  Its stdin is
its lifeline: once it closes, the driver exits at once, and Ray ends its
actors and its placement group.  This and the actors are the only processes
that import ray.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import sys
import threading
from typing import Any

from jaxrun import contract
from jaxrun.backends.ray.actor import ControllerHost
from jaxrun.backends.ray.words import PLACEMENTS, DriverFailed, Placed
from jaxrun.wire import encoding

REACH_TIMEOUT = 5.0  # the first look at the cluster's address, before ray.init (which waits minutes)
WAIT_NOTE = 5.0  # a placement that takes longer is said once, like srun's "queued and waiting"


def unreachable(address: str) -> str | None:
    """Why the cluster's GCS cannot be reached, or None (ray.init would wait for minutes)."""
    if address == "auto":
        return None
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT).close()
    except (OSError, ValueError) as e:
        return f"cannot reach the Ray cluster at {address}: {e}"
    return None


def drive(words_fd: int, settings: dict) -> int:
    """The driver's life; its exit status is the first failing process's."""
    words = os.fdopen(words_fd, "wb", buffering=0)
    plans: queue.SimpleQueue[bytes] = queue.SimpleQueue()
    threading.Thread(target=_lifeline, args=(plans,), name="lifeline", daemon=True).start()
    address, count = settings["address"], len(settings["bundles"])
    problem = unreachable(address)
    if problem:
        words.write(DriverFailed(problem).line())
        return 2
    import logging

    import ray
    from ray.util.placement_group import placement_group, placement_group_table
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    try:  # Ray's forwarding of worker output is off: the task channel carries it
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except Exception as e:  # noqa: BLE001 -- whatever Ray raises, it is one line for the user
        words.write(DriverFailed(f"cannot connect to the Ray cluster at {address}: {e}".splitlines()[0]).line())
        return 2
    group = placement_group(settings["bundles"], strategy=PLACEMENTS[settings["placement"]])
    ready = group.ready()
    if not ray.wait([ready], timeout=WAIT_NOTE)[0]:
        print(f"jaxrun: waiting for the Ray cluster to place {count} processes ({settings['bundles'][0]} each, "
              f"--placement {settings['placement']})", flush=True)
        ray.get(ready)
    table = placement_group_table(group)["bundles_to_node_id"]
    addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
    nodes = [[table[i], addresses.get(table[i], "unknown")] for i in range(count)]
    words.write(Placed(nodes, ray.util.get_node_ip_address()).line())
    go = encoding.decode(plans.get())
    # Ray's working_dir (``ray job submit --working-dir``): each worker starts in its copy.
    cwd = None if ray.get_runtime_context().runtime_env.get("working_dir") else go.cwd
    gpus = settings["bundles"][0].get("GPU", 0)
    actor = ray.remote(num_cpus=1, num_gpus=gpus, max_restarts=0)(ControllerHost)
    runs = {}
    for rank, (bundle, command, env) in enumerate(go.processes):
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle)
        runs[actor.options(scheduling_strategy=where).remote().run.remote(command, env, cwd)] = rank
    return first_failure(ray, runs)


def first_failure(ray: Any, runs: dict) -> int:
    """Wait for every actor's agent; the first failing status, in the order they ended."""
    status, pending = 0, list(runs)
    while pending:
        (done,), pending = ray.wait(pending, num_returns=1)
        try:
            code, said = ray.get(done)
        except ray.exceptions.RayError as e:
            code, said = 1, f"its Ray actor failed: {str(e).strip().splitlines()[0]}"
        for line in said.splitlines():
            print(f"jaxrun: process {runs[done]}: {line}", flush=True)
        status = status or code
    return status


def _lifeline(plans: queue.SimpleQueue) -> None:
    """The launcher's one word, then nothing until it closes our stdin, or dies."""
    data, told = b"", False
    while chunk := os.read(0, 1 << 16):  # unbuffered: this thread may still read as the driver exits
        if not told:
            data += chunk
            if b"\n" in data:
                plans.put(data)
                told = True
    os._exit(0)  # Ray ends this driver's actors and placement group


def main(argv: list[str]) -> int | str:
    if len(argv) == 2 and argv[0].isdigit():
        return drive(int(argv[0]), json.loads(argv[1]))
    return f"usage: python -m {contract.RAY_DRIVER_MODULE} FD SETTINGS"  # sys.exit prints it


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
