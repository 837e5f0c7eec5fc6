"""The shim looks for process 0's coordination service before initialize()
(see ``bootstrap.wait_for_coordinator``): real sockets on loopback."""

import socket
import threading
import time

from jaxrun import portable
from jaxrun.child import bootstrap


def test_an_open_port_is_found_at_once():
    with socket.create_server(("127.0.0.1", 0)) as server:
        started = time.monotonic()
        assert bootstrap.wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", within=5)
        assert time.monotonic() - started < 1


def test_a_port_that_opens_later_is_found_when_it_opens():
    port = portable.free_port("127.0.0.1")
    opened = threading.Event()

    def open_later() -> None:
        time.sleep(0.3)
        with socket.create_server(("127.0.0.1", port)) as server:
            opened.set()
            conn, _ = server.accept()  # the wait's one connection
            conn.close()

    thread = threading.Thread(target=open_later)
    thread.start()
    try:
        assert bootstrap.wait_for_coordinator(f"127.0.0.1:{port}", within=10)
        assert opened.is_set()
    finally:
        thread.join(10)


def test_a_port_that_never_opens_gives_up_after_the_wait():
    port = portable.free_port("127.0.0.1")
    started = time.monotonic()
    assert not bootstrap.wait_for_coordinator(f"127.0.0.1:{port}", within=0.3)
    assert 0.25 < time.monotonic() - started < 3
