"""A machine that refuses internet sockets (issue 71's TPU host refused them,
loopback included): a job of one process opens none, and runs as a bare
python does; a job whose processes would meet over them says why, in one
line, with exit 2, before anything starts.  The machine here is a network
namespace of its own, whose loopback is down (``unshare -n``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest
from fixtures.jobs import JAXRUN

pytestmark = pytest.mark.timeout(180)


def no_network_here() -> str | None:
    if not shutil.which("unshare"):
        return "no unshare"
    done = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"unshare -n: {done.stderr.strip()}"


skip = no_network_here()
pytestmark = [pytestmark, pytest.mark.skipif(bool(skip), reason=skip or "")]


def run_without_network(*args, cwd, preload=True) -> tuple[int, str, str]:
    """jaxrun ARGS in a network namespace of its own; its whole group is
    killed if it outlives the test's wait."""
    env = dict(os.environ)
    if not preload:
        env["JAXRUN_NO_PRELOAD"] = "1"
    proc = subprocess.Popen(["unshare", "-n", *JAXRUN, *map(str, args)], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out, err


SCRIPT = ("import jax, jax.numpy as jnp\n"
          "print('sum', float(jnp.ones((64, 64)).sum()), jax.process_count(), jax.devices()[0].platform)\n"
          "print('collectives', jax.config.jax_cpu_collectives_implementation)\n")


@pytest.mark.parametrize("preload", [True, False], ids=["preload", "no-preload"])
def test_a_one_process_job_runs_where_internet_sockets_are_refused(tmp_path, preload):
    (tmp_path / "one.py").write_text(SCRIPT)
    code, out, err = run_without_network("--log-dir", tmp_path / "logs", "one.py", cwd=tmp_path, preload=preload)
    # As a bare python prints it: the implementation the script would use stays its own.
    assert (code, out) == (0, "[0] sum 4096.0 1 cpu\n[0] collectives gloo\n"), err


def test_processes_that_would_meet_over_internet_sockets_say_why_before_anything_starts(tmp_path):
    (tmp_path / "one.py").write_text(SCRIPT)
    code, out, err = run_without_network("-n", 2, "--cpu-devices", 1, "--log-dir", tmp_path / "logs", "one.py",
                                         cwd=tmp_path)
    assert (code, out) == (2, "")
    assert err == ("jaxrun: error: -n 2: a job's processes meet over internet sockets (JAX's CPU collectives, its "
                   "transfers between them), and this machine refuses internet sockets (Network is unreachable); "
                   "a job of one process needs none\n")
    assert not (tmp_path / "logs").exists()
