"""The attempts of a run share JAX's persistent compile cache
(docs/restarts.md, "Attempts share a compile cache"): with restarts allowed
and no cache of the user's, a local run keeps it in its log folder, and each
SSH host keeps its own; the user's cache, or none without restarts, is left
as it is.  Real 2-process JAX jobs; every compile is cached
(``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0``) so the programs can be small."""

from __future__ import annotations

import os
import re
import stat

import pytest
from fixtures.jobs import ROOT, TOKEN

SCRIPT = '''
import os, sys
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils

hits = []
jax.monitoring.register_event_listener(
    lambda event, **_: hits.append(event) if event == "/jax/compilation_cache/cache_hits" else None)


@jax.jit
def chain(x):
    for i in range(50):
        x = jnp.sin(x) * 0.5 + i
    return x


chain(jnp.ones((8,))).block_until_ready()
folder = jax.config.jax_compilation_cache_dir
entries = len(os.listdir(folder)) if folder and os.path.isdir(folder) else 0
attempt = os.environ["JAXRUN_RESTART_COUNT"]
print(f"CACHE attempt={attempt} process={jax.process_index()} dir={folder} entries={entries} hits={len(hits)}",
      flush=True)
multihost_utils.sync_global_devices("looked")
if attempt == "0" and jax.process_index() == 1:
    sys.exit(3)  # a failure after the compile: the job restarts
'''
LINE = re.compile(r"CACHE attempt=(\d) process=(\d) dir=(\S*) entries=(\d+) hits=(\d+)")
EVERY_COMPILE = ("-x", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0")


def looks(out: str) -> dict[tuple[int, int], tuple[str, int, int]]:
    """(attempt, process) -> (cache folder, its entries, cache hits)."""
    return {(int(a), int(p)): ("" if d == "None" else d, int(e), int(h)) for a, p, d, e, h in LINE.findall(out)}


@pytest.mark.both_modes  # the preloading server's processes read JAX_* at the script's import of jax
@pytest.mark.timeout(150)
def test_attempts_share_a_compile_cache_unless_the_user_has_one(launch, launch_mode, tmp_path):
    script = tmp_path / "cached.py"
    script.write_text(SCRIPT)
    own = tmp_path / "own-cache"
    jobs = {
        "shared": ("--max-restarts", 1),
        "own": ("--max-restarts", 1, "-x", f"JAX_COMPILATION_CACHE_DIR={own}"),
        "no restarts": (),
    }
    if launch_mode == "no-preload":
        # A fresh interpreter reads JAX_* as it imports jax, whichever job it
        # is: the shared cache shows that route; the user's own cache and none
        # at all are the plan's choice (tests/unit/test_compile_cache.py), and
        # the preloading server, which imported jax before any job's
        # environment, is where they could go wrong.
        jobs = {"shared": jobs["shared"]}
    started = {name: launch("-n", 2, "--cpu-devices", 1, *EVERY_COMPILE, *flags, "--log-dir", tmp_path / name,
                            script) for name, flags in jobs.items()}
    codes = {name: job.wait(timeout=120) for name, job in started.items()}

    job = started["shared"]
    assert codes["shared"] == 0, job.stderr
    seen = looks(job.stdout)
    folder = tmp_path / "shared" / "compile-cache"
    assert set(seen) == {(0, 0), (0, 1), (1, 0), (1, 1)}, job.stdout
    assert {seen[k][0] for k in seen} == {str(folder)}, seen
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert seen[0, 0][1] >= 1 and seen[0, 0][2] == 0, seen  # attempt 0's process 0 wrote, and hit nothing
    assert seen[1, 0][2] >= 1, seen  # the restart's process 0 compiled from the cache

    if launch_mode == "no-preload":
        return
    job = started["own"]
    assert codes["own"] == 0, job.stderr
    seen = looks(job.stdout)
    assert {seen[k][0] for k in seen} == {str(own)} and seen[1, 0][2] >= 1, seen
    assert not (tmp_path / "own" / "compile-cache").exists()

    job = started["no restarts"]
    assert codes["no restarts"] == 3, job.stderr
    seen = looks(job.stdout)
    assert set(seen) == {(0, 0), (0, 1)} and {seen[k][0] for k in seen} == {""}, seen
    assert not (tmp_path / "no restarts" / "compile-cache").exists()


@pytest.mark.timeout(120)
def test_each_ssh_host_keeps_its_own_compile_cache(sshd_hosts, start_job, tmp_path, shared_dir):
    """Each host has a private /tmp: one folder name, two caches, and only
    process 0's host holds entries (JAX writes from process 0 alone)."""
    script = shared_dir / "cached.py"
    script.write_text(SCRIPT)
    job = start_job("-H", "hostA,hostB", "--ssh-config", sshd_hosts.config, "-x", f"PYTHONPATH={ROOT}",
                    "-x", TOKEN, "--cpu-devices", 1, *EVERY_COMPILE, "--max-restarts", 1,
                    "--log-dir", tmp_path / "logs", script, cwd=shared_dir)
    assert job.wait(timeout=100) == 0, job.stderr
    seen = looks(job.stdout)
    assert set(seen) == {(0, 0), (0, 1), (1, 0), (1, 1)}, job.stdout
    folders = {seen[k][0] for k in seen}
    assert len(folders) == 1, seen
    (folder,) = folders
    assert os.path.dirname(folder).endswith(f"jaxrun-cache-{os.geteuid()}"), folder
    # Attempt 0 wrote before its barrier; hostB's folder of that name is another one.
    assert seen[0, 0][1] >= 1 and seen[1, 1][1] == 0, seen
    assert seen[1, 0][2] >= 1, seen
    assert not (tmp_path / "logs" / "compile-cache").exists()
