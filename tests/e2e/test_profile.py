"""Profiling every process of a running job (docs/inspect.md): ``--profile
START:SECONDS`` at launch and ``jaxrun profile`` from another terminal.

One JAX job per place serves both: it starts with ``--profile 0:1`` (a 1 s
trace as soon as every process joined), and once that session is in,
``jaxrun profile --seconds 1`` asks for a second one through the job's
control channel.  Each session must hold one ``.xplane.pb`` per process,
each under a host name of its own (``HOST-pRANK``, also where processes
share a machine), and each must load with ``jax.profiler.ProfileData``.
Then the job is released and ends by itself: tracing stopped nothing.

- locally: 4 processes on this machine, one host name for all of them;
- over SSH: hostA and hostB (``sshd_hosts``), whose /tmp is their own: the
  traces come home over each host's connection.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from fixtures.jobs import JAXRUN, ROOT, TOKEN, wait_gone

WORKS = '''
import os, sys, time
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

release = sys.argv[1]
mesh = jax.make_mesh((jax.device_count(),), ("i",))
x = jax.device_put(np.ones((jax.device_count(), 4), np.float32), NamedSharding(mesh, P("i")))
step = jax.jit(lambda x: x * 0.5 + jnp.sum(x) * 1e-3)
print("ready", os.environ["JAXRUN_RUN_ID"], flush=True)
while not multihost_utils.broadcast_one_to_all(np.int32(os.path.exists(release))):  # all stop at one step
    x = step(x).block_until_ready()
    time.sleep(0.05)
print("done", flush=True)
'''

# Where a run's sessions are, in its log folder: what XProf reads as one multi-host session each.
SESSIONS = "profile/plugins/profile"


def sessions(logs: Path) -> list[Path]:
    folder = logs / SESSIONS
    return sorted(folder.iterdir()) if folder.is_dir() else []


def check_session(folder: Path, expected: set[str]) -> None:
    """One trace per process, each named for its process, each one XProf can read."""
    from jax.profiler import ProfileData

    traces = {p.name for p in folder.iterdir() if p.name.endswith(".xplane.pb")}
    assert traces == expected, sorted(p.name for p in folder.iterdir())
    for name in sorted(traces):
        data = ProfileData.from_file(str(folder / name))
        assert list(data.planes), name  # a real XSpace, with its planes


class Job:
    """A jaxrun in the background, its stderr in a file, killed with its group at the end."""

    def __init__(self, args: list, env: dict, base: Path):
        self.env, self.base = env, base
        self.logs, self.release, self.err = base / "logs", base / "release", base / "jaxrun.stderr"
        with open(self.err, "wb") as err:
            self.proc = subprocess.Popen([*JAXRUN, "--log-dir", self.logs, *map(str, args)], env=env, cwd=ROOT,
                                         stdout=subprocess.PIPE, stderr=err, start_new_session=True)

    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def wait_for(self, what, within: float, why: str):
        deadline = time.monotonic() + within
        while not (found := what()):
            assert self.proc.poll() is None, f"jaxrun ended ({why}): {self.stderr()}"
            assert time.monotonic() < deadline, f"no {why} within {within} s: {self.stderr()}"
            time.sleep(0.2)
        return found

    def run_id(self) -> str:
        def said() -> str | None:
            out = self.logs / "process-0.stdout"
            found = re.search(r"^ready (\S+)$", out.read_text(), re.M) if out.exists() else None
            return found and found[1]

        return self.wait_for(said, 120, "ready line from process 0")

    def end(self) -> tuple[int, str]:
        self.release.touch()
        out, _ = self.proc.communicate(timeout=60)
        return self.proc.returncode, out.decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 9)
        self.proc.wait()


def profile_both_ways(job: Job, expected: set[str]) -> None:
    """--profile's session first, then one by ``jaxrun profile``: each whole."""
    run_id = job.run_id()
    job.wait_for(lambda: "processes traced into" in job.stderr(), 120, "--profile session")
    stderr = job.stderr()
    assert f"jaxrun: profile: {len(expected)} of {len(expected)} processes traced into " in stderr, stderr
    assert f"jaxrun: profile: open it with: xprof --logdir={job.logs / 'profile'} --port=6006" in stderr, stderr
    [timed] = sessions(job.logs)
    check_session(timed, expected)

    asked = subprocess.run([*JAXRUN, "profile", "--run", run_id, "--seconds", "1"], env=job.env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert asked.returncode == 0, asked.stderr
    lines = asked.stdout.splitlines()
    folder = job.logs / SESSIONS / Path(lines[0].rsplit(" ", 1)[1]).name
    assert lines == [f"jaxrun: run {run_id}: {len(expected)} of {len(expected)} processes traced into {folder}",
                     f"jaxrun: open it with: xprof --logdir={job.logs / 'profile'} --port=6006"], asked.stdout
    assert sessions(job.logs) == sorted([timed, folder])
    check_session(folder, expected)
    assert job.proc.poll() is None  # the job goes on

    code, out = job.end()
    assert code == 0, job.stderr()
    assert out.count("done") == len(expected), out


@pytest.fixture
def job_env(tmp_path):
    """The job's own token and temporary folder (its channel's socket goes under it)."""
    token = uuid.uuid4().hex
    env = {**os.environ, TOKEN: token, "TMPDIR": str(tmp_path)}
    env.pop("JAXRUN_NO_PRELOAD", None)
    yield env
    leftover = wait_gone(token, within=10.0)
    for p in leftover:
        p.kill()
    assert not leftover, f"processes outlived the job: {leftover}"


@pytest.mark.timeout(300)
def test_four_local_processes_traced_into_one_session_with_a_host_name_each(tmp_path, job_env):
    script = tmp_path / "works.py"
    script.write_text(WORKS)
    job = Job(["-n", 4, "--cpu-devices", 1, "--profile", "0:1", script, tmp_path / "release"], job_env, tmp_path)
    try:
        here = socket.gethostname()
        profile_both_ways(job, {f"{here}-p{rank}.xplane.pb" for rank in range(4)})
        assert not any((job.logs / "profiling").rglob("*.pb"))  # moved, not copied
    finally:
        job.kill()


@pytest.mark.timeout(300)
def test_two_ssh_hosts_traces_come_home_into_one_session(sshd_hosts, shared_dir, job_env):
    script = shared_dir / "works.py"  # on every host, as a shared home holds it
    script.write_text(WORKS)
    base = shared_dir / "run"
    base.mkdir()
    job = Job(["-H", "hostA,hostB", "--ssh-config", sshd_hosts.config, "-x", f"PYTHONPATH={ROOT}", "-x", TOKEN,
               "--cpu-devices", 1, "--profile", "0:1", script, base / "release"], job_env, base)
    try:
        profile_both_ways(job, {"node-a-p0.xplane.pb", "node-b-p1.xplane.pb"})  # each host's own name
        for host in ("hostA", "hostB"):  # what each host kept is gone: it came home
            left = sshd_hosts.run(host, ["find", "/tmp", "-path", "*jaxrun-profile-*/*"], check=False)
            assert left.stdout.strip() == "", (host, left.stdout)
    finally:
        job.kill()


IN_A_COLLECTIVE = '''
import os, sys, time
import jax
from jax.experimental import multihost_utils

release = sys.argv[1]
multihost_utils.sync_global_devices("warm")  # compiled: the next one blocks in C at once
if jax.process_index() == 0:
    print("ready", os.environ["JAXRUN_RUN_ID"], flush=True)
else:
    while not os.path.exists(release):  # process 0 waits in the collective meanwhile
        time.sleep(0.05)
multihost_utils.sync_global_devices("released")
print("done", flush=True)
'''


@pytest.mark.timeout(300)
def test_a_process_waiting_in_a_collective_is_traced_when_asked(tmp_path, job_env):
    """Its main thread is in C for as long as the other process makes it
    wait: the start and the stop are both heard as they come (jaxrun's own
    thread), not as one when the collective returns (Python's handler,
    which left this trace unwritten for the settle wait's 30 s)."""
    script = tmp_path / "waits.py"
    script.write_text(IN_A_COLLECTIVE)
    job = Job(["-n", 2, "--cpu-devices", 1, script, tmp_path / "release"], job_env, tmp_path)
    try:
        run_id = job.run_id()
        time.sleep(1.0)  # process 0 is in the collective
        asked = subprocess.run([*JAXRUN, "profile", "--run", run_id, "--seconds", "1"], env=job.env, cwd=ROOT,
                               capture_output=True, text=True, timeout=120)
        assert asked.returncode == 0, asked.stdout + asked.stderr
        assert f"jaxrun: run {run_id}: 2 of 2 processes traced into " in asked.stdout, asked.stdout
        [session] = sessions(job.logs)
        check_session(session, {f"{socket.gethostname()}-p{rank}.xplane.pb" for rank in range(2)})
        code, out = job.end()
        assert code == 0, job.stderr()
        assert out.count("done") == 2, out
    finally:
        job.kill()
