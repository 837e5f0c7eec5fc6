"""The pytest plugin: a marked test runs in every controller of a real jaxrun job."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from fixtures.jobs import ROOT

from jaxrun import pytest_plugin

pytest_plugins = ["pytester"]

# Each marked test is a job of its own: the one that fails has 4 processes, so
# that several are stopped after its root cause; the others need only 2.
INNER_TESTS = '''
import sys

import pytest


def toy_result():
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = jax.make_mesh((4, 2), ("i", "j"))
    data = np.arange(32).reshape(4, 8)
    x = jax.make_array_from_callback(data.shape, NamedSharding(mesh, P("i", "j")), lambda idx: data[idx])
    return float(jnp.sum(jnp.sin(x)))


def test_plain_test_pays_nothing():
    assert "jax" not in sys.modules


@pytest.mark.jaxrun(n=2, cpu_devices=4, timeout=60)
def test_toy_sum():
    import jax

    assert jax.process_count() == 2
    assert toy_result() == pytest.approx(-0.12398731708526611)


@pytest.mark.jaxrun(n=4, cpu_devices=2, timeout=60)
def test_only_process_2_fails():
    import jax

    result = toy_result()
    assert jax.process_index() != 2, f"process 2 sees {result}"


@pytest.mark.jaxrun(n=2, cpu_devices=1, timeout=60)
def test_skipped_by_one_process():
    import jax

    if jax.process_index() == 1:
        pytest.skip("no data for process 1")
    assert jax.process_count() == 2
'''


@pytest.mark.timeout(180)
def test_marked_tests_run_in_every_controller(pytester, monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the plugin's log folders land here
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.setenv("COLUMNS", "300")  # the short summary line is cut to the terminal width
    # Every pytest here (the parent and each controller's) loads this plugin
    # and no other: what the venv's entry points would add (xdist, timeout,
    # benchmark, hypothesis) costs each of the 9 pytests seconds on a loaded
    # machine, and none of them is under test.  The controllers get the plugin
    # as they would get it from its entry point, so that a marked test inside
    # one still runs inline (``in_controller``); the entry point itself is
    # test_explicit_p_option_works_when_the_entry_point_is_installed's.
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("PYTEST_PLUGINS", "jaxrun.pytest_plugin")
    pytester.makepyfile(test_inner=INNER_TESTS)
    result = pytester.runpytest_subprocess("-p", "jaxrun.pytest_plugin", "-p", "no:cacheprovider", "-rfEs", timeout=170)
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    # A skip inside a controller is a skip, not a pass.
    result.stdout.fnmatch_lines(["*skipped in process 1 of 2: no data for process 1*"])
    out = result.stdout.str()
    # The root cause, with its own assertion message, heads the failure...
    result.stdout.fnmatch_lines(["*FAILED test_inner.py::test_only_process_2_fails - *process 2 of 4 failed first*"])
    failure = out[out.index("test_only_process_2_fails ____"):out.index("Captured jaxrun")]
    assert "process 2 of 4 failed first (exit code 1): AssertionError: process 2 sees -0.1239873" in failure
    assert ">       assert jax.process_index() != 2" in failure
    assert "jaxrun: processes 0, 1, 3 stopped by jaxrun" in failure
    # ...and no other process is reported as failing.
    for rank in (0, 1, 3):
        assert f"process {rank} of 4 failed" not in out
    assert "(most recent call first)" not in out  # stack dumps stay in the logs


def test_plugin_import_does_not_import_jax():
    code = "import sys, jaxrun.pytest_plugin; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_entry_point_is_declared_under_the_module_name():
    tomllib = pytest.importorskip("tomllib")
    with open(ROOT / "pyproject.toml", "rb") as f:
        entry_points = tomllib.load(f)["project"]["entry-points"]["pytest11"]
    assert entry_points == {"jaxrun.pytest_plugin": "jaxrun.pytest_plugin"}


@pytest.mark.timeout(60)
def test_explicit_p_option_works_when_the_entry_point_is_installed(pytester, tmp_path, monkeypatch):
    """pluggy refuses one module under two names; the entry point's name avoids that."""
    dist = tmp_path / "site" / "jaxrun_fake-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: jaxrun-fake\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[pytest11]\njaxrun.pytest_plugin = jaxrun.pytest_plugin\n")
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}:{tmp_path / 'site'}")
    pytester.makepyfile("def test_plain():\n    pass\n")
    for args in ((), ("-p", "jaxrun.pytest_plugin")):
        result = pytester.runpytest_subprocess(*args, "--markers", timeout=50)
        assert result.ret == 0, result.stderr.str()
        result.stdout.fnmatch_lines(["@pytest.mark.jaxrun(n=2, cpu_devices=None, mesh=None, timeout=None)*"])


def test_marker_arguments_are_checked():
    opts = pytest_plugin.mark_options((), dict(n=4, cpu_devices=2, timeout=30))
    assert opts == pytest_plugin.JaxrunMark(n=4, cpu_devices=2, mesh=None, timeout=30)
    assert pytest_plugin.mark_options((3,), {}).n == 3
    with pytest.raises(pytest.UsageError, match="devices"):
        pytest_plugin.mark_options((), dict(n=4, devices=2))
    with pytest.raises(pytest.UsageError, match="positive"):
        pytest_plugin.mark_options((), dict(n=0))


def test_command_runs_one_test_per_controller(pytester):
    config = pytester.parseconfig()
    opts = pytest_plugin.JaxrunMark(n=4, cpu_devices=2, mesh="i=4,j=2", timeout=30)
    cmd = pytest_plugin.jaxrun_command(opts, config, "tests/test_x.py::test_y[a-b]", "/w")
    text = " ".join(cmd)
    assert "-n 4 --grace 5.0 --cpu-devices 2 --mesh i=4,j=2 --timeout 30" in text
    assert "--report /w/report.json" in text
    tail = cmd[cmd.index("jaxrun.child.controllers.pytest_run") + 1:]
    assert tail[0] == f"{config.rootpath}/tests/test_x.py::test_y[a-b]"
    assert "--capture=no" in tail and "/w/tmp-{process_id}" in tail


def test_failure_text_without_a_report_shows_the_console():
    text = pytest_plugin.failure_text(2, None, "jaxrun: error: script not found: x\n", 4, "/w")
    assert text.splitlines()[0] == "jaxrun exited with code 2"
    assert "jaxrun: error: script not found: x" in text


def test_failure_text_after_a_timeout_shows_where_each_process_was():
    console = textwrap.dedent("""\
        [0] .
        jaxrun: --timeout expired; stack dumps are in each process's stderr log
        jaxrun: processes 0, 1 stopped by jaxrun
        jaxrun:   process 1 was at t.py:9 in test_x: barrier()
    """)
    report = {"root_cause": None, "attempts": [{"stop_reason": "timeout"}]}
    text = pytest_plugin.failure_text(124, report, console, 2, "/w")
    assert "before its timeout" in text.splitlines()[0]
    assert "process 1 was at t.py:9 in test_x: barrier()" in text
