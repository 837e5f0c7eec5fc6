"""The fork server's messages: the launcher (or an SSH host agent) asks the
server (``backends/forkserver/server.py``) to fork one controller.

Each crosses a Unix stream socket in a frame (``encoding.send_frame``), so
that the controller's stdout, stderr and lifeline travel with the request as
file descriptors.  ``ForkRequest`` goes one way; ``Ready`` (once, when the
server has done its imports), ``Started`` and ``ChildExited`` come back.
"""

from jaxrun.wire.controller import Started as Started
from jaxrun.wire.encoding import Message, message


@message("fork")
class ForkRequest(Message):
    """Fork one controller; its stdout, stderr and lifeline travel as fds."""

    shim_args: list
    env: dict
    cwd: str = ""  # where the controller runs; "" for the server's own folder


@message("ready")
class Ready(Message):
    """The server has imported jax and the preload modules (``error`` empty),
    or could not (``error`` says why, and the server exits)."""

    error: str


@message("exited")
class ChildExited(Message):
    pid: int
    returncode: int  # Popen style: negative for a signal
    resources: dict | None = None  # contract.Resources.to_dict(), measured by the server
    reaped_at: float | None = None  # the server's wall clock as it reaped it (None: an older server)
