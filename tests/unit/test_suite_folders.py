"""The leak guard every test gets (``fixtures.jobs.no_leftover_processes``)
gives the test a TMPDIR of its own in /tmp, and removes it when the session
ends.  Not with the test: a module's job started in one test's environment
keeps its sockets and state there for the tests after it (removed with the
test, 33 tests of a suite run had failed when it was stopped).  Never removed, one folder per test
had filled this machine's /tmp with 104,626 of them, and every walk or
listing of /tmp paid for them (a pytest run in a test's folder walked it
for 15 s).

A pytest session of its own, with the guard, runs two tests: each notes its
folder; the second finds the first's still there; after the session
neither is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

INNER = '''
import os, pathlib

NOTE = {note!r}


def test_one():
    folder = pathlib.Path(os.environ["TMPDIR"])
    (folder / "left.txt").write_text("a file the test leaves")
    with open(NOTE, "a") as f:
        f.write(f"{{folder}}\\n")


def test_two():
    first = pathlib.Path(open(NOTE).read().split()[0])
    assert (first / "left.txt").exists(), "gone before the session ended"
    with open(NOTE, "a") as f:
        f.write(os.environ["TMPDIR"] + "\\n")
'''


def test_each_tests_folder_in_tmp_goes_when_the_session_ends(tmp_path):
    note = tmp_path / "seen.txt"
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER.format(note=str(note))))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "fixtures.jobs",
                           "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    folders = [Path(line) for line in note.read_text().split()]
    assert len(folders) == 2 and folders[0] != folders[1], folders
    assert all(f.parent == Path("/tmp") and f.name.startswith("jr-") for f in folders), folders
    assert not any(f.exists() for f in folders), [f for f in folders if f.exists()]
