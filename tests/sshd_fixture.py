"""Real sshd servers on loopback addresses, for the SSH tests.

``sshd_hosts`` (session scope) starts one ``sshd`` on 127.0.0.2 and one on
127.0.0.3, each on a free port, with host and user keys generated in a temp
folder, and writes an ssh client config that names them ``hostA`` and
``hostB``.  It also names ``hostDown``: 127.0.0.4 on a port nothing listens
on.  The servers are stopped at the end of the session.

Needs the ``openssh-server`` and ``openssh-client`` packages and root (sshd
drops privileges per connection, and the tests log in as root).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
HAVE_SSH = bool(SSHD and shutil.which("ssh") and shutil.which("ssh-keygen"))
SKIP_REASON = "needs OpenSSH (apt-get install openssh-server openssh-client) and root"

HOSTS = {"hostA": "127.0.0.2", "hostB": "127.0.0.3"}
DOWN = ("hostDown", "127.0.0.4")

# Keep the per-test leak token out of the daemons: only processes a test
# starts should carry it.
TOKEN = "JAXRUN_TEST_TOKEN"


@dataclasses.dataclass
class SshdHosts:
    config: Path  # ssh client config naming hostA, hostB and hostDown
    folder: Path
    servers: dict[str, subprocess.Popen]
    ports: dict[str, int]


def free_port(address: str) -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def wait_listening(address: str, port: int, server: subprocess.Popen, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"sshd on {address}:{port} exited: {server.stderr.read().decode()}")
        try:
            with socket.create_connection((address, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on {address}:{port} did not start")


def sshd_config(folder: Path, address: str, port: int, host_key: Path, authorized: Path) -> Path:
    path = folder / f"sshd_config.{address}"
    path.write_text(
        f"ListenAddress {address}:{port}\n"
        f"HostKey {host_key}\n"
        f"AuthorizedKeysFile {authorized}\n"
        f"PidFile {folder}/sshd.{address}.pid\n"
        "PermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "StrictModes no\n"
        "MaxSessions 30\n"
        "MaxStartups 50\n"
        "LogLevel ERROR\n"
    )
    return path


def client_config(folder: Path, key: Path, ports: dict[str, int], down_port: int) -> Path:
    entries = dict(HOSTS)
    entries[DOWN[0]] = DOWN[1]
    lines = []
    for name, address in entries.items():
        lines += [
            f"Host {name}",
            f"  HostName {address}",
            f"  Port {ports.get(name, down_port)}",
            "  User root",
            f"  IdentityFile {key}",
            "  IdentitiesOnly yes",
            "  StrictHostKeyChecking no",
            "  UserKnownHostsFile /dev/null",
            "  LogLevel ERROR",
            "",
        ]
    path = folder / "ssh_config"
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="session")
def sshd_hosts(tmp_path_factory):
    if not HAVE_SSH or os.geteuid() != 0:
        pytest.skip(SKIP_REASON)
    folder = tmp_path_factory.mktemp("sshd")
    keygen(folder / "host_key")
    keygen(folder / "user_key")
    authorized = folder / "authorized_keys"
    authorized.write_text((folder / "user_key.pub").read_text())
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege-separation folder
    env = {k: v for k, v in os.environ.items() if k != TOKEN}
    servers: dict[str, subprocess.Popen] = {}
    ports: dict[str, int] = {}
    try:
        for name, address in HOSTS.items():
            port = free_port(address)
            config = sshd_config(folder, address, port, folder / "host_key", authorized)
            servers[name] = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(config)], env=env, stderr=subprocess.PIPE, start_new_session=True
            )
            ports[name] = port
            wait_listening(address, port, servers[name])
        config = client_config(folder, folder / "user_key", ports, free_port(DOWN[1]))
        yield SshdHosts(config, folder, servers, ports)
    finally:
        for server in servers.values():
            server.terminate()
            try:
                server.wait(5)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
