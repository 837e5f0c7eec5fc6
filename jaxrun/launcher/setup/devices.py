"""Launcher side: what this machine gives a local job's processes, without
importing jax: its accelerators, a TPU host's chips shared among them, and
the internet sockets over which several of them meet."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

from jaxrun.contract import devices
from jaxrun.core.config import LaunchError


def count_local_gpus(environ=os.environ) -> int | None:
    """NVIDIA GPUs visible here, or None when there are none or we cannot tell."""
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [d for d in visible.split(",") if d.strip() and d.strip() != "-1"]
        return len(ids) or None
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(1 for line in out.splitlines() if line.startswith("GPU ")) or None


def free_ports(count: int) -> list[int]:
    """``count`` different free loopback ports."""
    from jaxrun import portable

    ports: list[int] = []
    for _ in range(64 * count):
        if len(ports) == count:
            break
        port = portable.free_port("127.0.0.1")
        if port not in ports:
            ports.append(port)
    return ports


def check_loopback(system, num_processes: int, need: str) -> None:
    """LaunchError, one line, where ``num_processes`` processes on this
    machine would meet over internet sockets (``need`` says why they do) and
    it refuses them (``system.loopback_refused()``)."""
    refused = system.loopback_refused()
    if refused:
        raise LaunchError(f"-n {num_processes}: {need}, and this machine refuses internet sockets ({refused}); "
                          "a job of one process needs none")


# Why several processes of a job meet over internet sockets.
MEET_ON_CPU = "a job's processes meet over internet sockets (JAX's CPU collectives, its transfers between them)"
MEET_ON_TPU = f"libtpu's processes meet on TCP ports ({devices.TPU_PROCESS_ADDRESSES})"


def tpu_share(system, num_processes: int, per_process: int | None,
              extra_env: Mapping[str, str]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(this machine's TPU chips, a port for each process) for a local run
    that splits them among its processes, or ((), ()): no TPU here, or one
    process that owns every chip.  LaunchError, one line, where the
    processes do not fit the chips (more processes than chips), or cannot
    meet (several, where this machine refuses internet sockets).  ``system``:
    configure's System (``local_tpu_chips``, ``loopback_refused``, ``tcp_ports``)."""
    if num_processes == 1 and per_process is None:
        return (), ()
    chips = system.local_tpu_chips({**system.environ, **extra_env})
    if not chips:
        return (), ()
    try:
        devices.tpu_split(len(chips), num_processes, per_process)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if num_processes == 1:
        return tuple(chips), ()
    check_loopback(system, num_processes, MEET_ON_TPU)
    return tuple(chips), tuple(system.tcp_ports(num_processes))
