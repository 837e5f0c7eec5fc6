"""The portability layer: Linux-only facilities stay inside jaxrun/portable/,
each one has a portable answer, and the fork server's framing needs none.

The source check parses every module of the package and fails on a use of a
Linux-only name, a platform check, a /proc or /sys path or an abstract socket
name outside the ``jaxrun/portable/`` package (any module of it); the check
itself is tested on snippets, so that it cannot quietly stop finding them.
"""

from __future__ import annotations

import ast
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from jaxrun import contract, portable
from jaxrun.wire import encoding, forkserver

LAYER = Path(portable.__file__).parent  # the package jaxrun/portable/, every module of it
PACKAGE = LAYER.parent

# Names that only Linux has (or that mean something else elsewhere), each
# with where its portable answer lives.
LINUX_ONLY = {
    "SOCK_SEQPACKET": "frame over SOCK_STREAM (wire.encoding.send_frame)",
    "SO_PEERCRED": "portable.peer_uid / peer_pid",
    "LOCAL_PEERCRED": "portable.peer_uid",
    "LOCAL_PEERPID": "portable.peer_pid",
    "SO_PASSCRED": "portable.peer_uid",
    "SCM_CREDENTIALS": "portable.peer_uid",
    "F_SETPIPE_SZ": "portable.set_pipe_size",
    "F_GETPIPE_SZ": "portable.set_pipe_size",
    "prctl": "portable.claim_orphans",
    "PR_SET_CHILD_SUBREAPER": "portable.claim_orphans",
    "PR_SET_PDEATHSIG": "a lifeline pipe",
    "inotify_init": "portable.inotify",
    "inotify_init1": "portable.inotify",
    "inotify_add_watch": "portable.inotify",
    "inotify_rm_watch": "portable.inotify",
    "setpriority": "portable.lower_thread_priority",
    "CDLL": "the layer (what the C library offers differs between systems)",
    "cdll": "the layer (what the C library offers differs between systems)",
    "epoll": "selectors",
    "pidfd_open": "the layer",
    "pidfd_send_signal": "the layer",
    "memfd_create": "the layer",
    "eventfd": "the layer",
    "sched_getaffinity": "the layer",
    "sched_setaffinity": "the layer",
    "pipe2": "os.pipe",
    "splice": "the layer",
    "copy_file_range": "the layer",
    "posix_fadvise": "the layer",
    "O_PATH": "the layer",
    "O_TMPFILE": "the layer",
    "SOCK_CLOEXEC": "socket.socket (its descriptors are not inheritable)",
    "SOCK_NONBLOCK": "setblocking(False)",
    "getxattr": "the layer",
    "setxattr": "the layer",
}
# module.attribute pairs that ask which system this is.
PLATFORM_CHECKS = {("sys", "platform"), ("os", "uname"), ("platform", "system"), ("platform", "uname"),
                   ("platform", "mac_ver"), ("platform", "libc_ver"), ("platform", "platform"),
                   ("platform", "release")}
LINUX_PATHS = ("/proc", "/sys/")

# Known uses outside the layer, each with its reason; the test fails when one
# disappears too, so that this list never outlives its entries.
KNOWN: set = set()


def linux_only_uses(source: str) -> list[str]:
    """What in ``source`` is Linux-only or asks for the platform, one line each."""
    tree = ast.parse(source)
    bare_strings = {id(node.value) for node in ast.walk(tree)
                    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}  # docstrings
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            if isinstance(node.value, ast.Name) and (node.value.id, node.attr) in PLATFORM_CHECKS:
                found.append(f"platform check {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                names.append(alias.name)
                if (node.module, alias.name) in PLATFORM_CHECKS:
                    found.append(f"platform check {node.module}.{alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in bare_strings:
            names.append(node.value)  # getattr(socket, "SO_PEERCRED")
            if node.value.startswith(LINUX_PATHS):
                found.append(f"path {node.value!r}")
            elif node.value.startswith("\0") and len(node.value) > 1:
                found.append("abstract socket name")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and _starts_with_nul(node.left):
            found.append("abstract socket name")
        elif isinstance(node, ast.JoinedStr) and node.values and _starts_with_nul(node.values[0]):
            found.append("abstract socket name")
        found += [f"Linux-only {name} (use {LINUX_ONLY[name]})" for name in names if name in LINUX_ONLY]
    return found


def _starts_with_nul(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("\0")


def in_the_layer(path: Path) -> bool:
    return path.is_relative_to(LAYER)


def test_no_module_outside_the_layer_uses_a_linux_only_facility():
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        if in_the_layer(path):
            continue
        rel = path.relative_to(PACKAGE.parent).as_posix()
        found |= {(rel, use) for use in linux_only_uses(path.read_text())}
    assert found - KNOWN == set(), "Linux-only code outside jaxrun/portable/"
    assert KNOWN - found == set(), "KNOWN lists a use that is gone: remove it"


def test_the_layer_is_every_module_of_the_package_and_nothing_beside_it():
    assert in_the_layer(LAYER / "__init__.py") and in_the_layer(LAYER / "sockets.py")
    assert not any(in_the_layer(PACKAGE / rel) for rel in ("portable.py", "portable_more.py", "core/portable.py"))
    # What the check bans is really there, each in a module of the layer: the exemption hides something.
    uses = {path.name: linux_only_uses(path.read_text()) for path in LAYER.glob("*.py")}
    assert all(uses[name] for name in ("processes.py", "sockets.py", "files.py", "threads.py", "memory.py")), uses


@pytest.mark.parametrize("snippet, what", [
    ("s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)", "SOCK_SEQPACKET"),
    ("from socket import SO_PEERCRED", "SO_PEERCRED"),
    ("opt = getattr(socket, 'SO_PEERCRED')", "SO_PEERCRED"),
    ("fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)", "F_SETPIPE_SZ"),
    ("libc = ctypes.CDLL(None)\nlibc.prctl(36, 1, 0, 0, 0)", "prctl"),
    ("fd = libc.inotify_init1(0)", "inotify_init1"),
    ("os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)", "setpriority"),
    ("if sys.platform == 'darwin':\n    pass", "platform check sys.platform"),
    ("from sys import platform", "platform check sys.platform"),
    ("if platform.system() == 'Linux':\n    pass", "platform check platform.system"),
    ("open(f'/proc/{pid}/fd')", "path '/proc/'"),
    ("open('/proc/sys/kernel/pid_max')", "path '/proc/sys/kernel/pid_max'"),
    ("sock.bind('\\0' + name)", "abstract socket name"),
    ("sock.connect(f'\\0{name}')", "abstract socket name"),
    ("sock.bind('\\0jaxrun')", "abstract socket name"),
])
def test_the_source_check_finds(snippet, what):
    assert any(what in use for use in linux_only_uses(snippet)), linux_only_uses(snippet)


@pytest.mark.parametrize("snippet", [
    '"""Reads /proc/PID/environ, says sys.platform, binds "\\0name"."""',
    "names = '\\0'.join(files)",
    "socket.send_fds(sock, [data], fds)",
    "os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)",
    "info = platform.node()",
])
def test_the_source_check_leaves_alone(snippet):
    assert linux_only_uses(snippet) == []


# -- forced: every answer is the portable one -----------------------------------------

@pytest.fixture
def forced(monkeypatch):
    monkeypatch.setenv(contract.PORTABLE, "1")


@pytest.mark.parametrize("value, on", [("1", True), ("yes", True), ("0", False), ("", False)])
def test_the_switch(monkeypatch, value, on):
    monkeypatch.setenv(contract.PORTABLE, value)
    assert portable.probe.forced() is on


def test_forced_every_facility_is_off(forced):
    r, w = os.pipe()
    a, b = socket.socketpair()
    try:
        assert portable.inotify() is None
        assert portable.set_pipe_size(w, 1 << 20) is False
        assert portable.threads.thread_ids_are_pids() is False
        assert portable.lower_thread_priority(19) is False
        assert portable.peer_uid(a) is None and portable.peer_pid(a) is None
        assert portable.open_file_ids(os.getpid()) is None
        assert portable.thread_cpu() is None
        assert portable.pid_max() == 32768
        assert portable.sockets.ephemeral_low() == 32768 and portable.free_port() < 32768
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def test_forced_notes_name_each_missing_facility(forced):
    notes = portable.notes()
    assert notes[0] == f"jaxrun: {contract.PORTABLE} is set: every Linux-only facility is off"
    for what in ("no inotify", "no per-thread priority", "pipes cannot be enlarged"):
        assert sum(what in line for line in notes) == 1, notes
    assert all(line.startswith("jaxrun: ") for line in notes)


@pytest.fixture
def short_tmp(monkeypatch):
    """A temporary folder short enough for a socket path (pytest's are long)."""
    folder = tempfile.mkdtemp(prefix="jr-", dir="/tmp")
    monkeypatch.setattr("tempfile.tempdir", folder)
    yield Path(folder)
    shutil.rmtree(folder)


def test_forced_the_hosts_server_uses_a_socket_file_in_a_private_folder(forced, short_tmp):
    tmp_path = short_tmp
    address = portable.server_address("jaxrun-123-" + "f" * 32)
    assert not portable.is_abstract(address)
    folder = os.path.dirname(address)
    assert folder == str(tmp_path / f"jaxrun-sockets-{os.getuid()}")
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert len(address) <= portable.sockets.LONGEST_SOCKET_PATH
    assert portable.server_address("jaxrun-123-" + "f" * 32) == address  # the agents find it by the name alone
    assert portable.server_address("another") != address


def _in_a_random_folder(address: str, base: str) -> None:
    """A socket in this user's folder of a random name beside the usual one:
    0700, this user's, not a link (lstat)."""
    folder = os.path.dirname(address)
    assert os.path.dirname(folder) == base
    assert os.path.basename(folder).startswith(f"jaxrun-sockets-{os.getuid()}-")
    st = os.lstat(folder)
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o777 == 0o700
    assert len(address) <= portable.sockets.LONGEST_SOCKET_PATH


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701])
def test_a_socket_folder_others_can_enter_is_left_for_one_of_a_random_name(forced, short_tmp, mode):
    folder = short_tmp / f"jaxrun-sockets-{os.getuid()}"
    folder.mkdir()
    folder.chmod(mode)
    address = portable.server_address("name")
    _in_a_random_folder(address, str(short_tmp))
    assert portable.server_address("name") == address  # the agents find it by the name alone
    assert folder.stat().st_mode & 0o777 == mode  # never repaired


def test_a_symlink_for_the_socket_folder_is_left_for_one_of_a_random_name(forced, short_tmp):
    (short_tmp / "elsewhere").mkdir(mode=0o700)
    (short_tmp / f"jaxrun-sockets-{os.getuid()}").symlink_to(short_tmp / "elsewhere")
    _in_a_random_folder(portable.server_address("name"), str(short_tmp))
    assert os.listdir(short_tmp / "elsewhere") == []


def test_a_long_tmpdir_moves_the_socket_folder_to_tmp(forced, tmp_path, monkeypatch):
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(deep))
    address = portable.server_address("name")
    assert os.path.dirname(os.path.dirname(address)) == "/tmp"
    assert os.path.basename(os.path.dirname(address)).startswith(f"jaxrun-sockets-{os.getuid()}")


def test_the_runtime_folder_is_preferred_where_the_system_has_one(short_tmp, monkeypatch):
    runtime = short_tmp / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert portable.sockets.socket_folder() == (str(runtime / "jaxrun"), None)
    assert os.lstat(runtime / "jaxrun").st_mode & 0o777 == 0o700
    assert portable.sockets.socket_folders()[0] == str(runtime / "jaxrun")
    runtime.chmod(0o755)  # not a runtime folder of this user's alone: not used
    assert portable.sockets.socket_folder()[0] == str(short_tmp / f"jaxrun-sockets-{os.getuid()}")


def test_peer_credentials_where_the_system_has_them():
    """Where a peer's user id is known it is ours; where it is not, no
    abstract name is offered (only a socket file's folder keeps others out)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        uid = portable.peer_uid(a)
        assert uid in (None, os.getuid())
        if uid is None:
            assert not portable.is_abstract(portable.server_address("x") or "")
        pid = portable.peer_pid(a)
        assert pid in (None, os.getpid())
    finally:
        a.close()
        b.close()


# -- the fork server's frames ------------------------------------------------------------

@pytest.fixture
def pair():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield a, b
    a.close()
    b.close()


def test_a_frame_of_any_size_arrives_whole(pair):
    """A SOCK_SEQPACKET datagram stops at about 208 KiB; a frame does not."""
    a, b = pair
    payload = forkserver.ForkRequest(["--", "x.py"], {f"BIG{i}": "x" * 100_000 for i in range(10)}).encode()
    sender = threading.Thread(target=encoding.send_frame, args=(a, payload))
    sender.start()
    frame = encoding.recv_frame(b)
    sender.join()
    assert frame is not None and frame[0] == payload and frame[1] == []
    assert encoding.decode(frame[0]).env["BIG9"] == "x" * 100_000


def test_descriptors_travel_with_their_own_frame(pair, tmp_path):
    a, b = pair
    files = []
    for name in ("one", "two"):
        (tmp_path / name).write_text(name)
        files.append(os.open(tmp_path / name, os.O_RDONLY))
    try:
        encoding.send_frame(a, b"first", [files[0]])
        encoding.send_frame(a, b"second", [files[1]])
        encoding.send_frame(a, b"third")
        got = [encoding.recv_frame(b, max_fds=3) for _ in range(3)]
        assert [g[0] for g in got] == [b"first", b"second", b"third"]
        assert [len(g[1]) for g in got] == [1, 1, 0]
        assert [os.read(g[1][0], 10) for g in got[:2]] == [b"one", b"two"]
        for g in got[:2]:
            os.close(g[1][0])
    finally:
        for fd in files:
            os.close(fd)


def test_the_peer_closing_ends_the_frames(pair):
    a, b = pair
    encoding.send_frame(a, b"whole")
    a.sendall(encoding.FRAME_HEADER.pack(100) + b"only part of it")
    a.close()
    assert encoding.recv_frame(b) == (b"whole", [])
    assert encoding.recv_frame(b) is None  # mid-frame
    assert encoding.recv_frame(b) is None


def test_a_length_no_jaxrun_peer_would_send_is_refused(pair):
    a, b = pair
    a.sendall(b"fork [...]")
    with pytest.raises(encoding.WireError):
        encoding.recv_frame(b)


# -- ports ---------------------------------------------------------------------------

def test_free_port_is_below_the_ephemeral_range():
    """Outgoing connections take their source ports from the ephemeral
    range, so a port chosen there can be gone before its listener binds it
    (the cause of a "Failed to add port" crash in jax's transfer server)."""
    low = portable.sockets.ephemeral_low()
    ports = {portable.free_port("127.0.0.1") for _ in range(20)}
    assert all(10000 <= p < low for p in ports), (low, ports)
    assert len(ports) > 1  # chosen at random, not one fixed port


def test_free_port_skips_a_port_that_is_taken(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        picks = iter([taken, taken])
        monkeypatch.setattr(portable.sockets, "ephemeral_low", lambda: 65000)
        monkeypatch.setattr("random.randrange", lambda a, b: next(picks, 3007))
        port = portable.free_port("127.0.0.1")
    assert port != taken


# -- the reaper without a subreaper --------------------------------------------------------

ORPHAN = """
import os, subprocess, sys
import psutil
from jaxrun import contract
from jaxrun.core import reaper
assert reaper.become_subreaper() is False and os.environ[contract.ORPHAN_MARK]
# A daemon: its own session, its parent gone at once; init's, out of our tree.
subprocess.run([sys.executable, "-c", "import subprocess, sys; subprocess.Popen("
                "[sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)"],
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
assert not psutil.Process().children(recursive=True)
(orphan,) = reaper.marked()
assert reaper.descendants() == {orphan}
assert reaper.kill_descendants() == [orphan[0]]
assert not psutil.pid_exists(orphan[0]) or reaper.ended(psutil.Process(orphan[0]))
print("ok")
"""


def test_without_a_subreaper_the_mark_finds_a_daemon_outside_the_tree(forced):
    done = subprocess.run([sys.executable, "-c", ORPHAN], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr


def test_a_long_tmpdir_keeps_socket_paths_short(monkeypatch, tmp_path):
    from jaxrun.backends.ssh.connections import SSH_SOCKET_ROOM, Connections
    from jaxrun.backends.ssh.options import SshOptions
    from jaxrun.core.spec import Host

    long = tmp_path / ("d" * 90)
    long.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    assert portable.temp_base_for_sockets(SSH_SOCKET_ROOM) == "/tmp"
    with Connections(SshOptions(sys.executable, str(tmp_path)), [Host("hostA")]) as connections:
        # ssh binds the master at its control path plus "." and 16 letters
        assert len(connections.control_path(Host("hostA"))) + 17 <= 100
        assert os.path.dirname(connections.dir) == "/tmp"
    monkeypatch.setattr(tempfile, "tempdir", "/var/tmp")  # a short one is kept
    assert portable.temp_base_for_sockets(SSH_SOCKET_ROOM) == "/var/tmp"


def test_every_name_of_the_layer_loads_its_own_module_when_first_used():
    """The layer's names load lazily (PEP 562): each one listed, each one
    found in the module it names, and the shim's start-up loads only the
    modules it uses."""
    assert set(portable.__all__) == set(portable._WHERE)
    for name, where in portable._WHERE.items():
        module = __import__(f"jaxrun.portable.{where}", fromlist=[name])
        assert getattr(portable, name) is getattr(module, name), name
    assert not set(portable._WHERE) & {path.stem for path in LAYER.glob("*.py")}  # a module's import would hide one
    loaded = subprocess.run([sys.executable, "-c", "import sys; from jaxrun import portable; portable.free_port; "
                             "print(sorted(m for m in sys.modules if m.startswith('jaxrun.portable.')))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['jaxrun.portable.probe', 'jaxrun.portable.sockets']", loaded
