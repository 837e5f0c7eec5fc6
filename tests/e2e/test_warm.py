"""A preloaded controller imports nothing after its fork that its server could
have imported once for all (``jaxrun.child.join.warm``): none of jaxrun's child
side, and not what jax loads on a job's first program.  An audit hook in
every process of the run (a ``sitecustomize`` on PYTHONPATH) writes down each
import made in a process forked from the one that imported jax."""

from __future__ import annotations

import pytest
from fixtures.audit import audit_every_process, lines_by_pid

AUDIT = '''
import os, sys

_LOG = os.environ.get("WARM_LOG")
_forker = None


def _hook(event, args):
    global _forker
    if event == "os.fork":
        _forker = os.getpid()
    elif event == "import" and _forker is not None and os.getpid() != _forker and args[0] not in sys.modules:
        with open(_LOG, "a") as f:
            f.write(f"{os.getpid()} {args[0]}\\n")


if _LOG:
    sys.addaudithook(_hook)
'''

# Two processes, a global array from host data (device_put checks that it is
# the same everywhere) and a program over it: the toy's path.
JOB = """
import colorsys  # the audit's witness: a module no server has loaded
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((2, 2), ("i", "j"))
x = jax.device_put(np.arange(16.0).reshape(4, 4), NamedSharding(mesh, P("i", "j")))
print("sum", float(jnp.sum(jnp.sin(x))), flush=True)
"""


@pytest.fixture
def imports_after_fork(tmp_path, monkeypatch):
    """What each forked process imported, by its pid."""
    log = audit_every_process(tmp_path, monkeypatch, AUDIT, "WARM_LOG")
    return lambda: {pid: set(names) for pid, names in lines_by_pid(log).items()}


def test_a_forked_controller_imports_nothing_its_server_could_have(start_job, imports_after_fork, tmp_path):
    from jaxrun.child.join import warm

    script = tmp_path / "job.py"
    script.write_text(JOB)
    job = start_job("-n", 2, "--cpu-devices", 2, script)
    assert job.wait(timeout=90) == 0, job.stderr
    assert job.stdout.count("sum ") == 2, job.stdout
    found = imports_after_fork()
    # The audit saw both controllers (each imported the script's witness), so
    # an empty log cannot pass for a clean one.
    assert len([pid for pid, names in found.items() if "colorsys" in names]) == 2, found
    warmed = set(warm.CHILD) | set(warm.JAX_LAZY)
    for pid, names in found.items():
        late = sorted(n for n in names if n.startswith("jaxrun.") or n in warmed or n.startswith("jaxlib.mlir"))
        assert not late, f"process {pid} imported after its fork: {late}"
