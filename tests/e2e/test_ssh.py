"""Multi-host runs over real SSH: two sshd servers on 127.0.0.2 and 127.0.0.3.

sshd gives each session a fresh environment, so every run forwards PYTHONPATH
(this checkout's jaxrun) and the leak guard's token explicitly.  Each host
has a private /tmp (``fixtures.sshd``), so a script every host must run lives
in ``shared_dir``, seen at the same path everywhere; logs, reports and hosts
files, which only jaxrun reads, stay in ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from fixtures.engines import check_logs_hold_every_byte
from fixtures.jobs import ROOT, TOKEN, check_resources, is_running, joins_said, processes_with_token, wait_gone

TOY = ROOT / "examples" / "toy.py"
RESULT = "got result: -0.12398731708526611"

READY_SCRIPT = """\
import os, sys, time
import jax
jax.devices()  # the first device use joins the job: process 0's coordinator is up
print("ready", os.environ["JAXRUN_PROCESS_ID"], os.environ["JAXRUN_COORDINATOR_ADDRESS"], flush=True)
time.sleep(120)
"""


@pytest.fixture
def launch(start_job):
    """Overrides the shared ``launch``, which runs every test once per launch
    mode: SSH runs never use the preloading fork server."""
    return start_job


def ssh_flags(hosts) -> list[str]:
    return ["--ssh-config", hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def wait_for_lines(job, needle: str, count: int, within: float = 30.0) -> list[str]:
    """Read the job's stdout until `count` lines contain `needle`."""
    seen: list[str] = []
    done = threading.Event()

    def read() -> None:
        for raw in job.proc.stdout:
            seen.append(raw.decode(errors="replace"))
            if sum(needle in line for line in seen) >= count:
                done.set()
                return

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(within), f"only saw {seen}"
    return seen


# -- real sshd ---------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("fixture, way", [("sshd_hosts", "channels of its connection"),
                                          ("sshd_hosts_without_forwarding", "a session each")])
def test_toy_on_two_hosts(request, jaxrun, tmp_path, fixture, way):
    """Where the servers forward Unix sockets, each host's processes run over
    channels of its one connection; where they refuse, over a session each."""
    ssh_hosts = request.getfixturevalue(fixture)
    (first, first_address), (second, second_address) = ssh_hosts.addresses.items()
    hosts = write(tmp_path, "hosts.txt", f"# two hosts\n{first} slots=2\n{second} slots=2\n")
    logs, report = tmp_path / "logs", tmp_path / "report.json"
    code, out, err = jaxrun(
        "--hosts", hosts, *ssh_flags(ssh_hosts), "--cpu-devices", "2", "--log-dir", logs, "--report", report, "-v", TOY,
        cwd=ROOT
    )
    assert code == 0, err
    assert f"jaxrun: {first}: processes run over {way}" in err and f"jaxrun: {second}: processes run over {way}" in err
    check_resources(report, 4)  # measured on each host, home with the stream's trailer
    for rank, devices in enumerate([(0, 1), (2048, 2049), (4096, 4097), (6144, 6145)]):
        log = (logs / f"process-{rank}.stdout").read_text()
        assert f"process={rank} {RESULT}" in log
        for device in devices:
            assert f"device cpu:{device} has local data" in log
        assert f"[{rank}] process={rank} {RESULT}" in out
    assert "device cpu:0 has local data [[0 1 2 3]]" in out
    # Each host's agent reported its controller's join with a marker on
    # stderr, which jaxrun cut out: the joins heard, no marker in a log.
    joins_said(err, logs, 4)
    for rank in range(4):
        assert b"jaxrun-joined" not in (logs / f"process-{rank}.stderr").read_bytes()
    # -v shows the preflight table, one row per host.
    assert f"{first}  {first_address}" in err and f"{second}  {second_address}" in err


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fixture", ["sshd_hosts", "sshd_hosts_without_forwarding"])
def test_two_processes_per_host_get_their_local_ids_and_own_pids(request, jaxrun, tmp_path, shared_dir, fixture):
    """With 2 slots on each of 2 hosts, process 2 is the first on its host:
    {local_process_id} and JAXRUN_LOCAL_PROCESS_ID say 0 there, not 2; and
    the report gives each process the pid of its own controller."""
    hosts = request.getfixturevalue(fixture)
    first, second = hosts.addresses
    script = write(shared_dir, "ids.py", "import os, sys\n"
                   "print('ids', sys.argv[1], sys.argv[2], os.environ['JAXRUN_LOCAL_PROCESS_ID'],"
                   " os.environ['JAXRUN_LOCAL_PROCESS_COUNT'], os.getpid())\n")
    report = tmp_path / "r.json"
    code, out, err = jaxrun("-H", f"{first}:2,{second}:2", *ssh_flags(hosts), "--log-dir", tmp_path / "logs",
                            "--report", report, script, "{process_id}", "{local_process_id}", cwd=shared_dir)
    assert code == 0, err
    seen = {int(w[2]): w[3:] for w in (line.split() for line in out.splitlines()) if w[1:2] == ["ids"]}
    assert {r: s[:3] for r, s in seen.items()} == {0: ["0", "0", "2"], 1: ["1", "1", "2"], 2: ["0", "0", "2"],
                                                  3: ["1", "1", "2"]}, out
    processes = json.loads(report.read_text())["processes"]
    assert [p["local_process_id"] for p in processes] == [0, 1, 0, 1]
    assert [p["pid"] for p in processes] == [int(seen[r][3]) for r in range(4)], (processes, out)


@pytest.mark.timeout(60)
def test_down_host_is_named_and_nothing_runs(sshd_hosts, jaxrun, tmp_path, shared_dir):
    marker = shared_dir / "ran"
    script = write(shared_dir, "mark.py", f"open({str(marker)!r}, 'a').write('x')\n")
    hosts = write(tmp_path, "hosts.txt", "hostA\nhostDown\n")
    start = time.monotonic()
    code, _, err = jaxrun(
        "--hosts", hosts, *ssh_flags(sshd_hosts), "--connect-timeout", "5", "--log-dir", tmp_path / "logs", script,
        cwd=shared_dir,
    )
    assert code == 2
    # A refused connection is known at once (1 s here, the other host's
    # check included), well before --connect-timeout; 15 s holds a loaded
    # machine.
    assert time.monotonic() - start < 15
    line = err.strip().splitlines()[-1]
    assert line.startswith("jaxrun: error: hostDown: ssh failed:") and "Connection refused" in line, err
    assert "hostA" not in line
    assert not marker.exists()


@pytest.mark.timeout(60)
def test_missing_interpreter_is_named(sshd_hosts, jaxrun, tmp_path, shared_dir):
    script = write(shared_dir, "s.py", "print('never')\n")
    code, out, err = jaxrun("-H", "hostA,hostB", *ssh_flags(sshd_hosts), "--python", "/no/such/python",
                            "--log-dir", tmp_path / "logs", script, cwd=shared_dir)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith("jaxrun: error: hostA: /no/such/python exited with status 127:"), err
    assert "hostB: /no/such/python exited with status 127" in line
    assert "never" not in out


@pytest.mark.timeout(60)
def test_taken_coordinator_port_on_first_host(sshd_hosts, jaxrun, tmp_path, shared_dir):
    import socket

    script = write(shared_dir, "s.py", "print('never')\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.2", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out, err = jaxrun(
            "-H", "hostA,hostB", *ssh_flags(sshd_hosts), "--coordinator", f"127.0.0.2:{port}",
            "--log-dir", tmp_path / "logs", script, cwd=shared_dir,
        )
    assert code == 2
    assert f"jaxrun: error: --coordinator 127.0.0.2:{port}: cannot listen on 127.0.0.2:{port} on hostA" in err
    assert "never" not in out


@pytest.mark.timeout(30)
def test_dry_run_contacts_no_host(jaxrun, tmp_path):
    script = write(tmp_path, "s.py", "print('never')\n")
    code, out, err = jaxrun("-H", "nohost.invalid:2", "--dry-run", "--log-dir", tmp_path / "logs", script,
                            "{process_id}", cwd=tmp_path)
    assert code == 0, err
    assert "process 1 on nohost.invalid:" in out
    assert "JAXRUN_COORDINATOR_ADDRESS=unix:/PRIVATE-FOLDER-ON-nohost.invalid/coordinator-HEX.sock" in out


@pytest.mark.timeout(30)
def test_bad_hosts_file_line(jaxrun, tmp_path):
    script = write(tmp_path, "s.py", "print('never')\n")
    hosts = write(tmp_path, "hosts.txt", "hostA slots=2\n\nhostB slots=lots\n")
    code, out, err = jaxrun("--hosts", hosts, "--log-dir", tmp_path / "logs", script, cwd=tmp_path)
    assert code == 2
    assert err.strip() == f"jaxrun: error: {hosts}:3: slots must be a whole number, got 'lots'"
    assert "never" not in out


@pytest.mark.timeout(30)
def test_more_processes_than_slots(jaxrun, tmp_path):
    script = write(tmp_path, "s.py", "print('never')\n")
    code, _, err = jaxrun("-H", "hostA:1,hostB", "-n", "3", "--log-dir", tmp_path / "logs", script, cwd=tmp_path)
    assert code == 2
    assert "3 processes requested but the hosts have only 2 slots" in err


@pytest.mark.timeout(60)
def test_arguments_and_env_arrive_verbatim(sshd_hosts, jaxrun, tmp_path, shared_dir, monkeypatch):
    script = write(
        shared_dir,
        "show.py",
        "import json, os, sys\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd(),"
        " 'env': {k: os.environ.get(k) for k in ('FROM_ENV', 'FROM_X', 'JAXRUN_PROCESS_ID')}}))\n",
    )
    tricky = ["a b", "it's", '"quoted"', "$HOME", "x;y", "`id`", "*", "{process_id}", ""]
    monkeypatch.setenv("FROM_X", "it's $HOME; `id`")
    logs = tmp_path / "logs"
    code, _, err = jaxrun(
        "-H", "hostA,hostB", *ssh_flags(sshd_hosts), "-x", "FROM_ENV=a b $HOME", "-x", "FROM_X",
        "--log-dir", logs, script, *tricky, cwd=shared_dir,
    )
    assert code == 0, err
    for rank in (0, 1):
        seen = json.loads((logs / f"process-{rank}.stdout").read_text())
        assert seen["argv"] == tricky[:-2] + [str(rank), ""]
        assert seen["cwd"] == str(shared_dir)
        assert seen["env"] == {"FROM_ENV": "a b $HOME", "FROM_X": "it's $HOME; `id`", "JAXRUN_PROCESS_ID": str(rank)}


# The launching shell's settings that every remote process must see (JAX_PLATFORMS
# stays "cpu": the job runs on CPUs), and two that stay behind.
SHELL_SETTINGS = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "--xla_cpu_enable_fast_math=false",
                  "NCCL_DEBUG": "INFO", "LD_LIBRARY_PATH": "/opt/jaxrun-test/lib"}


@pytest.mark.timeout(60)
def test_the_shells_jax_xla_nccl_settings_reach_every_remote_process(sshd_hosts, jaxrun, tmp_path, shared_dir,
                                                                      monkeypatch):
    names = [*SHELL_SETTINGS, "CUDA_VISIBLE_DEVICES", "OTHER_SETTING"]
    script = write(shared_dir, "settings.py", "import json, os, jax\n"
                   f"print(json.dumps({{n: os.environ.get(n) for n in {names!r}}}), jax.devices()[0].platform)\n")
    for name, value in SHELL_SETTINGS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # this machine's GPUs: not the hosts'
    monkeypatch.setenv("OTHER_SETTING", "here")
    flags = ["-H", "hostA:2,hostB", *ssh_flags(sshd_hosts)]
    code, out, err = jaxrun(*flags, "--dry-run", script, cwd=shared_dir)
    assert code == 0, err
    for name, value in SHELL_SETTINGS.items():  # the dry run shows them, for every process
        assert out.count(f"  {name}={shlex.quote(value)}\n") == 3, (name, out)
    logs = tmp_path / "logs"
    code, _, err = jaxrun(*flags, "--log-dir", logs, script, cwd=shared_dir)
    assert code == 0, err
    for rank in range(3):
        seen, platform = (logs / f"process-{rank}.stdout").read_text().rsplit(" ", 1)
        assert json.loads(seen) == {**SHELL_SETTINGS, "CUDA_VISIBLE_DEVICES": None, "OTHER_SETTING": None}, rank
        assert platform.strip() == "cpu"
    # --no-forward keeps them here; -x KEY= blanks one.
    code, out, err = jaxrun(*flags, "--no-forward", "-x", "NCCL_DEBUG=", "--dry-run", script, cwd=shared_dir)
    assert code == 0, err
    assert "XLA_FLAGS" not in out and "LD_LIBRARY_PATH" not in out and out.count("  NCCL_DEBUG=''\n") == 3, out


@pytest.mark.timeout(60)
def test_a_hosts_own_interpreter_and_the_setup_run_before_it(sshd_hosts, jaxrun, tmp_path, shared_dir):
    """hostB's python= is a wrapper that marks what it starts; --setup is
    shell code each host runs first ('module load ...' on a cluster)."""
    wrapper = write(shared_dir, "wrapped-python", f"#!/bin/sh\nWRAPPED=yes exec {shlex.quote(sys.executable)} \"$@\"\n")
    wrapper.chmod(0o755)
    hosts = write(tmp_path, "hosts.txt", f"hostA\nhostB python={wrapper}\n")
    script = write(shared_dir, "where.py", "import json, os\n"
                   "print(json.dumps([os.environ.get('WRAPPED'), os.environ.get('SET_UP')]))\n")
    setup = "SET_UP=\"it's set\"; export SET_UP  # as 'module load cuda' would"
    logs = tmp_path / "logs"
    code, out, err = jaxrun("--hosts", hosts, *ssh_flags(sshd_hosts), "--setup", setup, "--log-dir", logs, script,
                            cwd=shared_dir)
    assert code == 0, err
    seen = [json.loads((logs / f"process-{rank}.stdout").read_text()) for rank in (0, 1)]
    assert seen == [[None, "it's set"], ["yes", "it's set"]], seen
    code, out, err = jaxrun("--hosts", hosts, "--dry-run", script, cwd=shared_dir)
    assert code == 0 and f"  {wrapper} -m jaxrun.shim" in out, out  # hostB's process runs its own


@pytest.mark.timeout(60)
def test_crash_on_host_b_fails_fast(sshd_hosts, jaxrun, tmp_path, shared_dir):
    script = write(
        shared_dir,
        "crash.py",
        "import os, sys, time\n"
        "if os.environ['JAXRUN_PROCESS_ID'] == '3':\n"
        "    time.sleep(0.5)\n"
        "    sys.stderr.write('about to fail\\n')\n"
        "    1 / 0\n"
        "time.sleep(120)\n",
    )
    start = time.monotonic()
    code, _, err = jaxrun("-H", "hostA:2,hostB:2", *ssh_flags(sshd_hosts), "--log-dir", tmp_path / "logs", script,
                          cwd=shared_dir)
    assert code == 1, err
    # 3 s here, start-up included; without fail-fast the others sleep 120 s.
    assert time.monotonic() - start < 30
    assert "jaxrun: process 3 on hostB failed first: exit code 1" in err
    assert "ZeroDivisionError: division by zero" in err
    assert "processes 0, 1, 2 stopped by jaxrun" in err


@pytest.mark.timeout(60)
def test_logs_hold_every_byte(sshd_hosts, run_jaxrun, tmp_path):
    check_logs_hold_every_byte(run_jaxrun, ["-H", "hostA,hostB", *ssh_flags(sshd_hosts)], tmp_path)


def cmdline_of(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:  # a short-lived ssh client that is gone already
        return []


def host_agents(script) -> list[psutil.Process]:
    """The SSH agents that run ``script``'s processes, found by their command
    line (their environment is the session's: the job's values arrived on
    stdin, so the test's token is not there): one per host where the
    processes run over channels, one per process where each has a session."""
    agents = []
    for proc in psutil.process_iter():
        cmd = " ".join(word for word in cmdline_of(proc) if word).split()  # a title is one long word
        agent = cmd[2:3] in (["jaxrun.backends.ssh.host_agent"], ["jaxrun.backends.ssh.session_agent"])
        if cmd[1:2] == ["-m"] and agent and str(script) in cmd:
            agents.append(proc)
    return agents


def start_ready_job(launch, ssh_hosts, tmp_path, shared_dir, agents=2):
    """``agents``: the hosts' own (one each), and one per process where each has a session."""
    script = write(shared_dir, "ready.py", READY_SCRIPT)
    (first, address), (second, _) = ssh_hosts.addresses.items()
    job = launch("-H", f"{first},{second}", *ssh_flags(ssh_hosts), "--log-dir", tmp_path / "logs", script,
                 cwd=shared_dir)
    lines = wait_for_lines(job, "ready", 2)
    remote = host_agents(script)
    assert len(remote) == agents
    coordinator = next(line.split()[-1] for line in lines if line.startswith("[0] ready"))
    if coordinator.startswith("unix:"):  # a socket in hostA's agent folder, forwarded over SSH: no port
        assert coordinator.startswith("unix:/tmp/jaxrun-host-"), coordinator
        return job
    # Where the hosts refuse to forward, it listens on the first host's address only.
    bound, port = coordinator.rsplit(":", 1)
    assert bound == address
    listening = {c.laddr.ip.removeprefix("::ffff:") for c in psutil.net_connections("inet")
                 if c.status == "LISTEN" and c.laddr.port == int(port)}
    assert listening == {address}
    return job


@pytest.mark.timeout(60)
def test_sigkill_to_jaxrun_leaves_nothing(sshd_hosts, launch, tmp_path, shared_dir):
    job = start_ready_job(launch, sshd_hosts, tmp_path, shared_dir)
    agents = host_agents(shared_dir / "ready.py")
    os.kill(job.proc.pid, signal.SIGKILL)
    job.proc.wait()
    assert wait_gone(os.environ[TOKEN], within=5.0) == []
    assert not [a for a in agents if is_running(a)], agents


def is_ssh_client(proc: psutil.Process, which: str) -> bool:
    try:
        return proc.name() == "ssh" and any(which in a for a in proc.cmdline())
    except psutil.Error:  # gone already
        return False


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fixture, which", [("sshd_hosts", "ControlMaster="),
                                            ("sshd_hosts_without_forwarding", "ControlMaster="),
                                            ("sshd_hosts_without_forwarding", "ControlMaster=no")])
def test_killed_ssh_clients_leave_nothing(request, launch, tmp_path, shared_dir, fixture, which):
    """Every ssh client (the masters, which carry the channels, and any
    sessions), or only the per-process sessions, where the hosts refuse
    channels."""
    sessions = fixture == "sshd_hosts_without_forwarding"
    job = start_ready_job(launch, request.getfixturevalue(fixture), tmp_path, shared_dir, 4 if sessions else 2)
    clients = [p for p in processes_with_token(os.environ[TOKEN]) if is_ssh_client(p, which)]
    assert clients
    for proc in clients:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass  # a session client goes when its master does
    assert wait_gone(os.environ[TOKEN], within=5.0) == []
    assert job.wait(timeout=10) != 0


@pytest.mark.timeout(90)
def test_a_restart_over_ssh_picks_its_coordinator_port_again(sshd_hosts, jaxrun, tmp_path, shared_dir):
    """Each attempt serves the coordinator on a new socket in each host's
    private folder, forwarded anew over SSH (the route to the first host's
    address checked again on a free port)."""
    # Each process says its attempt, then waits for the other's word (a file
    # in the shared folder): the first attempt's failure must not stop a
    # process that has not spoken yet.
    script = write(shared_dir, "twice.py", "import os, sys, time\n"
                   "attempt, rank = os.environ['JAXRUN_RESTART_COUNT'], os.environ['JAXRUN_PROCESS_ID']\n"
                   "print('attempt', attempt, os.environ['JAXRUN_COORDINATOR_ADDRESS'], flush=True)\n"
                   "open(f'said-{attempt}-{rank}', 'w').close()\n"
                   "end = time.monotonic() + 60\n"
                   "while not all(os.path.exists(f'said-{attempt}-{r}') for r in '01') and time.monotonic() < end:\n"
                   "    time.sleep(0.05)\n"
                   "sys.exit(3 if attempt == '0' else 0)\n")
    code, out, err = jaxrun("-H", "hostA,hostB", *ssh_flags(sshd_hosts), "--max-restarts", 1,
                            "--log-dir", tmp_path / "logs", script, cwd=shared_dir)
    assert code == 0, err
    seen = [line.split()[2:4] for line in out.splitlines() if "attempt" in line]
    assert sorted(attempt for attempt, _ in seen) == ["0", "0", "1", "1"], out
    assert all(address.startswith("unix:/tmp/jaxrun-host-") for _, address in seen), out
    assert len({address for _, address in seen}) == 4, out  # a socket per host and per attempt
