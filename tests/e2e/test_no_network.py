"""A machine that refuses internet sockets (issue 71's TPU host refused them,
loopback included): a job of one process opens none, and runs as a bare
python does; a job whose processes would meet over them says why, in one
line, with exit 2, before anything starts.  The machine here is a network
namespace of its own, whose loopback is down (``unshare -n``)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

pytestmark = pytest.mark.timeout(180)


def no_network_here() -> str | None:
    if not shutil.which("unshare"):
        return "no unshare"
    done = subprocess.run(["unshare", "-n", "true"], capture_output=True, text=True)
    return None if done.returncode == 0 else f"unshare -n: {done.stderr.strip()}"


skip = no_network_here()
pytestmark = [pytestmark, pytest.mark.skipif(bool(skip), reason=skip or "")]


@pytest.fixture
def no_network(monkeypatch):
    """The jobs of this test start in a network namespace of their own, its loopback down."""
    import fixtures.jobs

    monkeypatch.setattr(fixtures.jobs, "JAXRUN", ["unshare", "-n", *fixtures.jobs.JAXRUN])


SCRIPT = ("import jax, jax.numpy as jnp\n"
          "print('sum', float(jnp.ones((64, 64)).sum()), jax.process_count(), jax.devices()[0].platform)\n"
          "print('collectives', jax.config.jax_cpu_collectives_implementation)\n")


@pytest.mark.both_modes
def test_a_one_process_job_runs_where_internet_sockets_are_refused(jaxrun, no_network, tmp_path):
    script = tmp_path / "one.py"
    script.write_text(SCRIPT)
    code, out, err = jaxrun("--log-dir", tmp_path / "logs", script)
    # As a bare python prints it: the implementation the script would use stays its own.
    assert (code, out) == (0, "[0] sum 4096.0 1 cpu\n[0] collectives gloo\n"), err


def test_a_one_process_job_whose_script_initializes_runs_where_internet_sockets_are_refused(jaxrun, no_network,
                                                                                            tmp_path):
    # Where they are taken, its initialize() gets JAX's CPU collectives, as a
    # plain launch's does (test_local.py); here it gets none, as above.
    script = tmp_path / "own.py"
    script.write_text("import jax\njax.distributed.initialize()\n" + SCRIPT)
    code, out, err = jaxrun("--log-dir", tmp_path / "logs", script)
    assert (code, out) == (0, "[0] sum 4096.0 1 cpu\n[0] collectives gloo\n"), err


def test_processes_that_would_meet_over_internet_sockets_say_why_before_anything_starts(jaxrun, no_network,
                                                                                          tmp_path):
    script = tmp_path / "one.py"
    script.write_text(SCRIPT)
    code, out, err = jaxrun("-n", 2, "--cpu-devices", 1, "--log-dir", tmp_path / "logs", script)
    assert (code, out) == (2, "")
    assert err == ("jaxrun: error: -n 2: a job's processes meet over internet sockets (JAX's CPU collectives, its "
                   "transfers between them), and this machine refuses internet sockets (Network is unreachable); "
                   "a job of one process needs none\n")
    assert not (tmp_path / "logs").exists()
