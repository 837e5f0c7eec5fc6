"""The shim looks for process 0's coordination service before initialize()
(see ``bootstrap.wait_for_coordinator``): real sockets on loopback."""

import socket
import threading
import time

import pytest

from jaxrun import contract, portable
from jaxrun.child.join import bootstrap


def answer(server: socket.socket) -> None:
    """As a service does: read the client's hello, send its own first bytes."""
    conn, _ = server.accept()
    with conn:
        conn.recv(64)
        conn.sendall(b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")


def test_an_open_port_that_answers_is_found_at_once():
    with socket.create_server(("127.0.0.1", 0)) as server:
        threading.Thread(target=answer, args=(server,), daemon=True).start()
        started = time.monotonic()
        assert bootstrap.wait_for_coordinator(f"127.0.0.1:{server.getsockname()[1]}", within=5)
        assert time.monotonic() - started < 1


def _tcp_later(tmp_path):
    """A loopback port, and how to listen there once it opens."""
    port = portable.free_port("127.0.0.1")
    return f"127.0.0.1:{port}", lambda: socket.create_server(("127.0.0.1", port))


def _unix_later(tmp_path):
    """A socket file, as a local job's coordinator is (issue 58), and how to listen there."""
    path = str(tmp_path / "coordinator.sock")

    def listen() -> socket.socket:
        server = socket.socket(socket.AF_UNIX)
        server.bind(path)
        server.listen()
        return server

    return contract.unix_address(path), listen


@pytest.mark.parametrize("later", [_tcp_later, _unix_later], ids=["port", "socket-file"])
def test_a_coordinator_that_opens_later_is_found_when_it_opens(tmp_path, later):
    address, listen = later(tmp_path)
    opened = threading.Event()

    def open_later() -> None:
        time.sleep(0.3)
        with listen() as server:
            opened.set()
            answer(server)  # the wait's one connection

    thread = threading.Thread(target=open_later)
    thread.start()
    try:
        assert bootstrap.wait_for_coordinator(address, within=10)
        assert opened.is_set()
    finally:
        thread.join(10)


def test_a_socket_file_that_never_appears_gives_up_after_the_wait(tmp_path):
    started = time.monotonic()
    assert not bootstrap.wait_for_coordinator(contract.unix_address(str(tmp_path / "never.sock")), within=0.3)
    assert time.monotonic() - started < 3  # 0.3 s asked; the margin is a loaded machine's


def test_a_port_that_never_opens_gives_up_after_the_wait():
    port = portable.free_port("127.0.0.1")
    started = time.monotonic()
    assert not bootstrap.wait_for_coordinator(f"127.0.0.1:{port}", within=0.3)
    assert 0.25 < time.monotonic() - started < 3


def test_an_accept_with_nobody_behind_it_is_no_answer(tmp_path):
    """An SSH forward's socket accepts before process 0 listens, then hangs
    up: the wait must go on until the service itself answers (its first
    bytes), or gRPC waits out its reconnect backoff, about a second."""
    path = str(tmp_path / "forward.sock")
    forward = socket.socket(socket.AF_UNIX)
    forward.bind(path)
    forward.listen()
    stop = threading.Event()

    def hang_up() -> None:
        forward.settimeout(0.1)
        while not stop.is_set():
            try:
                forward.accept()[0].close()
            except OSError:
                pass

    thread = threading.Thread(target=hang_up)
    thread.start()
    try:
        assert not bootstrap.wait_for_coordinator(contract.unix_address(path), within=0.5)
    finally:
        stop.set()
        thread.join(10)
        forward.close()
