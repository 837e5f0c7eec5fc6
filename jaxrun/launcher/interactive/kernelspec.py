"""``jaxrun kernel install``: a Jupyter kernelspec whose kernel is a jaxrun launch.

The kernelspec names the launch options; a notebook that starts the kernel
starts ``python -m jaxrun.launcher.interactive.kernel -f CONNECTION -- LAUNCH OPTIONS``,
which runs ``jaxrun LAUNCH OPTIONS -i`` behind it (``launcher.interactive.kernel``).
This module only writes JSON: neither ``--help`` nor ``kernel install``
imports ipykernel, but both say how to get it when it is missing.  Without
``--prefix`` the kernelspec goes where Jupyter itself looks for this user's
(jupyter_core, which ipykernel needs, says where that is on this system).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys

from jaxrun.core.config import LaunchError

KERNEL_MODULE = "jaxrun.launcher.interactive.kernel"
INSTALL_HINT = "jaxrun kernel needs ipykernel: pip install 'jaxrun[jupyter]'"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")  # what Jupyter accepts as a kernel's name


def require_ipykernel() -> None:
    if importlib.util.find_spec("ipykernel") is None:  # finds it without importing it
        raise LaunchError(INSTALL_HINT)


def user_data_dir() -> str:
    """Jupyter's data folder for this user, as Jupyter finds it."""
    try:
        from jupyter_core.paths import jupyter_data_dir
    except ImportError:
        raise LaunchError(INSTALL_HINT) from None
    return jupyter_data_dir()


def kernelspec(launch: list[str], display_name: str, python: str = sys.executable) -> dict:
    return {
        "argv": [python, "-m", KERNEL_MODULE, "-f", "{connection_file}", "--", *launch],
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"jaxrun": {"launch": launch}},
    }


def install(name: str, launch: list[str], display_name: str | None, prefix: str | None) -> str:
    """Write the kernelspec; the folder it is in."""
    if not NAME.match(name):
        raise LaunchError(f"--name {name!r}: a kernel's name is letters, digits, '.', '_' and '-'")
    base = os.path.join(prefix, "share", "jupyter") if prefix else user_data_dir()
    folder = os.path.join(base, "kernels", name.lower())
    os.makedirs(folder, exist_ok=True)
    spec = kernelspec(launch, display_name or f"jaxrun ({' '.join(launch) or 'one process'})")
    with open(os.path.join(folder, "kernel.json"), "w") as f:
        json.dump(spec, f, indent=1)
        f.write("\n")
    return folder
