"""What a controller's start-up costs, kept small without changing answers
(#46): portable.descendants_cpu, the stall watchdog's look at the processes a
process started (its children's CPU is work), without walking every process
of the host, and psutil's answer where the layer has none; and the activity
line's value class, no dataclass any more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from jaxrun import contract, portable
from jaxrun.portable import processes

# A child that burns 0.3 s of CPU, then starts a grandchild that burns as much,
# and both then wait (their CPU stays put while the test looks).
BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
TREE = BURN + (
    "import subprocess, sys\n"
    f"kid = subprocess.Popen([sys.executable, '-c', {BURN + 'print(1, flush=True); time.sleep(60)'!r}],"
    " stdout=subprocess.PIPE)\n"
    "kid.stdout.readline()\n"
    "print(kid.pid, flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def others():
    """What this test process had already started before the test: a pytest
    worker keeps the processes of earlier tests' shared fixtures (an sshd per
    "host") running.  The checks below are about the test's own tree."""
    return set(psutil_view())


@pytest.fixture
def tree(others):
    """A child and its grandchild, both done burning: (child, grandchild)."""
    child = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, start_new_session=True)
    try:
        grandchild = int(child.stdout.readline())
        yield child.pid, grandchild
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()


def psutil_view() -> dict[int, float]:
    return {kid.pid: sum(kid.cpu_times()[:2]) for kid in psutil.Process().children(recursive=True)}


def test_no_child_no_descendant(others):
    assert set(portable.descendants_cpu()) == others


@pytest.mark.parametrize("kernel_lists", [True, False], ids=["task-children", "scan"])
def test_each_descendant_with_its_cpu_as_psutil_says(tree, others, monkeypatch, kernel_lists):
    if kernel_lists and not processes._lists_children():
        pytest.skip("this kernel has no /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN)")
    monkeypatch.setattr(processes, "_listing", [kernel_lists])
    got = portable.descendants_cpu()
    assert set(got) - others == set(tree) == set(psutil_view()) - others
    for pid, cpu in psutil_view().items():
        if pid in others:
            continue
        assert 0.25 <= got[pid] and abs(got[pid] - cpu) <= 0.02, (got, pid, cpu)


def test_an_ended_child_is_left_unreaped(others, monkeypatch):
    """The look must not reap: the script's own wait() gets its child's status."""
    kid = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    try:
        deadline = time.monotonic() + 30
        while psutil.Process(kid.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert set(portable.descendants_cpu()) - others == {kid.pid}
        assert kid.wait(timeout=10) == 7
        assert set(portable.descendants_cpu()) == others
    finally:
        kid.kill()
        kid.wait()


def test_forced_the_caller_asks_psutil(monkeypatch):
    monkeypatch.setenv(contract.PORTABLE, "1")
    assert portable.descendants_cpu() is None


def test_the_sampler_sees_the_tree_with_and_without_the_layer(tree, others, monkeypatch):
    from jaxrun.child.watch import activity

    assert set(activity.children_cpu()) - others == set(tree)
    monkeypatch.setenv(contract.PORTABLE, "1")
    assert set(activity.children_cpu()) - others == set(tree)


def test_the_activity_line_a_start_up_reads_is_a_value_as_before():
    """contract.Spinning is a plain class now (no dataclasses at a
    controller's start-up): still equal by value, hashable, unchangeable,
    and copied or pickled whole (a report's asdict deep-copies it)."""
    import copy
    import dataclasses
    import pickle

    spun = contract.Spinning(2, 1.97)
    assert spun == contract.Spinning.of(spun.line()) and spun != contract.Spinning(3, 1.97)
    assert {spun: 1}[contract.Spinning(2, 1.97)] == 1
    assert copy.deepcopy(spun) == spun == pickle.loads(pickle.dumps(spun))
    with pytest.raises(AttributeError):
        spun.threads = 5

    @dataclasses.dataclass
    class Holder:
        spinning: tuple

    assert dataclasses.asdict(Holder(((1, spun),))) == {"spinning": ((1, spun),)}


def test_a_runs_end_removes_every_activity_file_and_left_copy_listing_the_folder_once(tmp_path, monkeypatch):
    """contract.remove_private: each path, and the PATH.PID.new a writer left
    unrenamed, nothing else; the folder listed once for all of them (at 256
    processes, one listing per file grew the launcher's ending as N squared)."""
    paths = [str(tmp_path / f"process-{r}.activity") for r in range(3)]
    for path in paths:
        contract.write_private(path, b"busy\n")
    (tmp_path / "process-1.activity.4242.new").write_bytes(b"idle\n")  # its writer ended before the rename
    keep = ["process-1.activity.x.new", "process-12.activity", "process-1.activity.log", "other.4242.new"]
    for name in keep:
        (tmp_path / name).write_bytes(b"")
    listings = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda folder=".": listings.append(folder) or real(folder))
    contract.remove_private(*paths)
    assert listings == [str(tmp_path)]
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
