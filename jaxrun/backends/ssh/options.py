"""The SSH backend's options: what its registry entry builds from the command
line (``RunConfig.backend_options``), with the checks of its own flags.  The
flags themselves are declared in the registry (``jaxrun.backends``), so that
``--help`` reads them without importing this package."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from jaxrun.core.config import LaunchError
from jaxrun.core.spec import Host, LaunchOptions


@dataclasses.dataclass(frozen=True)
class SshOptions:
    """A run over SSH: how to reach the hosts, and what to check and copy there."""

    python: str
    chdir: str
    config_file: str | None = None
    options: tuple[str, ...] = ()
    connect_timeout: float = 10.0
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)  # --env/-x, for preflight
    script: str | None = None  # the script's path as given (None for -m): checked on every host
    sync: bool = False  # --sync: copy chdir to every host first
    setup: str | None = None  # --setup: shell code each remote command runs first ('module load ...')

    def python_on(self, host: Host) -> str:
        """The interpreter on ``host``: its own (python= in the hosts file), else --python's."""
        return host.python or self.python


def options(values: Mapping[str, Any], launch: LaunchOptions) -> SshOptions:
    """The registry's ``options`` for ssh: raises LaunchError for a value it refuses."""
    chdir = values["chdir"]
    if values["sync"] and not os.path.isdir(chdir or os.getcwd()):
        raise LaunchError(f"--sync: {chdir} is not a folder here, so there is nothing to copy")
    return SshOptions(
        python=launch.python,
        chdir=chdir or os.getcwd(),
        config_file=values["ssh_config"],
        options=tuple(values["ssh_options"]),
        connect_timeout=values["connect_timeout"],
        env=launch.extra_env,
        script=None if launch.target.is_module else launch.target.name,
        sync=values["sync"],
        setup=values.get("setup") or None,
    )
