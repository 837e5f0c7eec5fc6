"""Over SSH, what a host keeps to itself: its own /tmp, its own processes.

The error record of a failed remote process must come home over the session
(a path of the launching machine means nothing on a host), and the values
given with ``--env`` must never appear on a command line, where any local
user's ``ps`` reads them.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
import xml.etree.ElementTree as ET

import psutil
import pytest
from fixtures.jobs import ROOT, TOKEN


@pytest.fixture
def launch(start_job):
    return start_job  # SSH runs never use the preloading fork server: one mode


def ssh_flags(hosts) -> list:
    return ["--ssh-config", hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN]


def script_dir(request, tmp_path):
    """A folder every host sees at the same path (a shared home)."""
    try:
        return request.getfixturevalue("shared_dir")
    except pytest.FixtureLookupError:
        return tmp_path


FAILS_ON_1 = """\
import os, time
if os.environ["JAXRUN_PROCESS_ID"] == "1":
    raise ValueError("bad shard 7")
time.sleep(30)
"""


# Where the servers forward, each host's processes run over channels of its
# connection; where they refuse, over a session each: both ways are checked.
BOTH_WAYS = pytest.mark.parametrize("fixture", ["sshd_hosts", "sshd_hosts_without_forwarding"])


@pytest.mark.timeout(90)
@BOTH_WAYS
def test_a_remote_exception_comes_home(launch, tmp_path, request, fixture):
    ssh_hosts = request.getfixturevalue(fixture)
    first, second = ssh_hosts.addresses
    folder = script_dir(request, tmp_path)
    script = folder / "fails.py"
    script.write_text(FAILS_ON_1)
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    job = launch("-H", f"{first},{second}", *ssh_flags(ssh_hosts), "--log-dir", tmp_path / "logs",
                 "--report", report, "--junit-xml", junit, script)
    assert job.wait(60) == 1, job.stderr[-3000:]
    assert f"jaxrun: process 1 on {second} failed first: exit code 1" in job.stderr
    assert "jaxrun:   ValueError: bad shard 7" in job.stderr
    root = json.loads(report.read_text())["attempts"][-1]["root_cause"]
    assert root["exception"]["type"] == "ValueError" and root["exception"]["message"] == "bad shard 7"
    failure = ET.parse(junit).getroot().find(".//testcase[@name='process 1']/failure")
    assert failure is not None and "ValueError: bad shard 7" in failure.get("message", "")
    # The trailer that carried the record is not in the log.
    assert b"jaxrun-error-record" not in (tmp_path / "logs" / "process-1.stderr").read_bytes()


READS_TOKEN = """\
import os, sys, time
print("token", os.environ["API_TOKEN"], os.environ["GIVEN_TOKEN"], flush=True)
time.sleep(float(sys.argv[1]))
"""


def is_ours(info: dict, ours: int | None) -> bool:
    """The user's own jaxrun command, or a fork of it that has yet to exec
    what jaxrun starts (its memory, so its command line, is still jaxrun's)."""
    return ours is not None and (info["pid"] == ours or info["ppid"] == ours and is_fork_of(info["cmdline"], ours))


def is_fork_of(cmdline: list[str] | None, pid: int) -> bool:
    try:
        return cmdline == psutil.Process(pid).cmdline()
    except psutil.Error:
        return False


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fixture", ["sshd_hosts", "sshd_hosts_without_forwarding"])
def test_env_values_never_appear_on_a_command_line(launch, tmp_path, request, fixture):
    """With ``-x API_TOKEN`` no command line on the machine holds the value;
    with ``--env GIVEN_TOKEN=...`` only the user's own jaxrun command does.
    One job gives both."""
    ssh_hosts = request.getfixturevalue(fixture)
    first, second = ssh_hosts.addresses
    folder = script_dir(request, tmp_path)
    script = folder / "token.py"
    script.write_text(READS_TOKEN)
    secret, given = f"tok-{uuid.uuid4().hex}", f"given-{uuid.uuid4().hex}"
    job = launch("-H", f"{first}:2,{second}:2", *ssh_flags(ssh_hosts), "-x", "API_TOKEN",
                 "--env", f"GIVEN_TOKEN={given}", "--log-dir", tmp_path / "logs", script, "3.5",
                 env={"API_TOKEN": secret})
    ours = job.proc.pid
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(line.decode() for line in job.proc.stdout), daemon=True)
    reader.start()

    def leaks() -> list:
        found = []
        for proc in psutil.process_iter(["pid", "ppid", "cmdline"]):
            words = proc.info["cmdline"] or []
            if any(secret in word for word in words) or \
                    not is_ours(proc.info, ours) and any(given in word for word in words):
                found.append((proc.info["pid"], words))
        return found

    deadline = time.monotonic() + 40
    scans = 0
    while time.monotonic() < deadline and sum("token" in line for line in seen) < 4:
        scans += 1
        assert not leaks()
        time.sleep(0.05)
    # The scan ran while every process was up (they print, then sleep 3.5 s).
    for _ in range(20):
        assert not leaks()
        time.sleep(0.1)
    assert job.proc.wait(60) == 0, job.proc.stderr.read().decode(errors="replace")[-3000:]  # jaxrun's own lines
    reader.join(5)
    assert sorted(line.split("] ")[1].strip() for line in seen if "token" in line) == [f"token {secret} {given}"] * 4
    assert scans > 0


MAIN = """\
import os
import helper
print("sum", helper.total(), sorted(os.listdir(".")), flush=True)
"""


def local_only_project(tmp_path):
    """A project under the launching machine's own /tmp: no host has it."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "main.py").write_text(MAIN)
    (project / "helper.py").write_text("def total():\n    return 42\n")
    (project / ".git").mkdir()  # never copied
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    return project


@pytest.mark.timeout(90)
def test_a_script_only_here_is_refused_without_sync(sshd_hosts, launch, tmp_path):
    project = local_only_project(tmp_path)
    job = launch("-H", "hostA,hostB", *ssh_flags(sshd_hosts), "--log-dir", tmp_path / "logs", "main.py",
                 cwd=project)
    t0 = time.monotonic()
    assert job.wait(60) == 2, job.stderr[-3000:]
    # Refused by the preflight, before anything starts: 1 s here; 20 s
    # holds the hosts' checks on a loaded 2-core machine.
    assert time.monotonic() - t0 < 20
    line = job.stderr.strip().splitlines()
    assert len(line) == 1 and line[0].startswith("jaxrun: error: hostA: ")
    # The folder itself is missing there (a folder that exists without the script is named the same way).
    assert str(project) in line[0] and "hostB" in line[0]
    assert not (tmp_path / "logs").exists()


def path_without_rsync(tmp_path) -> str:
    """A PATH with the tools --sync may use here, but no rsync: the tar way."""
    import shutil

    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("ssh", "tar", "git", "true"):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    return str(folder)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("way", ["rsync", "tar"])
def test_sync_copies_the_working_directory(sshd_hosts, launch, tmp_path, way):
    import shutil

    if way == "rsync" and not shutil.which("rsync"):
        pytest.skip("rsync is not installed here (apt-get install rsync)")
    project = local_only_project(tmp_path)
    env = {"PATH": path_without_rsync(tmp_path)} if way == "tar" else None
    job = launch("-H", "hostA,hostB", *ssh_flags(sshd_hosts), "--sync", "--log-dir", tmp_path / "logs", "main.py",
                 cwd=project, env=env)
    assert job.wait(90) == 0, job.stderr[-3000:]
    # A sibling module imports; .git stayed behind; the sync marker is gone everywhere.
    want = "sum 42 ['__pycache__', 'helper.py', 'main.py']"
    assert sorted(line for line in job.stdout.splitlines() if "sum" in line) == [f"[0] {want}", f"[1] {want}"]
    assert not [p for p in os.listdir(project) if p.startswith(".jaxrun-sync")]


PARENT = """\
import os
with open(f"/proc/{os.getppid()}/cmdline", "rb") as f:
    parent = f.read().split(b"\\0")
words = b" ".join(w for w in parent if w).decode().split()
print("parent", " ".join(words[1:3]), os.getcwd() == os.environ["EXPECT_CWD"], flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode, parent", [("preload", "-m jaxrun.backends.forkserver.server"),
                                          ("no-preload", "-m jaxrun.backends.ssh.host_agent")])
def test_each_host_forks_its_processes_from_one_preloaded_server(sshd_hosts, launch, tmp_path, request,
                                                                 mode, parent):
    folder = script_dir(request, tmp_path)
    script = folder / "parent.py"
    script.write_text(PARENT)
    job = launch("-H", "hostA:2,hostB:2", *ssh_flags(sshd_hosts), f"--{mode}", "-x", f"EXPECT_CWD={folder}",
                 "--log-dir", tmp_path / "logs", script, cwd=folder)
    assert job.wait(90) == 0, job.stderr[-3000:]
    lines = sorted(line.split("] ", 1)[1] for line in job.stdout.splitlines() if "parent" in line)
    assert lines == [f"parent {parent} True"] * 4


# -- scale: 8 hosts x 2 slots ------------------------------------------------------------

@pytest.fixture(scope="module")
def eight_hosts():
    """Eight namespaced sshd hosts (127.0.0.10-17), each with its own /tmp and hostname."""
    from fixtures import sshd

    sshd.require_hosts()
    plans = [sshd.HostPlan(f"node{i}", f"127.0.0.{10 + i}", sshd.free_port(f"127.0.0.{10 + i}"), f"node-{i}",
                           hostname_address=f"127.0.0.{10 + i}") for i in range(8)]
    with sshd.running_hosts(plans, ("nodeDown", "127.0.0.9", sshd.free_port("127.0.0.9"))) as hosts:
        yield hosts


SIXTEEN = """\
import os, sys, time
import jax
jax.devices()  # joins the job: all 16 are in
rank = int(os.environ["JAXRUN_PROCESS_ID"])
print("ready", rank, os.environ["JAXRUN_LOCAL_PROCESS_ID"], flush=True)
if rank == 13:
    time.sleep(1)
    sys.exit(3)
time.sleep(120)
"""


@pytest.mark.timeout(180)
def test_sixteen_processes_on_eight_hosts_start_and_fail_fast(eight_hosts, launch, tmp_path, request):
    folder = script_dir(request, tmp_path)
    script = folder / "sixteen.py"
    script.write_text(SIXTEEN)
    hosts = ",".join(f"node{i}:2" for i in range(8))
    t0 = time.monotonic()
    job = launch("-H", hosts, *ssh_flags(eight_hosts), "--cpu-devices", "1", "--log-dir", tmp_path / "logs", script)
    assert job.wait(150) == 3, job.stderr[-3000:]
    took = time.monotonic() - t0
    ready = sorted(line.split("] ", 1)[1] for line in job.stdout.splitlines() if "ready" in line)
    assert ready == sorted(f"ready {r} {r % 2}" for r in range(16)), job.stdout[-3000:]
    assert "jaxrun: process 13 on node6 failed first: exit code 3" in job.stderr
    assert "jaxrun: processes 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15 stopped by jaxrun" in job.stderr
    print(f"16 processes on 8 hosts: started, failed fast and ended in {took:.1f} s")
