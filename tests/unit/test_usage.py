"""Resource figures: wait4's measurements of a real child, and the OOM verdict."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from jaxrun import contract, portable
from jaxrun.core import usage

ALLOCATE_AND_SPIN = """\
import time
hoard = bytearray(200 << 20)  # touched: calloc'd pages count once written
for i in range(0, len(hoard), 4096):
    hoard[i] = 1
end = time.process_time() + 0.3
while time.process_time() < end:
    pass
"""


MEASURE = """\
import json, subprocess, sys
from jaxrun.core import usage
popen = subprocess.Popen([sys.executable, "-c", sys.argv[1]])
code, used = usage.wait_popen(popen, usage.OomWatch())
print(json.dumps([code, popen.returncode, used.to_dict()]))
"""


@pytest.mark.timeout(30)
def test_a_real_child_is_measured_by_the_kernel():
    # Measured from a small parent: a child's peak counts from before its
    # exec, when it still is (or borrows) its parent's memory, and a pytest
    # late in the suite holds hundreds of MiB.
    done = subprocess.run([sys.executable, "-c", MEASURE, ALLOCATE_AND_SPIN], capture_output=True, text=True,
                          timeout=25, check=True)
    code, returncode, figures = json.loads(done.stdout)
    used = contract.Resources.from_dict(figures)
    assert code == 0 and returncode == 0
    assert 200 << 20 < used.peak_rss_bytes < 400 << 20, used
    assert 0.3 <= used.cpu_seconds < 5, used
    assert used.oom is None


class FakeGroup:
    def __init__(self, kills, limit, events_file="/cg/memory.events"):
        self.kills, self.limit_bytes, self.events_file = kills, limit, events_file

    def oom_kills(self):
        return self.kills

    def limit(self):
        return self.limit_bytes


def watch_on(group) -> usage.OomWatch:
    watch = usage.OomWatch()
    watch.group, watch.before = group, group.oom_kills()
    return watch


def test_a_rising_oom_kill_counter_is_the_verdict():
    group = FakeGroup(2, 1 << 30)
    watch = watch_on(group)
    group.kills = 3
    used = contract.Resources(10 << 20, 1.0)
    assert watch.explain(-signal.SIGKILL, used) == \
        "the kernel's OOM killer ended it (oom_kill in /cg/memory.events rose from 2 to 3)"
    assert watch.explain(1, used) is None  # not a SIGKILL
    watch.saw(signal.SIGTERM)
    assert watch.explain(-signal.SIGKILL, used) is not None
    watch.saw(signal.SIGKILL)  # jaxrun killed it itself
    assert watch.explain(-signal.SIGKILL, used) is None


def test_without_a_counter_a_peak_near_the_limit_is_a_likely_cause():
    watch = watch_on(FakeGroup(None, 1 << 30))
    near, far = contract.Resources(int(0.95 * (1 << 30)), 2.0), contract.Resources(100 << 20, 2.0)
    assert watch.explain(-signal.SIGKILL, near) == \
        "probably the kernel's OOM killer: it peaked at 972.8 MiB of its memory cgroup's limit (1.0 GiB)"
    assert watch.explain(-signal.SIGKILL, far) is None
    assert watch.with_verdict(-signal.SIGKILL, near).oom.startswith("probably")
    assert watch.with_verdict(-signal.SIGKILL, far) == far


def test_this_process_finds_its_memory_cgroup_or_says_none(monkeypatch):
    group = portable.memory_group()
    if group.folder is not None:
        assert isinstance(group.oom_kills(), int)
    monkeypatch.setenv(contract.PORTABLE, "1")
    forced = portable.memory_group()
    assert forced.folder is None and forced.oom_kills() is None and forced.limit() is None
