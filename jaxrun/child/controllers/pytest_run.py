"""Child side of the pytest plugin: one controller's pytest run.

Started by :mod:`jaxrun.pytest_plugin` through jaxrun as
``python -m jaxrun.child.controllers.pytest_run PYTEST_ARGS``; the marked test
then runs inline in every controller.
"""

from __future__ import annotations

import os
import sys

import pytest

from jaxrun import contract
from jaxrun.child import ending


class ControllerPlugin:
    """Registered only by this module's runner, inside each controller.

    A failed test must end its process at once: otherwise pytest moves on and
    exits normally, and JAX's shutdown barrier holds the process for up to
    300 s waiting for peers that may be stuck in a collective with it.  The
    failure goes to the error file jaxrun's shim uses, so the launcher's
    summary, report and JUnit output show it like any uncaught exception.
    """

    def __init__(self) -> None:
        self.exceptions: dict[tuple[str, str], BaseException] = {}

    def pytest_configure(self, config: pytest.Config) -> None:
        config.addinivalue_line("markers", contract.PYTEST_MARKER_HELP)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        yield
        if call.excinfo is not None:
            self.exceptions[(item.nodeid, call.when)] = call.excinfo.value

    def pytest_runtest_logreport(self, report) -> None:
        if report.skipped:
            self.note_skip(report)
        if report.failed:
            exc = self.exceptions.get((report.nodeid, report.when))
            self.fail_now(f"{report.nodeid} failed in {report.when}", report.longreprtext, exc)

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.fail_now(f"collecting {report.nodeid} failed", report.longreprtext, None)

    @staticmethod
    def note_skip(report) -> None:
        """Tell the parent, which would otherwise see a clean exit and call it a pass."""
        workdir = os.environ.get(contract.PYTEST_WORKDIR)
        if not workdir:
            return
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        rank = os.environ.get(contract.PROCESS_ID, "0")
        with open(os.path.join(workdir, f"skipped-{rank}"), "w") as f:
            f.write(reason.removeprefix("Skipped: "))

    @staticmethod
    def fail_now(what: str, text: str, exc: BaseException | None) -> None:
        sys.stderr.write(f"{text}\njaxrun: {what}\n")
        if exc is None:
            exc = RuntimeError(what)
        ending.record_error(exc, text + "\n")
        ending.exit_now(1)


def main(argv: list[str]) -> None:
    """One controller's pytest, started by the plugin through jaxrun."""
    code = pytest.main(argv, plugins=[ControllerPlugin()])
    if code != 0:
        # e.g. nothing collected (5): leave now, not after the shutdown barrier.
        ending.exit_now(int(code))


if __name__ == "__main__":
    main(sys.argv[1:])
