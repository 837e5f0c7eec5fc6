"""Resource figures: what each process used, and an OOM kill named as one.

The figures of every backend are checked where a JAX job already runs
(``check_resources`` in the supervision, SSH, Slurm and mpirun tests).  Here,
a real OOM kill: jaxrun runs inside a memory cgroup of its own with a small
limit, and one process allocates past it until the kernel kills it.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from fixtures.jobs import JAXRUN

from jaxrun import portable

LIMIT = 256 << 20
GREEDY = """\
import os, time
if os.environ["JAXRUN_PROCESS_ID"] == "1":
    hoard = []
    while True:  # 16 MiB at a time, touched, until the kernel says no
        hoard.append(bytearray(16 << 20))
time.sleep(60)
"""


def make_group() -> Path:
    """A fresh memory cgroup next to this process's (v1 or v2), limited to
    LIMIT with no swap; skips the test where none can be made."""
    own = portable.memory_group()
    if own.folder is None:
        pytest.skip("no readable memory cgroup on this machine")
    parent = Path(own.folder)
    if own.version == 2:
        parent = parent.parent  # a v2 group with processes cannot have children: use a sibling
    group = parent / f"jaxrun-oom-test-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as e:
        pytest.skip(f"cannot make a memory cgroup under {parent}: {e.strerror}")
    limits = [("memory.max", "memory.swap.max")] if own.version == 2 else \
        [("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")]
    try:
        for limit, swap in limits:
            (group / limit).write_text(str(LIMIT))
            if (group / swap).exists():
                (group / swap).write_text(str(LIMIT) if own.version == 1 else "0")
    except OSError as e:
        group.rmdir()
        pytest.skip(f"cannot limit the memory cgroup {group}: {e.strerror}")
    return group


@pytest.fixture
def memory_group():
    group = make_group()
    yield group
    deadline = time.monotonic() + 10
    while True:  # the job is gone by now; the kernel frees the group a moment later
        try:
            group.rmdir()
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@pytest.mark.timeout(90)
def test_an_oom_kill_is_named_in_the_summary_and_the_report(memory_group, tmp_path):
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    report = tmp_path / "report.json"
    command = [*JAXRUN, "--no-preload", "-n", "2", "--log-dir", str(tmp_path / "logs"), "--report", str(report),
               str(script)]
    # Join the group first, then become jaxrun: everything it starts is inside.
    shell = f"echo $$ > {shlex.quote(str(memory_group / 'cgroup.procs'))} && exec {shlex.join(command)}"
    job = subprocess.Popen(["sh", "-c", shell], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           start_new_session=True)
    try:
        _, err = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    err = err.decode(errors="replace")
    assert job.returncode == 128 + signal.SIGKILL, err[-3000:]
    assert "jaxrun: process 1 failed first: killed by SIGKILL" in err
    assert "jaxrun:   the kernel's OOM killer ended it (oom_kill in " in err, err[-3000:]
    used = {p["process_id"]: p["resources"] for p in json.loads(report.read_text())["processes"]}
    assert "OOM killer" in used[1]["oom"] and used[0]["oom"] is None, used
    assert used[1]["peak_rss_bytes"] > LIMIT // 2, used  # it got far before the kill
    assert f"jaxrun: peak memory {used[1]['peak_rss_bytes'] / (1 << 20):.1f} MiB in process 1" in err
