"""The ways jaxrun starts controllers, each beside its far-end agent.

``create_backend`` is the one place that chooses among them.  Each module is
imported only when a run needs it, so a local run never loads SSH or
scheduler code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from jaxrun.core.backend import Backend
    from jaxrun.core.config import RunConfig


def create_backend(config: RunConfig, console: TextIO) -> Backend:
    if config.ssh is not None:
        from jaxrun.backends.ssh import SshBackend

        return SshBackend(config.ssh, config.options.hosts, console, verbose=config.verbose,
                          preload=config.preload, preload_modules=config.preload_modules)
    if config.scheduler is not None:
        from jaxrun.backends.scheduler import SchedulerBackend

        return SchedulerBackend(config.scheduler, config.options, console)
    if config.preload:
        from jaxrun.backends.forkserver import ForkServerBackend

        return ForkServerBackend(config.preload_modules, console)
    from jaxrun.backends.local import LocalBackend

    return LocalBackend()
