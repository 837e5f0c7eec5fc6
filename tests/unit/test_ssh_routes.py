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
from jaxrun.child import addresses
from jaxrun.core.spec import Host, ProcessSpec


def test_each_host_s_socket_is_in_its_agent_s_private_folder():
    assert host_socket("/tmp/jaxrun-host-abc/channels", "00ff00ff") == "/tmp/jaxrun-host-abc/coordinator-00ff00ff.sock"
    assert host_socket(None, "00ff00ff") is None  # no agent there: no private folder
    assert host_socket("/" + "x" * 120 + "/channels", "00ff00ff") is None  # beyond what a socket's path holds


def test_a_process_gets_its_own_host_s_socket_everywhere_the_address_was_and_the_route():
    first, own = "unix:/tmp/jaxrun-host-a/coordinator-1.sock", "unix:/tmp/jaxrun-host-b/coordinator-1.sock"
    spec = ProcessSpec(2, 0, Host("hostB"), "python", ("job.py", f"--at={first}"),
                       {contract.COORDINATOR_ADDRESS: first, contract.JAX_COORDINATOR_ADDRESS: first})
    env = {**spec.env, "OTHER": "kept"}
    changed, env = routed(spec, env, first, own, "10.0.0.2")
    assert env == {contract.COORDINATOR_ADDRESS: own, contract.JAX_COORDINATOR_ADDRESS: own, "OTHER": "kept",
                   contract.COORDINATOR_ROUTE: "10.0.0.2"}
    assert changed.shim_args == ("job.py", f"--at={own}")


def test_a_forwarded_socket_s_process_advertises_the_routed_address_not_loopback(monkeypatch):
    coordinator = "unix:/tmp/jaxrun-host-b/coordinator-1.sock"
    monkeypatch.delenv(contract.COORDINATOR_ROUTE, raising=False)
    assert addresses.reachable_address(coordinator) == "127.0.0.1"  # a local run's socket
    own = next((a.address for nic in psutil.net_if_addrs().values() for a in nic
                if a.family == socket.AF_INET and not a.address.startswith("127.")), None)
    if own is None:
        pytest.skip("this machine has no network address but loopback")
    monkeypatch.setenv(contract.COORDINATOR_ROUTE, own)  # the first host is this machine, reached over the network
    assert addresses.reachable_address(coordinator) == own
    assert addresses.reachable_address(coordinator) == addresses.reachable_address(f"{own}:1")  # as a TCP address's
