"""The leak guard every test gets (``fixtures.jobs.no_leftover_processes``)
gives the test a TMPDIR of its own in /tmp, and removes it when the test
ends: one folder left per test had filled this machine's /tmp with 104,626
of them, and every walk or listing of /tmp (a pytest run in a test's folder
walked it: 15 s) paid for them.

The two tests run in order in one worker (one module is one xdist group):
the first notes its folder and writes into it, the second finds it gone."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

SEEN: list[Path] = []


def test_a_test_gets_a_folder_of_its_own_in_tmp():
    folder = Path(os.environ["TMPDIR"])
    assert folder.parent == Path("/tmp") and folder.name.startswith("jr-"), folder
    assert tempfile.gettempdir() == str(folder)
    (folder / "left.txt").write_text("a file the test leaves")
    SEEN.append(folder)


def test_the_folder_goes_with_the_test_that_had_it():
    assert len(SEEN) == 1, "run the module whole: the test before names the folder"
    assert not SEEN[0].exists(), sorted(p.name for p in SEEN[0].iterdir())
    assert Path(os.environ["TMPDIR"]) != SEEN[0]
