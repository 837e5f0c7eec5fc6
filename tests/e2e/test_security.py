"""The job's coordination service is closed to the machine's other users.

Another user (``nobody``, with an interpreter of its own that has nothing but
jaxlib: root's interpreter lives in a folder it cannot enter) tries every TCP
port the job's processes listen on, and the coordinator's socket file, as the
attack of issue 58 did: register as task 1 and write and read the store.  A
local job serves its coordination service on a Unix socket in the user's 0700
socket folder, so every try is refused and the job ends as it would have.
With ``--coordinator HOST:PORT`` (the user's choice of an open address) the
same try gets through: jaxrun said so at the start, and its summary names the
second registration instead of blaming a process of the job.
"""

import ipaddress
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from fixtures.jobs import DATA, ROOT, TOKEN, processes_with_token

from jaxrun import portable

pytestmark = pytest.mark.timeout(180)

PACKAGES = ("jaxlib", "numpy", "numpy.libs", "ml_dtypes")  # what jaxlib's client imports


def _system_python() -> str | None:
    """An interpreter outside root's home with this one's ABI (jaxlib's wheel)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for path in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.access(path, os.X_OK):
            return path
    return None


@pytest.fixture(scope="module")
def outsider():
    """Run tests/data/outsider.py as ``nobody`` over some addresses: its lines."""
    python = _system_python()
    if os.geteuid() != 0 or shutil.which("runuser") is None or python is None:
        pytest.skip("needs root, runuser and a system python of this version for the other user")
    import jaxlib

    site = Path(jaxlib.__file__).resolve().parents[1]
    home = Path(tempfile.mkdtemp(prefix="jaxrun-outsider-", dir="/tmp"))
    try:
        os.chmod(home, 0o755)
        for name in PACKAGES:
            if (site / name).exists():  # hard links: the same files, in a folder the other user may enter
                shutil.copytree(site / name, home / name, copy_function=_link_or_copy)
        shutil.copy(DATA / "outsider.py", home / "outsider.py")
        os.chmod(home / "outsider.py", 0o644)
        command = ["runuser", "-u", "nobody", "--", "env", f"PYTHONPATH={home}", python]
        probe = subprocess.run([*command, "-c", "import jaxlib._jax"], capture_output=True, text=True, timeout=60)
        if probe.returncode != 0:
            pytest.skip(f"the other user's interpreter cannot import jaxlib: {probe.stderr[-300:]}")

        def attack(addresses: list[str]) -> list[str]:
            done = subprocess.run([*command, str(home / "outsider.py"), *addresses],
                                  capture_output=True, text=True, timeout=120, cwd=home)
            assert done.returncode == 0, done.stderr
            return done.stdout.splitlines()

        yield attack
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def wait_ready(folder: Path, count: int, job, within: float = 90) -> None:
    deadline = time.monotonic() + within
    while len(list(folder.glob("ready-*"))) < count:
        assert job.proc.poll() is None, f"the job ended early: {job.wait()} {job.stderr[-2000:]}"
        assert time.monotonic() < deadline, "the job's processes never said they were ready"
        time.sleep(0.1)


def _reachable(ip: str) -> str:
    """Where another user connects to a listener on ``ip``: a wildcard's
    loopback, an IPv4-mapped address's IPv4 (gRPC listens on those)."""
    addr = ipaddress.ip_address(ip)
    if addr.is_unspecified:
        return "127.0.0.1"
    mapped = getattr(addr, "ipv4_mapped", None)
    return str(mapped or addr)


def listeners(token: str) -> tuple[list[str], list[str]]:
    """(every TCP address the job's processes listen on, every Unix socket file)."""
    tcp, unix = set(), set()
    for proc in processes_with_token(token):
        try:
            for c in proc.net_connections("inet"):
                if c.status == psutil.CONN_LISTEN:
                    host = _reachable(c.laddr.ip)
                    tcp.add(f"[{host}]:{c.laddr.port}" if ":" in host else f"{host}:{c.laddr.port}")
            unix.update(c.laddr for c in proc.net_connections("unix") if c.laddr)  # bound: a path
        except psutil.NoSuchProcess:
            pass
    return sorted(tcp), sorted(unix)


@pytest.mark.both_modes
def test_another_user_reaches_nothing_of_a_local_job(launch, outsider, tmp_path, no_leftover_processes):
    go = tmp_path / "go"
    job = launch("-n", 3, "--cpu-devices", 1, DATA / "guarded_job.py", tmp_path, go)
    try:
        wait_ready(tmp_path, 3, job)
        tcp, unix = listeners(no_leftover_processes)
        service = [path for path in unix if os.path.basename(path).startswith("coordinator-")]
        assert tcp, "the job's collectives listen somewhere"  # Gloo: tried too
        lines = outsider([*tcp, *(f"unix:{path}" for path in service)])
    finally:
        go.write_text("")
    assert job.wait(timeout=90) == 0, job.stderr
    assert len(lines) == len(tcp) + len(service) and all(" refused (exit " in line for line in lines), lines
    for rank in range(3):
        assert f"[{rank}] process {rank} done, allgather [0, 1, 2]" in job.stdout
    assert len(service) == 1, unix  # process 0 served it on a socket file ...
    folder = os.stat(os.path.dirname(service[0]))
    assert folder.st_mode & 0o777 == 0o700 and folder.st_uid == os.getuid()  # ... in a private folder
    assert not os.path.exists(service[0])  # the attempt's end removed its socket file


def test_fixed_coordinator_is_said_to_be_open_and_an_intruder_is_named(launch, outsider, tmp_path,
                                                                       no_leftover_processes):
    address = f"127.0.0.1:{portable.free_port('127.0.0.1')}"
    go = tmp_path / "go"
    job = launch("-n", 3, "--cpu-devices", 1, "--coordinator", address, DATA / "guarded_job.py", tmp_path, go)
    try:
        wait_ready(tmp_path, 3, job)
        tcp, _ = listeners(no_leftover_processes)
        assert address in tcp
        lines = outsider([address])
    finally:
        go.write_text("")
    code = job.wait(timeout=90)
    assert len(lines) == 1, lines  # its own registration fails too, once the service is in error
    assert code != 0, job.stderr  # the service told every process of the job to abort
    err = job.stderr
    opened = [line for line in err.splitlines() if "--coordinator" in line and "open to" in line]
    assert len(opened) == 1, err  # said once, at the start
    assert "task 1 of the job registered a second time with the coordination service" in err, err
    assert "failed first" not in err, err


def namespaced_listeners(token: str) -> tuple[list[str], list[str]]:
    """``listeners`` for processes in network namespaces of their own, which
    psutil cannot list (it reads this process's /proc/net): each process's
    sockets, looked up in its own /proc/PID/net tables."""
    tcp, unix = set(), set()
    for proc in processes_with_token(token):
        try:
            inodes = {os.readlink(f"/proc/{proc.pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{proc.pid}/fd")
                      if os.readlink(f"/proc/{proc.pid}/fd/{fd}").startswith("socket:[")}
            for table, size in (("tcp", 4), ("tcp6", 16)):
                for row in Path(f"/proc/{proc.pid}/net/{table}").read_text().splitlines()[1:]:
                    cells = row.split()
                    if cells[3] == "0A" and cells[9] in inodes:  # LISTEN, one of its own
                        ip_hex, port_hex = cells[1].split(":")
                        raw = bytes.fromhex(ip_hex)
                        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, size, 4))  # host-order words
                        host = _reachable(str(ipaddress.ip_address(raw)))
                        tcp.add(f"[{host}]:{int(port_hex, 16)}" if ":" in host else f"{host}:{int(port_hex, 16)}")
            for row in Path(f"/proc/{proc.pid}/net/unix").read_text().splitlines()[1:]:
                cells = row.split()
                if len(cells) > 7 and cells[6] in inodes:
                    unix.add(cells[7])
        except (OSError, psutil.NoSuchProcess):
            pass
    return sorted(tcp), sorted(unix)


def test_another_user_reaches_nothing_of_a_job_over_ssh(start_job, outsider, netns_hosts, shared_dir, tmp_path,
                                                        no_leftover_processes):
    """Two hosts in network namespaces of their own: the outsider, on the
    launching machine, reaches each host's network, and tries every TCP port
    any process of the job listens on, process 0's first.  None is the
    coordination service: it is a Unix socket in a private folder on hostA,
    which the launcher's SSH connections forward to hostB."""
    script = shared_dir / "guarded_job.py"
    script.write_bytes((DATA / "guarded_job.py").read_bytes())
    go = shared_dir / "go"
    job = start_job("-H", "hostA:2,hostB:1", "--ssh-config", netns_hosts.config, "-x", f"PYTHONPATH={ROOT}",
                    "-x", TOKEN, "--cpu-devices", 1, "-v", "--log-dir", tmp_path / "logs", script, shared_dir, go,
                    cwd=shared_dir)
    try:
        wait_ready(shared_dir, 3, job)
        tcp, unix = namespaced_listeners(no_leftover_processes)
        first = netns_hosts.addresses["hostA"]
        assert any(address.startswith(f"{first}:") for address in tcp), tcp  # process 0's Gloo: tried too
        assert not any(address.startswith("127.") for address in tcp), tcp  # every listener on the routed address
        lines = outsider(tcp)
    finally:
        go.write_text("")
    assert job.wait(timeout=90) == 0, job.stderr
    assert len(lines) == len(tcp) and all(" refused (exit " in line for line in lines), lines
    for rank in range(3):
        assert f"process {rank} done, allgather [0, 1, 2]" in job.stdout
    said = [line for line in job.stderr.splitlines() if "coordination service: unix:" in line]
    assert len(said) == 1 and "on hostA, forwarded to hostB over their SSH connections" in said[0], job.stderr
    service = [path for path in unix if os.path.basename(path).startswith("coordinator-")]
    # Process 0 served it on a socket file in its host agent's private folder
    # (hostB's end is sshd's, which carries no token).
    assert len(service) == 1 and service[0].startswith("/tmp/jaxrun-host-"), unix
    assert service[0].endswith(f"@{first}.sock"), service  # the route the processes' own listeners take
