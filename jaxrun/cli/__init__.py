"""The ``jaxrun`` command line: ``entry_point`` is the console script.

``command`` declares the command and its options, ``params`` the kinds of
value they take, and ``helptext`` what --help and --help-all print.
``jaxrun.launcher.setup.configure`` turns the parsed values into a
``RunConfig``, and ``jaxrun.launcher.run.run`` does the work."""

from __future__ import annotations

import errno
import os
import sys

import click

from jaxrun.cli.command import backend_option, kernel, main
from jaxrun.cli.helptext import HELP_SECTIONS, SHORT_HELP, help_sections
from jaxrun.cli.params import HostPort, KeyValue, MeshSpecType, RankList, Seconds, Variable
from jaxrun.core.config import LaunchError, OutOfFiles
from jaxrun.core.spec import PlanError

__all__ = ["HELP_SECTIONS", "SHORT_HELP", "HostPort", "KeyValue", "MeshSpecType", "RankList", "Seconds", "Variable",
           "backend_option", "entry_point", "help_sections", "kernel", "main"]


def entry_point(argv: list[str] | None = None) -> None:
    """Console-script entry: click's errors become one line and exit 2.  As
    the command itself (no ``argv`` given), it leaves as ``leave`` says."""
    if argv is None:
        try:
            _entry(sys.argv[1:])
        except SystemExit as e:
            leave(e.code)
        leave(0)
    _entry(list(argv))


def leave(code) -> None:
    """Exit with ``code`` as ``sys.exit`` would, but without the
    interpreter's teardown of every module the launcher loaded (~20 ms of a
    short run's wall time): once only the main thread is left, the exit
    hooks run and the standard streams are flushed, which is what that
    teardown would still do that matters.  With a thread still running,
    the plain exit."""
    import atexit
    import threading

    if threading.active_count() != 1:
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code & 0xFF)


def _entry(argv: list[str]) -> None:
    command, prog = main, "jaxrun"
    if argv[:1] == ["k8s"]:  # a subcommand without making `jaxrun SCRIPT` a click group
        from jaxrun import k8s

        command, prog, argv = k8s.command, "jaxrun k8s", argv[1:]
    elif argv[:1] == ["logs"] and not os.path.isfile("logs"):  # a script named "logs" still runs
        from jaxrun.launcher.output import logs

        command, prog, argv = logs.command, "jaxrun logs", argv[1:]
    elif argv[:1] == ["probe"] and not os.path.isfile("probe"):
        from jaxrun.cli import probe

        command, prog, argv = probe.command, "jaxrun probe", argv[1:]
    elif argv[:1] == ["kernel"] and not os.path.isfile("kernel"):
        command, prog, argv = kernel, "jaxrun kernel", argv[1:]
    elif argv[:1] in (["stacks"], ["top"], ["profile"]) and not os.path.isfile(argv[0]):  # looking into a running job
        from jaxrun.launcher.inspect import profile, stacks, top

        command = {"stacks": stacks.command, "top": top.command, "profile": profile.command}[argv[0]]
        prog = f"jaxrun {argv[0]}"
        argv = argv[1:]
    try:
        code = command.main(args=argv, prog_name=prog, standalone_mode=False)
        if isinstance(code, int) and code:  # without standalone mode, click returns a raised Exit's status
            sys.exit(code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        _error_line(e.format_message())
    except (LaunchError, PlanError) as e:
        _error_line(str(e))
    except OutOfFiles as e:
        _internal_error_line(str(e))
    except OSError as e:
        if e.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        from jaxrun.launcher.setup.limits import out_of_files_line

        _internal_error_line(out_of_files_line(e))  # the run's finally has killed what it started
    except click.Abort:
        sys.exit(130)


def _internal_error_line(message: str) -> None:
    """jaxrun's own failure: one line, exit 70."""
    from jaxrun.core.outcome import INTERNAL_ERROR  # here: its dataclasses cost every run's start 10 ms

    _error_line(message, INTERNAL_ERROR)


def _error_line(message: str, code: int = 2) -> None:
    """The refusal, in one write (line and newline together, however
    stderr is buffered: mpirun merges its tasks' stderr at write
    boundaries), and exit 2 (or ``code``)."""
    sys.stderr.write(f"jaxrun: error: {message}\n")
    sys.stderr.flush()
    sys.exit(code)
