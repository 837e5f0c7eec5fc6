"""A dead run's socket files are removed; a live one's, and one between its
bind and its listen, are not (core.stale)."""

import os
import socket
import time

from jaxrun.core import stale


def bound(path: str, listening: bool) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    if listening:
        sock.listen()
    return sock


def test_only_a_socket_nobody_listens_on_and_not_just_made_is_removed(tmp_path):
    live = bound(str(tmp_path / "coordinator-live.sock"), listening=True)
    dead = bound(str(tmp_path / "coordinator-dead.sock"), listening=False)
    dead.close()  # its file stays, as a SIGKILLed process 0's does
    young = bound(str(tmp_path / "coordinator-young.sock"), listening=False)  # between bind and listen
    other = bound(str(tmp_path / "run-dead.sock"), listening=False)
    other.close()
    (tmp_path / "coordinator-file.sock").write_text("not a socket")
    try:
        now = time.time()
        old = now - 2 * stale.YOUNG
        for name in ("coordinator-live.sock", "coordinator-dead.sock", "run-dead.sock", "coordinator-file.sock"):
            os.utime(tmp_path / name, (old, old), follow_symlinks=False)
        removed = stale.remove_stale(str(tmp_path), now=now)
        assert removed == [str(tmp_path / "coordinator-dead.sock")]
        assert sorted(os.listdir(tmp_path)) == ["coordinator-file.sock", "coordinator-live.sock",
                                                "coordinator-young.sock", "run-dead.sock"]
        later = now + 2 * stale.YOUNG  # its bind long past: no listen came
        assert stale.remove_stale(str(tmp_path), now=later) == [str(tmp_path / "coordinator-young.sock")]
    finally:
        live.close()
        young.close()
