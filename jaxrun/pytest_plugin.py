"""pytest plugin: run one test in every controller of a multi-process JAX job.

    @pytest.mark.jaxrun(n=4, cpu_devices=2)
    def test_global_sum():
        import jax
        assert jax.process_count() == 4

The pytest you start (the *parent*) does not run such a test's body.  It runs

    jaxrun -n 4 --cpu-devices 2 ... -m jaxrun.pytest_plugin /abs/test_file.py::test_global_sum

and every controller runs a pytest of its own on that one test, with
``jax.distributed`` already initialized by jaxrun's shim.  The test passes when
every controller passes.  When one fails, the parent's report names the
process that failed first and shows its assertion and traceback, read from the
error file that process left behind, instead of N copies of the cascade that
jaxrun's fail-fast stops.  One launch per test: the startup cost (four
``import jax``, the coordination service) is paid once per marked test, and
plain tests in the same session pay nothing; this module never imports jax.

Marker arguments: ``n`` (controllers, default 2), ``cpu_devices`` (simulated
CPU devices per controller), ``mesh`` (jaxrun's ``--mesh`` spec) and
``timeout`` (seconds; jaxrun dumps every stack and stops the job).  Fixtures
of a marked test are set up in the parent and again in each controller, so
keep them cheap and free of device work.

Inside a controller (``contract.PROCESS_ID`` is set) marked tests run inline, so
``jaxrun -n 4 -m pytest tests/`` also works.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from jaxrun import contract

MARKER = "jaxrun"
MARKER_HELP = contract.PYTEST_MARKER_HELP
# After the parent is interrupted: jaxrun's grace for its controllers, then
# how much longer the parent waits for jaxrun before killing it.
CHILD_GRACE = 5.0
LAUNCHER_WAIT = 10.0
# What the parent reads back from the test's private folder, at most: one
# skip reason per controller, and jaxrun's --report.
SKIP_REASON_MAX = 64 << 10
REPORT_MAX = 64 << 20


@dataclasses.dataclass(frozen=True)
class JaxrunMark:
    n: int = 2
    cpu_devices: int | None = None
    mesh: str | None = None
    timeout: float | None = None


WORKDIR_ENV = contract.PYTEST_WORKDIR


def mark_options(args: tuple, kwargs: dict) -> JaxrunMark:
    """The marker's arguments, checked: a typo fails the run instead of being ignored."""
    try:
        opts = JaxrunMark(*args, **kwargs)
    except TypeError as e:
        raise pytest.UsageError(f"@pytest.mark.jaxrun: {e}") from None
    if not isinstance(opts.n, int) or opts.n < 1:
        raise pytest.UsageError(f"@pytest.mark.jaxrun: n must be a positive int, got {opts.n!r}")
    return opts


def in_controller(environ=os.environ) -> bool:
    return contract.PROCESS_ID in environ


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


# -- parent side ------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    marker = pyfuncitem.get_closest_marker(MARKER)
    if marker is None or in_controller():
        return None  # pytest calls the function itself
    run_in_controllers(pyfuncitem, mark_options(marker.args, marker.kwargs))
    return True


def jaxrun_command(opts: JaxrunMark, config: pytest.Config, nodeid: str, workdir: str) -> list[str]:
    """The launcher's command line for one test; pure."""
    cmd = [sys.executable, "-m", "jaxrun", "-n", str(opts.n), "--grace", str(CHILD_GRACE)]
    if opts.cpu_devices is not None:
        cmd += ["--cpu-devices", str(opts.cpu_devices)]
    if opts.mesh is not None:
        cmd += ["--mesh", opts.mesh]
    if opts.timeout is not None:
        cmd += ["--timeout", str(opts.timeout)]
    cmd += [
        "--output", "stream",  # the console hides stack dumps; they stay in the logs
        "--log-dir", os.path.join(workdir, "logs"),
        "--report", os.path.join(workdir, "report.json"),
        "-x", f"{WORKDIR_ENV}={workdir}",  # where controllers note a skip
        "-m", contract.PYTEST_CONTROLLER_MODULE,
    ]
    return cmd + controller_pytest_args(config, nodeid, workdir)


def controller_pytest_args(config: pytest.Config, nodeid: str, workdir: str) -> list[str]:
    rootdir = str(config.rootpath)
    args = [
        os.path.join(rootdir, nodeid),  # the nodeid is relative to rootdir, not to the cwd
        "--rootdir", rootdir,
        # Output goes straight to jaxrun's per-process logs: a stack dump requested
        # by --timeout writes to fd 2, which pytest's capture would swallow.
        "--capture=no",
        "-q",
        "-p", "no:cacheprovider",  # N processes writing one .pytest_cache
        "--basetemp", os.path.join(workdir, "tmp-{process_id}"),  # jaxrun fills in the rank
        f"--import-mode={config.option.importmode}",
    ]
    if config.inipath is not None:
        args += ["-c", str(config.inipath)]
    for override in config.option.override_ini or ():
        args += ["-o", override]
    return args


def run_in_controllers(item: pytest.Function, opts: JaxrunMark) -> None:
    __tracebackhide__ = True
    workdir = tempfile.mkdtemp(prefix="jaxrun-pytest-")
    code, console = run_launcher(jaxrun_command(opts, item.config, item.nodeid, workdir))
    if code == 0:
        skips = read_skips(workdir)
        shutil.rmtree(workdir, ignore_errors=True)
        if skips:
            ranks = ", ".join(str(r) for r in sorted(skips))
            pytest.skip(f"skipped in process {ranks} of {opts.n}: {skips[min(skips)]}")
        return
    item.add_report_section("call", "jaxrun", console)
    pytest.fail(failure_text(code, read_report(workdir), console, opts.n, workdir), pytrace=False)


def run_launcher(cmd: list[str]) -> tuple[int, str]:
    """Run jaxrun to the end; stdout and stderr together, in the order printed.

    No new session: a Ctrl-C at the terminal reaches jaxrun too, and jaxrun
    forwards it.  If the parent is interrupted some other way (pytest-timeout),
    jaxrun is asked to stop, and killed if it does not; its controllers die
    with it either way (they watch its lifeline pipe)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate()
    except BaseException:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=CHILD_GRACE + LAUNCHER_WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        raise
    return proc.returncode, out.decode("utf-8", "replace")


def read_skips(workdir: str) -> dict[int, str]:
    """Reasons the controllers skipped the test, by rank."""
    skips = {}
    for name in os.listdir(workdir):
        if name.startswith("skipped-"):
            reason = contract.read_small(os.path.join(workdir, name), SKIP_REASON_MAX)
            skips[int(name.removeprefix("skipped-"))] = (reason or b"").decode("utf-8", "replace")
    return skips


def read_report(workdir: str) -> dict | None:
    data = contract.read_small(os.path.join(workdir, "report.json"), REPORT_MAX)
    try:
        return None if data is None else json.loads(data)
    except ValueError:
        return None  # jaxrun stopped before launching: its console says why


def failure_text(code: int, report: dict | None, console: str, n: int, workdir: str) -> str:
    """The parent's failure message: the root cause first, then what became of the rest."""
    # jaxrun's own one-line verdicts; its indented details repeat the traceback.
    summary = [
        line for line in console.splitlines()
        if (line.startswith("jaxrun: ") and not line.startswith("jaxrun:  ")) or " was at " in line
        or " were at " in line
    ]
    cause = report.get("root_cause") if report else None
    if cause:
        exc = cause.get("exception")
        head = f"process {cause['process_id']} of {n} failed first ({cause['exit']})"
        if exc:
            head += f": {exc['type']}: {exc['message'].splitlines()[0] if exc['message'] else ''}".rstrip()
            body = exc.get("traceback", "")
        else:
            body = "\n".join(cause.get("stderr_tail") or [])
        lines = [head, "", body.rstrip(), ""]
        lines += [line for line in summary if " failed first" not in line]
    elif report and report["attempts"][-1]["stop_reason"] == "timeout":
        lines = [f"jaxrun: the test did not finish in every controller before its timeout ({n} processes)", ""]
        lines += [line for line in console.splitlines() if line.startswith("jaxrun:")]
    else:
        lines = [f"jaxrun exited with code {code}", ""] + console.splitlines()[-30:]
    lines.append(f"jaxrun's logs and report: {workdir}")
    return "\n".join(lines)
