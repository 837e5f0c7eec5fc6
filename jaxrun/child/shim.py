"""Child side: runs first in every controller, before the user's code.

Started as ``python -m jaxrun.shim -- SCRIPT ARGS...`` or
``python -m jaxrun.shim -m MODULE ARGS...``.  In order, it:

1. watches the launcher's lifeline pipe, so the whole process group dies if
   the launcher does (even by SIGKILL);
2. registers ``faulthandler`` on SIGUSR1, so the launcher can ask for a stack
   dump of every thread at any time;
3. calls ``jax.distributed.initialize`` with the launcher's values and makes a
   later call from the user's script a checked no-op;
4. builds the global mesh when one was asked for;
5. runs the user's script or module as ``__main__``, exactly as ``python``
   would, and on an uncaught exception prints a traceback of the user's frames
   only and exits at once instead of waiting in JAX's shutdown barrier.

It reads only the environment contract in :mod:`jaxrun.contract`.  Its
stable command-line name is ``jaxrun.shim`` (see ``jaxrun/shim.py``).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import traceback

from jaxrun import contract

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


def exit_now(code: int) -> None:
    """Flush and leave without running atexit hooks (JAX's shutdown barrier)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def record_error(exc: BaseException, text: str) -> None:
    path = os.environ.get(contract.ERROR_FILE)
    if path:
        contract.ErrorRecord.of(exc, text).dump(path)


def user_traceback(exc: BaseException) -> str:
    """The traceback as the user's own script would show it: shim frames dropped."""
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
    watch_lifeline()
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    if len(argv) < 2 or argv[0] not in ("--", "-m"):
        print(USAGE, file=sys.stderr)
        exit_now(2)
    is_module, name, args = argv[0] == "-m", argv[1], argv[2:]

    from jaxrun.child import bootstrap

    try:
        bootstrap.initialize_from_env()
    except bootstrap.BootstrapError as e:
        print(f"jaxrun: {e}", file=sys.stderr)
        record_error(e, f"{type(e).__name__}: {e}\n")
        exit_now(1)
    run_target(is_module, name, args)


def run_target(is_module: bool, name: str, args: list[str]) -> None:
    import runpy

    try:
        if is_module:
            sys.argv = [name] + args  # runpy replaces argv[0] with the module's path
            sys.path[0] = os.getcwd()
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            sys.argv = [name] + args
            sys.path[0] = os.path.dirname(os.path.abspath(name))
            runpy.run_path(name, run_name="__main__")
    except SystemExit as e:
        code = _exit_code(e)
        if code != 0:
            exit_now(code)
        raise
    except BaseException as e:  # noqa: BLE001 - every uncaught error ends the process
        text = user_traceback(e)
        sys.stderr.write(text)
        record_error(e, text)
        exit_now(130 if isinstance(e, KeyboardInterrupt) else 1)


def _exit_code(e: SystemExit) -> int:
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code
    print(e.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main(sys.argv[1:])
