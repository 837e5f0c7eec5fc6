"""The SSH test hosts are what their fixtures claim (``fixtures.sshd``,
``fixtures.netns``): real checks, run on the hosts over ssh.

The SSH tests rely on these claims to mean anything: a product that writes a
file on the launching machine and reads it back "on a host" passes on hosts
that share /tmp, and one that advertises 127.0.0.1 passes on hosts that share
a network.  So each claim is checked here from the host's side.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid

import pytest
from fixtures.jobs import ROOT

BOTH = ["sshd_hosts", "netns_hosts"]

CONNECT = """\
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as s:
        s.settimeout(float(sys.argv[3]))
        print("connected", s.recv(100).decode(errors="replace").strip())
except OSError as e:
    print("failed", type(e).__name__, e.errno)
"""

RESOLVE = """\
import socket
import subprocess
name = socket.gethostname()
print(name, socket.gethostbyname(name), socket.gethostbyname("hostA"), socket.gethostbyname("hostB"))
"""


@pytest.fixture(params=BOTH)
def hosts(request):
    return request.getfixturevalue(request.param)


class Listener:
    """A TCP listener on the launching machine that greets whoever connects
    and notes their address."""

    def __init__(self, address: str):
        self.sock = socket.socket()
        self.sock.bind((address, 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.peers: list[str] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.peers.append(peer[0])
            with conn:
                conn.sendall(b"hello\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener():
    made: list[Listener] = []

    def make(address: str) -> Listener:
        made.append(Listener(address))
        return made[-1]

    yield make
    for one in made:
        one.close()


def connect_from(hosts, host: str, address: str, port: int, timeout: float = 3.0) -> str:
    return hosts.python(host, CONNECT, address, str(port), str(timeout)).stdout.strip()


# -- filesystems ------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_each_host_has_its_own_tmp(hosts, tmp_path):
    name = f"/tmp/jaxrun-fixture-{uuid.uuid4().hex}"
    hosts.run("hostA", ["sh", "-c", f"echo A > {name}"])
    assert hosts.run("hostA", ["cat", name]).stdout == "A\n"
    assert hosts.run("hostB", ["test", "-e", name], check=False).returncode == 1
    assert not os.path.exists(name)
    # And the other way round: the launching machine's tmp_path is not there.
    (tmp_path / "here").write_text("launcher")
    assert hosts.run("hostA", ["test", "-e", str(tmp_path / "here")], check=False).returncode == 1


@pytest.mark.timeout(60)
def test_shared_dir_checkout_and_python_are_on_every_host(hosts, shared_dir):
    (shared_dir / "note").write_text("from the launcher\n")
    hosts.run("hostA", ["sh", "-c", f"cat {shared_dir}/note > {shared_dir}/seen-by-a"])
    assert hosts.run("hostB", ["cat", str(shared_dir / "seen-by-a")]).stdout == "from the launcher\n"
    found = hosts.python("hostB", "import jaxrun, sys; print(jaxrun.__file__, sys.prefix)").stdout.split()
    assert found == [str(ROOT / "jaxrun" / "__init__.py"), sys.prefix]


# -- identities ---------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_each_host_has_its_own_name_and_machine_id(hosts):
    seen = {}
    for host in ("hostA", "hostB"):
        out = hosts.run(host, ["sh", "-c", "hostname; cat /etc/machine-id 2>/dev/null || echo none"]).stdout.split()
        seen[host] = out
        assert out[0] == hosts.hostnames[host]
    assert seen["hostA"][0] != seen["hostB"][0] != socket.gethostname()
    if seen["hostA"][1] != "none":
        assert len({seen["hostA"][1], seen["hostB"][1], open("/etc/machine-id").read().strip()}) == 3


@pytest.mark.timeout(60)
def test_hostnames_resolve_on_each_host(sshd_hosts, netns_hosts):
    """sshd_hosts: the hostname resolves to the host's own address.  netns_hosts:
    to 127.0.1.1, the hard case; hostA and hostB to their addresses."""
    for hosts, own in ((sshd_hosts, None), (netns_hosts, "127.0.1.1")):
        for host in ("hostA", "hostB"):
            name, address, a, b = hosts.python(host, RESOLVE).stdout.split()
            assert (name, address) == (hosts.hostnames[host], own or hosts.addresses[host])
            assert (a, b) == (hosts.addresses["hostA"], hosts.addresses["hostB"])


# -- networks ---------------------------------------------------------------------

@pytest.mark.timeout(60)
def test_netns_host_cannot_reach_the_launchers_loopback(netns_hosts, listener):
    here = listener("127.0.0.1")
    assert connect_from(netns_hosts, "hostA", "127.0.0.1", here.port).startswith("failed ConnectionRefusedError")
    assert here.peers == []


@pytest.mark.timeout(60)
def test_netns_host_reaches_the_bridge_and_the_other_host(netns_hosts, listener):
    gateway = listener(netns_hosts.gateway)
    assert connect_from(netns_hosts, "hostA", netns_hosts.gateway, gateway.port) == "connected hello"
    assert gateway.peers == [netns_hosts.addresses["hostA"]]
    # hostB's sshd greets hostA directly, over the bridge.
    assert connect_from(netns_hosts, "hostA", netns_hosts.addresses["hostB"], 22).startswith("connected SSH-2.0")
    # No route anywhere else: only the hosts' own network is reachable.
    assert connect_from(netns_hosts, "hostA", "198.51.100.1", 22).startswith("failed OSError 101")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["drop", "reject"])
def test_block_tcp_blocks_one_port_from_one_host(netns_hosts, listener, how):
    gateway = listener(netns_hosts.gateway)
    with netns_hosts.block_tcp("hostA", port=gateway.port, how=how):
        got = connect_from(netns_hosts, "hostA", netns_hosts.gateway, gateway.port, timeout=1.5)
        assert got.startswith("failed " + ("TimeoutError" if how == "drop" else "ConnectionRefusedError")), got
        # Only that host, only that port, and its ssh sessions still work.
        assert connect_from(netns_hosts, "hostB", netns_hosts.gateway, gateway.port) == "connected hello"
        assert connect_from(netns_hosts, "hostA", netns_hosts.addresses["hostB"], 22).startswith("connected SSH-2.0")
    assert gateway.peers == [netns_hosts.addresses["hostB"]]
    assert connect_from(netns_hosts, "hostA", netns_hosts.gateway, gateway.port) == "connected hello"


@pytest.mark.timeout(60)
def test_block_tcp_to_an_address_blocks_every_port(netns_hosts):
    b = netns_hosts.addresses["hostB"]
    with netns_hosts.block_tcp("hostA", to=b, how="reject"):
        assert connect_from(netns_hosts, "hostA", b, 22).startswith("failed ConnectionRefusedError")
        assert connect_from(netns_hosts, "hostA", netns_hosts.addresses["hostA"], 22).startswith("connected SSH-2.0")
    assert connect_from(netns_hosts, "hostA", b, 22).startswith("connected SSH-2.0")


@pytest.mark.timeout(60)
def test_host_down_refuses_ssh_at_once(hosts):
    done = subprocess.run(hosts.ssh_args("hostDown") + ["true"], capture_output=True, text=True, timeout=20)
    assert done.returncode == 255 and "Connection refused" in done.stderr, done.stderr
