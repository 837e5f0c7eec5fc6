"""The preloading server's process, started and ended: light enough to run
before the rest of the launcher loads (``backends.table.head_start`` starts
one as soon as the command line is known good, so that its ``import jax``
overlaps the launcher's own start).

``ForkServer`` in ``client.py`` hears and drives the process; this module
only owns it: the socket to it, and its end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence

from jaxrun import contract
from jaxrun.backends.shield import shielded


def server_env(base_env: Mapping[str, str], common: Mapping[str, str]) -> dict[str, str]:
    """The server's environment: the launcher's, what every process gets, unbuffered output."""
    env = dict(base_env)
    env.update(common)
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ServerProcess:
    """The server, running from the moment this is built: its import of jax
    (and of ``preload``) starts at once.  ``env`` is the one it was given."""

    def __init__(self, python: str, env: Mapping[str, str], preload: Sequence[str] = ()):
        self.python, self.env, self.preload = python, dict(env), tuple(preload)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            with shielded():  # a SIGTERM sent to the whole tree is the launcher's, not the server's
                self.popen = subprocess.Popen(
                    [python, "-m", contract.FORKSERVER_AGENT_MODULE, str(theirs.fileno()), *self.preload],
                    env=self.env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    pass_fds=(theirs.fileno(),),
                    process_group=0,
                )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.pid = self.popen.pid
        self.closed = False

    def close(self, wait: bool = True) -> None:
        """End it (once: again only waits, where asked), and wait for it to be
        gone unless ``wait`` is false: the kernel's teardown of a process
        that imported jax takes 15-30 ms, which the caller need not spend
        (it calls ``reap`` later)."""
        if not self.closed:
            self.closed = True
            try:
                # shutdown, not just close: a reader's pending recv would keep the
                # socket open, and the server would never see EOF.
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            # Its controllers have all exited by now, so the server holds nothing
            # worth a clean interpreter shutdown (tearing down jax's modules takes
            # a noticeable fraction of a second).
            self.kill()
        if wait:
            self.reap()

    def reap(self) -> None:
        """Wait for it, ended (``close``)."""
        self.popen.wait()

    def kill(self) -> None:
        """SIGKILL to its group, without a wait: the last resort's, from any
        thread.  Only while unreaped, so the group's id is still its own."""
        if self.popen.returncode is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
