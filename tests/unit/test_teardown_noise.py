"""JAX's teardown lines on an accelerator (issue 71: every clean run on a TPU
host printed them) are noise: the console hides them, the logs keep them, -v
shows them.  A real failure's lines that look alike stay."""

import io

import pytest

from jaxrun.core.events import Stream
from jaxrun.core.noise import is_noise, without_noise
from jaxrun.launcher.output.printer import ConsolePrinter

# As the TPU host printed them at the end of clean one-process runs (bench/tpu_smoke.sh, issue 71):
# the service's end (its last line's two keys come in either order), and the variant where the
# coordinator's socket file is gone already.
CANCELLED = (
    b"W1205 22:34:55.906839    5317 pjrt_client.cc:1615] WatchTasksAsync failed for task 0: CANCELLED: CANCELLED\n"
    b"Additional GRPC error information from remote target coordination_service while calling "
    b"/xla.coordination.CoordinationService/WatchTasks:\n"
    b':UNKNOWN:Error received from peer  {grpc_message:"CANCELLED", grpc_status:1} '
    b"[type.googleapis.com/tensorflow.DerivedStatus='']\n"
    b':UNKNOWN:Error received from peer  {grpc_status:1, grpc_message:"CANCELLED"} '
    b"[type.googleapis.com/tensorflow.DerivedStatus='']\n"
)
SOCKET = b"unix:/tmp/jaxrun-sockets-65534/coordinator-b084a3e5.sock"
GONE = (
    b"W1205 22:34:32.502950    4971 pjrt_client.cc:1615] WatchTasksAsync failed for task 0: UNAVAILABLE: failed to "
    b"connect to all addresses; last error: FAILED_PRECONDITION: " + SOCKET + b": connect failed: addr: " + SOCKET
    + b" error: No such file or directory\n"
    b"Additional GRPC error information from remote target coordination_service while calling "
    b"/xla.coordination.CoordinationService/WatchTasks:\n"
    b':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"failed to connect to all addresses; last '
    b"error: FAILED_PRECONDITION: " + SOCKET + b": connect failed: addr: " + SOCKET
    + b' error: No such file or directory"}\n'
)


def console(show_noise=False):
    out, err = io.BytesIO(), io.BytesIO()
    return ConsolePrinter(stdout=out, stderr=err, show_noise=show_noise), err


@pytest.mark.parametrize("lines", [CANCELLED, GONE], ids=["cancelled", "socket-gone"])
def test_the_teardown_lines_are_hidden_on_the_console_and_shown_with_v(lines):
    p, err = console()
    p.write(0, Stream.STDERR, b"step 10 done\n" + lines + b"the end\n")
    p.flush()
    assert err.getvalue() == b"[0] step 10 done\n[0] the end\n"
    assert all(is_noise(line) and without_noise(line) is None for line in lines.splitlines())
    p, err = console(show_noise=True)
    p.write(0, Stream.STDERR, lines)
    p.flush()
    assert err.getvalue() == b"".join(b"[0] " + line for line in lines.splitlines(keepends=True))


@pytest.mark.parametrize("line", [
    # (The coordination agent's error that a peer failed is the head of a
    # fatal-error page since issue 74: hidden, counted, in test_fatal_pages.py.)
    b':UNKNOWN:Error received from peer {grpc_status:4, grpc_message:"Deadline Exceeded"}\n',
    b"WatchTasksAsync failed for task 0: INTERNAL: the task is gone\n",
    b"my script says WatchTasks is a function\n",
])
def test_a_failures_lines_that_look_alike_stay(line):
    p, err = console()
    p.write(1, Stream.STDERR, line)
    p.flush()
    assert err.getvalue() == b"[1] " + line and not is_noise(line)
