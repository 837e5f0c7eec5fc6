"""One controller's interactive session: what ``jaxrun -i`` runs in every process.

The shim starts this module as ``-m`` in place of a script, after its usual
preparation.  The process joins the job at once (the coordination service's
key-value store carries the session), and then runs every statement the
launcher sends, in its own fresh ``__main__``:

- process 0 reads each request from the launcher's connection and puts it in
  the key-value store; the others wait for it there;
- every process runs it with its ``sys.stdout`` and ``sys.stderr`` captured
  and still written to its own output (the logs hold the session), then
  process 0 gathers every result from the store and sends them back;
- SIGINT (Ctrl-C, forwarded) raises KeyboardInterrupt in the statement that
  runs; between statements it is ignored, so the session goes on.

See :mod:`jaxrun.wire.console` for the messages.
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import socket
import sys
import traceback

from jaxrun import contract
from jaxrun.child import shim
from jaxrun.child.join import bootstrap
from jaxrun.wire import console, encoding

WAIT_MS = 250  # each key-value wait is this short, so that a stop is heard between two


class Capture(io.TextIOBase):
    """A text stream that keeps what is written and passes it on."""

    def __init__(self, through):
        self.through, self.parts = through, []

    def write(self, text: str) -> int:
        self.parts.append(text)
        try:
            self.through.write(text)
        except (OSError, ValueError):
            pass
        return len(text)

    def flush(self) -> None:
        try:
            self.through.flush()
        except (OSError, ValueError):
            pass

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        return "".join(self.parts)

    @property
    def encoding(self):
        return getattr(self.through, "encoding", "utf-8")


def _quiet(signum, frame) -> None:
    """SIGINT between two statements: the statement it was meant for is over."""


class Runner:
    """Runs requests in one ``__main__``, the way Python's console or a notebook would."""

    def __init__(self, rank: int):
        self.rank = rank
        self.main = shim.fresh_main()
        self.displays: list[dict] = []
        self.formatter = None
        self.patched = False

    def run(self, request: console.Execute) -> console.Result:
        out, err = Capture(sys.stdout), Capture(sys.stderr)
        echo = "".join(f"{'>>> ' if i == 0 else '... '}{line}\n" for i, line in enumerate(request.code.splitlines()))
        sys.stdout.write(echo)  # the input, in this process's log
        sys.stdout.flush()
        self.displays = []
        value = error = name = None
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            # Ctrl-C interrupts the statement, and nothing after it: the
            # handler goes back before an interrupt could reach this code.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                if request.mode == console.CELL:
                    self._patch_display()
                    value = self._run_cell(request.code)
                else:
                    exec(compile(request.code, "<stdin>", "single", dont_inherit=True), self.main.__dict__)
            finally:
                signal.signal(signal.SIGINT, _quiet)
        except BaseException as e:  # noqa: BLE001 - the session shows every error and goes on
            # exit() everywhere ends the session, as Ctrl-D does (the launcher decides).
            error = f"SystemExit: {e.code!r}\n" if isinstance(e, SystemExit) else _traceback(e)
            name = type(e).__name__
            saved[1].write(error)
        finally:
            sys.stdout, sys.stderr = saved
            out.flush()
            err.flush()
        return console.Result(self.rank, console.clip(out.text()), console.clip(err.text()),
                              error and console.clip(error), name, value, tuple(self.displays))

    def _run_cell(self, code: str) -> dict | None:
        import ast

        tree = ast.parse(code, "<cell>")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<cell>", "exec", dont_inherit=True), self.main.__dict__)
        if last is None:
            return None
        result = eval(compile(last, "<cell>", "eval", dont_inherit=True), self.main.__dict__)
        if result is None:
            return None
        self.main.__dict__["_"] = result
        return self.bundle(result) if self.rank == 0 else None

    def bundle(self, obj) -> dict:
        """The object's MIME bundle, as IPython formats it (repr alone without IPython)."""
        if self.formatter is None:
            try:
                from IPython.core.formatters import DisplayFormatter

                self.formatter = DisplayFormatter()
            except ImportError:
                self.formatter = False
        if self.formatter:
            data, _ = self.formatter.format(obj)
            return {k: v for k, v in data.items() if isinstance(v, (str, dict, list))}
        return {"text/plain": repr(obj)}

    def _patch_display(self) -> None:
        """``IPython.display.display`` collects bundles (process 0's are shown)."""
        if self.patched:
            return
        self.patched = True
        try:
            import IPython.core.display_functions as functions
            import IPython.display as public
        except ImportError:
            return

        def display(*objs, **kwargs):
            if self.rank == 0:
                self.displays.extend(self.bundle(obj) for obj in objs)

        functions.display = public.display = display


def _traceback(e: BaseException) -> str:
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next  # this module's frames are not the user's
    return "".join(traceback.format_exception(type(e), e, tb))


# -- the key-value store ----------------------------------------------------------------
class Store:
    def __init__(self):
        from jax._src import distributed

        self.client = distributed.global_state.client

    def put(self, key: str, value: str) -> None:
        try:
            self.client.key_value_set(key, value)
        except Exception as e:  # noqa: BLE001 - jax's own error type
            if "ALREADY_EXISTS" not in str(e):
                raise

    def get(self, key: str) -> str:
        while True:
            try:
                return self.client.blocking_key_value_get(key, WAIT_MS)
            except Exception as e:  # noqa: BLE001 - jax's own error type
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise

    def delete(self, key: str) -> None:
        try:
            self.client.key_value_delete(key)
        except Exception:  # noqa: BLE001 - a key that is gone already
            pass


def connect(address: str, secret: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host.strip("[]"), int(port)), timeout=30)
    sock.settimeout(None)
    sock.sendall(console.SessionHello(secret).line())
    return sock


def result_of(text: str) -> console.Result:
    """Another process's result, as it put it in the store."""
    result = encoding.decode(text)
    if not isinstance(result, console.Result):
        raise encoding.WireError(f"a {result.WORD} where a result belongs")
    return result


def serve(rank: int, count: int, link, store: Store | None) -> None:
    runner = Runner(rank)
    number = 0
    while True:
        if rank == 0:
            line = link.readline(console.MAX_LINE)
            said = encoding.decode(line) if line else None  # the link's end ends the session,
            request = console.Quit(number)  # and so does anything but a statement
            if isinstance(said, console.Execute):
                request = dataclasses.replace(said, number=number)  # numbered by the session's own count
            if store is not None:
                store.put(console.request_key(number), request.encode().decode())
        else:
            request = encoding.decode(store.get(console.request_key(number)))
        if not isinstance(request, console.Execute):
            return
        result = runner.run(request)
        if rank == 0:
            results = [result]
            for other in range(1, count):
                key = console.result_key(number, other)
                results.append(result_of(store.get(key)))
                store.delete(key)
            if number:
                store.delete(console.request_key(number - 1))
            link.write(console.Reply(number, tuple(results)).line())
            link.flush()
        else:
            store.put(console.result_key(number, rank), result.encode().decode())
        number += 1


def main() -> None:
    address = os.environ.pop(contract.CONSOLE_ADDRESS, None)
    secret = os.environ.pop(contract.CONSOLE_SECRET, None)
    rank, count, _ = contract.identity_from_env(os.environ)
    signal.signal(signal.SIGINT, _quiet)
    sys.argv = [""]
    bootstrap.ensure_initialized()  # the session's store is the coordination service's
    store = Store() if count > 1 else None
    link = None
    if rank == 0:
        if not address or not secret:
            raise SystemExit(f"jaxrun: {contract.CONSOLE_ADDRESS} is not set; start this with jaxrun -i")
        link = connect(address, secret).makefile("rwb")
    serve(rank, count, link, store)


if __name__ == "__main__":
    main()
