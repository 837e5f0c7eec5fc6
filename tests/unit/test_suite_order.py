"""Under ``--dist loadgroup`` (the README's test command) the workers take
the groups with end-to-end tests first and the unit tests' groups last
(``tests/conftest.py``): xdist's own order is by a group's count of tests,
which sends a unit module of many quick cases ahead of an end-to-end module
of a few long ones, so that a long module can start last and run on alone
while the other workers have nothing left.

A pytest of its own, in one xdist worker so that the order is the one the
worker was given: a unit module of many tests and an end-to-end test that
starts no process (a dry run)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICK_END_TO_END = "tests/e2e/test_head_start.py::test_no_server_where_the_run_needs_none[dry-run]"


def test_the_end_to_end_groups_go_to_the_workers_before_the_unit_tests():
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "1", "-v", "-p", "no:cacheprovider",
                           "tests/unit/test_cli.py", QUICK_END_TO_END],
                          cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"^\[gw0\] \[\s*\d+%\] PASSED (\S+)", done.stdout, re.M)
    units = [t for t in ran if t.startswith("tests/unit/test_cli.py::")]
    assert len(units) > 10, done.stdout  # the larger group: xdist alone would send it first
    assert ran[0].startswith(QUICK_END_TO_END), ran[:3]
