"""The Python versions jaxrun admits, which of them this machine has, and a
virtual environment per version for the test that runs the toy under each.

``requires-python`` in pyproject.toml decides what is admitted; nothing here
names a version of its own.  CI runs the full suite on its main interpreter,
and, for every other admitted version found (pyenv's versions, or
``python3.X`` on PATH), builds a venv with this checkout installed (editable,
so it runs the code under test) and the same jax, jaxlib and ml_dtypes as the main
interpreter, in a cache folder outside the checkout (``VENVS``; set
``JAXRUN_CI_VENVS`` to choose another), reused by the next run:

    python tests/pythons.py        # what .ci/run does before the tests

tests/e2e/test_python_versions.py then runs the toy in each venv.  A build
that fails for an interpreter that exists fails CI (exit status 1): a
version that requires-python admits but cannot install jaxrun is a bug to
see, not a test to skip.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
# Outside the checkout (they hold about 600 MB each), one folder per checkout:
# each venv runs the checkout it was built for.
VENVS = Path(os.environ.get("JAXRUN_CI_VENVS") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "jaxrun-ci" / hashlib.sha256(str(ROOT).encode()).hexdigest()[:12])
PYENV_ROOT = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
# The minor versions of Python 3 that requires-python is checked against.
MINORS = range(8, 16)
# What each venv gets beside jaxrun, pinned to the main interpreter's versions.
PINNED = ("jax", "jaxlib", "ml_dtypes")
MAIN = f"3.{sys.version_info.minor}"


def requires_python() -> SpecifierSet:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return SpecifierSet(tomllib.load(f)["project"]["requires-python"])


def admitted() -> list[str]:
    spec = requires_python()
    return [f"3.{m}" for m in MINORS if spec.contains(f"3.{m}.0")]


def newest_below() -> str | None:
    """The newest version older than every admitted one: the likeliest to be tried."""
    spec = requires_python()
    first = next((m for m in MINORS if spec.contains(f"3.{m}.0")), None)
    return None if first is None or first == MINORS[0] else f"3.{first - 1}"


def interpreter(version: str) -> Path | None:
    """The newest pyenv build of ``version`` (plain CPython: 3.12.1, not
    3.13.0t), else ``python3.X`` on PATH."""
    pattern = re.compile(re.escape(version) + r"\.(\d+)\Z")
    builds = []
    if (PYENV_ROOT / "versions").is_dir():
        for entry in (PYENV_ROOT / "versions").iterdir():
            m = pattern.match(entry.name)
            if m and (entry / "bin" / "python3").exists():
                builds.append((int(m.group(1)), entry / "bin" / "python3"))
    if builds:
        return max(builds)[1]
    found = shutil.which(f"python{version}")
    return Path(found) if found else None


def venv_python(version: str) -> Path:
    return VENVS / f"py{version}" / "bin" / "python"


def pins() -> list[str]:
    return [f"{name}=={importlib.metadata.version(name)}" for name in PINNED]


def build(version: str, python: Path) -> None:
    """Create (or reuse) the venv for ``version`` and install this checkout into it."""
    if not venv_python(version).exists():
        subprocess.run([str(python), "-m", "venv", str(VENVS / f"py{version}")], check=True)
    subprocess.run([str(venv_python(version)), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "-e", str(ROOT), *pins()], check=True)


def main() -> int:
    failed = []
    for version in admitted():
        if version == MAIN:
            continue
        python = interpreter(version)
        if python is None:
            print(f"pythons: no Python {version} on this machine; its toy test will be skipped", flush=True)
            continue
        start = time.monotonic()
        try:
            build(version, python)
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"pythons: Python {version} ({python}): building its venv failed: {e}", file=sys.stderr, flush=True)
            failed.append(version)
            continue
        print(f"pythons: Python {version} ({python}): venv ready in {time.monotonic() - start:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
