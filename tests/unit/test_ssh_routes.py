"""The coordinator over SSH: each host's socket path, what each process is
told, and the child's route pick when its coordinator is a forwarded socket.
(tests/e2e/test_security.py runs the forwards on two real sshd hosts.)"""

from __future__ import annotations

import socket

import psutil
import pytest

from jaxrun import contract
from jaxrun.backends.ssh.backend import routed
from jaxrun.backends.ssh.routes import host_socket
from jaxrun.child.join import addresses
from jaxrun.core.spec import Host, ProcessSpec


def test_each_host_s_socket_is_in_its_agent_s_private_folder_and_names_the_route():
    path = host_socket("/tmp/jaxrun-host-abc/channels", "00ff00ff", "10.0.0.2")
    assert path == "/tmp/jaxrun-host-abc/coordinator-00ff00ff@10.0.0.2.sock"
    assert contract.address_host(contract.unix_address(path)) == "10.0.0.2"
    six = host_socket("/tmp/jaxrun-host-abc/channels", "00ff00ff", "fd00::2")
    assert ":" not in six  # ssh's forward specs split on colons
    assert contract.address_host(contract.unix_address(six)) == "fd00::2"
    assert host_socket(None, "00ff00ff", "10.0.0.2") is None  # no agent there: no private folder
    assert host_socket("/" + "x" * 120 + "/channels", "00ff00ff", "10.0.0.2") is None  # too long for a socket


def test_a_local_run_s_socket_names_no_route():
    assert contract.address_host("unix:/tmp/jaxrun-sockets-0/coordinator-00ff00ff.sock") == "127.0.0.1"


def test_a_process_gets_its_own_host_s_socket_everywhere_the_address_was():
    first = "unix:/tmp/jaxrun-host-a/coordinator-1@10.0.0.2.sock"
    own = "unix:/tmp/jaxrun-host-b/coordinator-1@10.0.0.2.sock"
    spec = ProcessSpec(2, 0, Host("hostB"), "python", ("job.py", f"--at={first}"),
                       {contract.COORDINATOR_ADDRESS: first, contract.JAX_COORDINATOR_ADDRESS: first})
    changed, env = routed(spec, {**spec.env, "OTHER": "kept"}, first, own)
    assert env == {contract.COORDINATOR_ADDRESS: own, contract.JAX_COORDINATOR_ADDRESS: own, "OTHER": "kept"}
    assert changed.shim_args == ("job.py", f"--at={own}")


def test_a_forwarded_socket_s_process_advertises_the_routed_address_not_loopback():
    own = next((a.address for nic in psutil.net_if_addrs().values() for a in nic
                if a.family == socket.AF_INET and not a.address.startswith("127.")), None)
    if own is None:
        pytest.skip("this machine has no network address but loopback")
    coordinator = contract.unix_address(f"/tmp/jaxrun-host-b/{contract.route_socket_name('coordinator-1', own)}")
    assert addresses.reachable_address(coordinator) == own  # the first host is this machine, over the network
    assert addresses.reachable_address(coordinator) == addresses.reachable_address(f"{own}:1")


def test_only_the_service_itself_counts_as_an_answer(tmp_path):
    """What the launcher waits for before it forwards the other hosts'
    sockets (issue 70): the coordination service's own first bytes, never
    only an accept, which the ssh client gives before process 0 listens and
    then hangs up (a far process took that for the service, and gRPC then
    waited out a second of reconnect backoff)."""
    import threading

    from jaxlib import _jax

    from jaxrun.backends.ssh.routes import service_answers

    assert not service_answers(str(tmp_path / "nobody.sock"))
    hangs_up = socket.socket(socket.AF_UNIX)
    hangs_up.bind(str(tmp_path / "ssh.sock"))
    hangs_up.listen()

    def accept_and_close() -> None:
        conn, _ = hangs_up.accept()
        conn.close()

    thread = threading.Thread(target=accept_and_close)
    thread.start()
    try:
        assert not service_answers(str(tmp_path / "ssh.sock"))  # connected, then nothing
    finally:
        thread.join(10)
        hangs_up.close()
    path = tmp_path / "coordinator.sock"
    service = _jax.get_distributed_runtime_service(contract.unix_address(str(path)), 1)
    try:
        assert service_answers(str(path))
    finally:
        service.shutdown()
