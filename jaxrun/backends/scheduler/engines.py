"""The scheduler engines, told apart by their options' type.

The registry's entries for ``--launcher slurm`` and ``mpirun`` build one of
the options types of :mod:`jaxrun.backends.scheduler.options`; ``start``
builds the backend that takes it.  A new engine is its module and one line
in ``ENGINES``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TextIO

from jaxrun.backends.scheduler.backend import SchedulerBackend
from jaxrun.backends.scheduler.mpirun import MpirunBackend
from jaxrun.backends.scheduler.options import SchedulerOptions
from jaxrun.backends.scheduler.slurm import SlurmBackend
from jaxrun.core.spec import LaunchOptions

ENGINES: dict[type[SchedulerOptions], type[SchedulerBackend]] = {
    backend.options_type: backend for backend in (SlurmBackend, MpirunBackend)}


def start(options: SchedulerOptions, launch: LaunchOptions, console: TextIO,
          base_env: Mapping[str, str] | None = None) -> SchedulerBackend:
    return ENGINES[type(options)](options, launch, console, base_env)
