"""A throwaway one-node Slurm cluster for the test session.

Installs nothing: it needs ``munged``, ``slurmctld``, ``slurmd`` and ``srun``
on PATH (Debian: ``slurm-wlm munge``) and root, and skips otherwise.  Every
daemon runs in the foreground as our own child, with its config, key, sockets,
state and logs in a temp folder and its ports chosen free, so it cannot clash
with a real Slurm on the machine and nothing is left behind afterwards.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "srun", "sinfo")
# The leak guard's variable must not reach the daemons: they outlive each test.
TOKEN = "JAXRUN_TEST_TOKEN"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(root: Path, node: str) -> str:
    return f"""\
ClusterName=jaxruntest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# A 2-core test machine still offers 8 CPUs, so that a plain 'srun -n 4'
# (what users type on a real cluster) fits without --overcommit.
SlurmdParameters=config_overrides
KillWait=2
InactiveLimit=0
NodeName={node} NodeAddr=127.0.0.1 CPUs={max(8, os.cpu_count())} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
"""


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _wait_idle(env: dict, node: str, procs: list[subprocess.Popen], root: Path, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    state = ""
    while time.monotonic() < deadline:
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}; logs in {root}")
        out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%t"], env=env, capture_output=True, text=True)
        state = out.stdout.strip()
        if state == "idle":
            return
        time.sleep(0.2)
    raise RuntimeError(f"node {node} did not become idle (state {state!r}); logs in {root}")


@pytest.fixture(scope="session")
def slurm_cluster():
    """Start munged, slurmctld and slurmd; yields the environment srun needs."""
    missing = [b for b in BINARIES if not shutil.which(b)]
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} not on PATH; apt-get install slurm-wlm munge)")
    if os.geteuid() != 0:
        pytest.skip("the throwaway Slurm cluster runs its daemons as root")
    root = Path(tempfile.mkdtemp(prefix="jaxrun-slurm-"))
    node = socket.gethostname()
    for sub in ("state", "spool"):
        (root / sub).mkdir()
    conf = root / "slurm.conf"
    conf.write_text(_config(root, node))
    env = {k: v for k, v in os.environ.items() if k != TOKEN and not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(conf)
    key = root / "munge.key"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    os.chmod(key, 0o400)
    daemons = [
        ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={root}/munge.socket",
         f"--pid-file={root}/munged.pid", f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed"],
        ["slurmctld", "-D", "-i", "-f", str(conf)],
        ["slurmd", "-D", "-f", str(conf), "-N", node],
    ]
    procs: list[subprocess.Popen] = []
    previous = os.environ.get("SLURM_CONF")
    try:
        for argv in daemons:
            log = open(root / (Path(argv[0]).name + ".out"), "wb")
            procs.append(subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True))
            log.close()
            if argv[0] == "munged":
                _wait_for(root / "munge.socket", procs[-1], root)
        _wait_idle(env, node, procs, root)
        os.environ["SLURM_CONF"] = str(conf)
        yield env
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        _stop(procs)
        shutil.rmtree(root, ignore_errors=True)


def _wait_for(path: Path, proc: subprocess.Popen, root: Path, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"munged did not start; logs in {root}")
        time.sleep(0.05)
