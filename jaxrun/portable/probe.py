"""How the layer asks the system: the switch that turns every Linux-only
facility off, the C library's functions, and a number from ``/proc/sys``."""

from __future__ import annotations

import os

from jaxrun import contract


def forced() -> bool:
    """Whether ``JAXRUN_PORTABLE`` turns every Linux-only facility off."""
    return os.environ.get(contract.PORTABLE, "") not in ("", "0")


def libc():
    """The C library's functions, or None where ctypes cannot load it."""
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True)
    except (ImportError, OSError):
        return None


def first_number(path: str, default: int) -> int:
    """The first number in a file of /proc/sys, or ``default`` (also where
    the switch is on: the answer a system without that file gets)."""
    try:
        with open(path) as f:
            return default if forced() else int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return default
