"""``--hosts-command``: the hosts file a user's command prints, before the
first attempt and again before each elastic restart.  The one part of setup
that runs something: the user's own command, with a bound on its time and
its output."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping

from jaxrun.core.config import LaunchError
from jaxrun.core.spec import Host
from jaxrun.launcher.setup import hosts as hostfile

# The longest a --hosts-command may take, and the most it may print.
DISCOVERY_TIMEOUT = 60.0
DISCOVERY_MAX_BYTES = 1 << 20


def discover(command: str, environ: Mapping[str, str] | None = None) -> list[Host]:
    """Run --hosts-command (with the shell, as the user wrote it) and read its
    output as a hosts file.  Raises LaunchError with one line on failure."""
    try:
        done = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=DISCOVERY_TIMEOUT, env=dict(environ) if environ is not None else None)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"--hosts-command: no answer within {DISCOVERY_TIMEOUT:g} s") from None
    except OSError as e:
        raise LaunchError(f"--hosts-command: cannot run it ({e.strerror or e})") from None
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        raise LaunchError(f"--hosts-command exited with status {done.returncode}"
                          + (f": {said[-1]}" if said else ""))
    if len(done.stdout) > DISCOVERY_MAX_BYTES:
        raise LaunchError(f"--hosts-command printed more than {DISCOVERY_MAX_BYTES >> 20} MiB; is it a hosts file?")
    try:
        return hostfile.parse_hosts_file(done.stdout.decode(errors="replace"), "--hosts-command")
    except hostfile.HostsError as e:
        raise LaunchError(str(e)) from None
