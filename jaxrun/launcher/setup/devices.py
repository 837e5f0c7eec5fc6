"""Launcher side: how many accelerators this machine has, without importing jax."""

from __future__ import annotations

import os
import shutil
import subprocess


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
