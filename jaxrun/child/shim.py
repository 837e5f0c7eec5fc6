"""Child side: runs first in every controller, before the user's code.

Started as ``python -m jaxrun.shim -- SCRIPT ARGS...`` or
``python -m jaxrun.shim -m MODULE ARGS...`` (the stable name; see
``jaxrun/shim.py``).  In order, it:

1. unblocks SIGINT, SIGTERM and SIGHUP, which the agent that started it may
   hold blocked, and watches the launcher's lifeline pipe, so the whole
   process group dies if the launcher does (even by SIGKILL);
2. takes SIGUSR1 as the launcher's ask for a dump of every thread's stack,
   at any time (:mod:`jaxrun.child.watch.dumps`), and SIGUSR2 as its ask for a trace
   (:mod:`jaxrun.child.watch.profiling`), where it named a trace folder;
3. arranges, without importing jax, that the process joins the job before
   jax creates a backend (see :mod:`jaxrun.child.join.bootstrap`);
4. installs the checks and the marks (patches that wait for the script's
   ``import jax``), and starts the stall watchdog
   (:mod:`jaxrun.child.watch.activity`) where the launcher asks for one; the
   time account (:mod:`jaxrun.child.watch.accounting`) begins at the join,
   on the same sampler thread (:mod:`jaxrun.child.watch.sampler`);
5. runs the user's script or module as the real ``__main__``, as ``python``
   would, and on an uncaught exception prints a traceback of the user's
   frames only and exits at once instead of waiting in JAX's shutdown barrier.

It reads only the environment contract in :mod:`jaxrun.contract`, and
imports only what the launcher asked for: a process pays at start-up for
the watches and checks that are on, and the rest loads where first used.
"""

from __future__ import annotations

import _signal as signal  # not signal's enums: contract.STOP_SIGNALS says why
import builtins
import importlib.machinery
import os
import sys
import threading
import types

from jaxrun import contract
from jaxrun.child.ending import exit_now, fail, record_error
from jaxrun.child.watch import dumps

USAGE = f"usage: python -m {contract.SHIM_MODULE} (-- SCRIPT | -m MODULE) [ARGS...]"


def watch_lifeline() -> None:
    fd_text = os.environ.pop(contract.LIFELINE_FD, None)
    if not fd_text:
        return
    fd = int(fd_text)
    os.set_inheritable(fd, False)

    def wait_for_eof() -> None:
        try:
            while os.read(fd, 1):
                pass
        except OSError:
            pass
        # The launcher is gone: take the whole process group (grandchildren too).
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=wait_for_eof, name="jaxrun-lifeline", daemon=True).start()


def user_traceback(exc: BaseException) -> str:
    """The traceback as the user's own script would show it: shim frames dropped."""
    import traceback  # here: a script that raises nothing never pays for it

    tb = exc.__traceback__
    # Skip frames that belong to the shim and runpy, up to the user's first frame.
    while tb is not None and _is_launch_frame(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


# This module and the ``python -m jaxrun.shim`` entry that calls it.
_SHIM_FILES = {__file__, os.path.join(os.path.dirname(os.path.dirname(__file__)), "shim.py")}


def _is_launch_frame(filename: str) -> bool:
    return filename in _SHIM_FILES or os.path.basename(filename) == "runpy.py" or filename.startswith("<frozen runpy")


def main(argv: list[str]) -> None:
    # As under a plain launch, a script can be stopped: a far end may hold the
    # stop signals blocked so that the launcher alone decides what they mean
    # (jaxrun.backends.shield), a mask is inherited through exec, and a signal
    # sent before now was held and arrives here.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, contract.STOP_SIGNALS)
    watch_lifeline()
    dumps.install()  # SIGUSR1: a dump of every thread's stack
    if os.environ.get(contract.PROFILE_DIR):
        from jaxrun.child.watch import profiling

        profiling.install()  # SIGUSR2: start or stop a trace, in the folder the launcher named
    if len(argv) < 2 or argv[0] not in ("--", "-m"):
        print(USAGE, file=sys.stderr)
        exit_now(2)
    is_module, name, args = argv[0] == "-m", argv[1], argv[2:]

    from jaxrun.child.join import bootstrap, compile_cache

    compile_cache.apply()  # the attempts' shared cache: before anything imports jax (--mesh, in prepare)
    try:
        launch = bootstrap.prepare()
        install_checks(os.environ, launch.rank, launch.count)
        bootstrap.begin()  # --mesh joins now; a forked controller's JAX_* settings wait for its import
    except bootstrap.BootstrapError as e:
        fail(e)
    set_title(is_module, name, args)
    if os.environ.get(contract.STALL_TIMEOUT):
        from jaxrun.child.watch import activity

        activity.start()  # --stall-timeout: from the script's first line on (the account joins it at the join)
    run_target(is_module, name, args)


def install_checks(environ, rank: int, count: int) -> None:
    """What watches the script's programs, before any of them runs: the
    flight recorder and the divergence check where a mode asks, the guide's
    checks (``--checks``), and the goodput's marks.  Each patches jax when
    the script imports it, in this order; none imports jax now.  The
    recorder's hook wraps the checks' (a program's first run waits there for
    its group), so that ``--check-divergence`` judges a call before it waits."""
    from jaxrun.child import checks
    from jaxrun.child.watch import marks

    checks.prepare(environ, rank, count)
    if environ.get(contract.FLIGHT_RECORDER) or environ.get(contract.CHECK_DIVERGENCE) == "1":
        from jaxrun.child.checks import flight  # its hook (and dataclasses, re) only where a mode is on

        flight.prepare(environ, rank, count)
    marks.prepare(environ)


def set_title(is_module: bool, name: str, args: list[str]) -> None:
    """What ps, top, htop and py-spy show: "jaxrun: process 2/4 train.py
    --lr 3e-4", not a forked server's command line or the shim's.  Within
    the original argv area only (SPT_NOENV): the environment block stays
    where /proc/PID/environ shows it."""
    rank, count = os.environ.get(contract.PROCESS_ID), os.environ.get(contract.NUM_PROCESSES)
    if rank is None or count is None:
        return
    setproctitle = title_setter()
    if setproctitle is None:
        return
    target = f"-m {name}" if is_module else os.path.basename(name)
    ours = "SPT_NOENV" not in os.environ
    os.environ["SPT_NOENV"] = "1"  # read when the title is first set, not at import
    try:
        setproctitle(" ".join([f"jaxrun: process {rank}/{count}", target, *args]))
    finally:
        if ours:
            del os.environ["SPT_NOENV"]  # not the script's business


_TITLE_MODULE = "setproctitle._setproctitle"


def title_setter():
    """setproctitle's C function, or None where it is not installed.  Its
    package's Python part imports ``logging``, a third of what the shim
    added to every process's start-up; the C module alone needs nothing.  It
    is loaded under its own name, where a later ``import setproctitle``
    (the script's) finds it."""
    loaded = sys.modules.get("setproctitle") or sys.modules.get(_TITLE_MODULE)
    if loaded is not None:
        return getattr(loaded, "setproctitle", None)
    import importlib.util

    try:
        package = importlib.util.find_spec("setproctitle")  # finds it, runs nothing of it
        where = package.submodule_search_locations if package is not None else None
        spec = importlib.machinery.PathFinder.find_spec(_TITLE_MODULE, where) if where else None
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, ValueError):
        return None
    sys.modules[_TITLE_MODULE] = module
    return getattr(module, "setproctitle", None)


def fresh_main() -> types.ModuleType:
    """A new ``__main__`` that stays in ``sys.modules`` until the interpreter
    ends, as python's own does: module-level objects (an unclosed file) are
    finalized at exit, and pickle finds what the script defines."""
    module = types.ModuleType("__main__")
    module.__dict__["__builtins__"] = builtins
    if "__annotations__" in vars(sys.modules["__main__"]):
        module.__dict__["__annotations__"] = {}  # as this python gives every __main__
    sys.modules["__main__"] = module
    return module


def run_target(is_module: bool, name: str, args: list[str]) -> None:
    try:
        if is_module:
            run_module(name, args)
        else:
            run_script(name, args)
    except SystemExit as e:
        code = _exit_code(e)
        if code != 0:
            _script_ended()
            exit_now(code)
        script_returned()
        raise
    except BaseException as e:  # noqa: BLE001 - every uncaught error ends the process
        text = user_traceback(e)
        sys.stderr.write(text)
        record_error(e, text)
        _script_ended()
        exit_now(130 if isinstance(e, KeyboardInterrupt) else 1)
    else:
        script_returned()


def script_returned() -> None:
    """The script is over and the process is in JAX's shutdown: the checks
    settle, and the flight recorder, the account and the watchdog say so
    (each where it was loaded)."""
    for name in ("jaxrun.child.checks", "jaxrun.child.checks.flight",
                 "jaxrun.child.watch.accounting",  # its last record, before the watchdog's last word
                 "jaxrun.child.watch.activity"):
        module = sys.modules.get(name)
        if module is not None:
            module.script_returned()
    _script_ended()


def _script_ended() -> None:
    """The script returned or failed: the account's last record (a failed
    one's too: the run's goodput reads its time from it), then the marks."""
    account = sys.modules.get("jaxrun.child.watch.accounting")
    if account is not None:
        account.script_returned()
    marks = sys.modules.get("jaxrun.child.watch.marks")
    if marks is not None:
        marks.script_ended()


def run_script(name: str, args: list[str]) -> None:
    """As ``python SCRIPT ARGS``: ``__file__`` absolute (cwd joined as python
    joins it), ``sys.path[0]`` the script's real folder, a real loader."""
    sys.argv = [name] + args
    path = name if os.path.isabs(name) else os.getcwd() + os.sep + name
    if not os.path.isfile(path):  # a folder or a zip with __main__.py: python hands those to runpy too
        import runpy

        sys.path[0] = name
        runpy.run_path(name, run_name="__main__")
        return
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    with open(path, "rb") as f:
        source = f.read()
    code = compile(source, path, "exec", dont_inherit=True)  # the shim's __future__ flags stay here
    module = fresh_main()
    module.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __spec__=None,
        __package__=None,
    )
    exec(code, module.__dict__)


def run_module(name: str, args: list[str]) -> None:
    """As ``python -m MODULE ARGS``: runpy's own entry for ``-m``, in a real ``__main__``."""
    import runpy

    sys.argv = [name] + args  # runpy replaces argv[0] with the module's path
    sys.path[0] = os.getcwd()
    fresh_main()
    runpy._run_module_as_main(name, alter_argv=True)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main(sys.argv[1:])
