"""The Jupyter kernel: every cell runs in every process of a jaxrun launch.

A kernelspec written by ``jaxrun kernel install`` starts this module with
the launch options it names.  The kernel runs ``jaxrun LAUNCH OPTIONS -i``
behind it, through the same launch as the console, with the pipe frontend
(``launcher.interactive.frontend.Pipe``): one cell an ``Execute`` line in,
every process's result a ``Reply`` line out (:mod:`jaxrun.wire.console`).
The merged streams become the cell's stream output; the last expression's
value and what ``IPython.display.display`` showed come from process 0; a cell
that raised in any process ends in error, naming the ranks.

An interrupt (SIGINT to the kernel) goes to jaxrun, which sends it to every
process; a shutdown ends the session and waits for every process to end; a
restart is a shutdown and a new kernel, so new processes.

This is the one module that imports ipykernel (``pip install 'jaxrun[jupyter]'``).
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading

from jaxrun import __version__
from jaxrun.launcher.interactive import merge
from jaxrun.wire import console, encoding

END_WAIT = 15.0  # after the session is asked to end, how long jaxrun may take before SIGTERM
JOINED = re.compile(r"jaxrun: \d+/\d+ processes joined")
launch_options: list[str] = []  # from this module's command line, after "--"


def kernel_class():
    """The kernel's class: ipykernel is imported here, once the session has started."""
    from ipykernel.kernelbase import Kernel

    class JaxrunKernel(Kernel):
        implementation = "jaxrun"
        implementation_version = __version__
        language = "python"
        language_version = sys.version.split()[0]
        language_info = {"name": "python", "mimetype": "text/x-python", "file_extension": ".py",
                         "version": sys.version.split()[0], "pygments_lexer": "ipython3",
                         "codemirror_mode": {"name": "ipython", "version": 3}}
        banner = "jaxrun: every cell runs in every process"

        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.jaxrun = started[0] if started else start_jaxrun()
            self.errors: list[str] = []
            self.errors_lock = threading.Lock()
            self.stderr_reader = threading.Thread(target=self._read_stderr, name="jaxrun-stderr", daemon=True)
            self.stderr_reader.start()
            self.ready = False

        # ipykernel puts the default SIGINT handler in place around each message;
        # here SIGINT goes on to jaxrun instead.
        def pre_handler_hook(self):
            signal.signal(signal.SIGINT, self._forward_interrupt)

        def post_handler_hook(self):
            pass

        def _forward_interrupt(self, signum, frame):
            if self.jaxrun.poll() is None:
                self.jaxrun.send_signal(signal.SIGINT)

        def _read_stderr(self):
            for line in iter(self.jaxrun.stderr.readline, b""):
                with self.errors_lock:
                    self.errors.append(line.decode("utf-8", "replace"))

        def _flush_stderr(self):
            with self.errors_lock:
                text, self.errors[:] = "".join(self.errors), []
            if text:
                self.send_response(self.iopub_socket, "stream", {"name": "stderr", "text": text})

        def _reply(self, kind: type[encoding.Message]):
            """jaxrun's next line, which must be a ``kind``; None once its output has ended."""
            line = self.jaxrun.stdout.readline()
            if not line:
                return None
            said = encoding.decode(line)
            if not isinstance(said, kind):
                raise encoding.WireError(f"jaxrun said {said.WORD} where {kind.WORD} belongs")
            return said

        def _ended(self) -> dict:
            code = self.jaxrun.wait()
            self.stderr_reader.join(timeout=5)
            self._flush_stderr()
            return self._error("SessionEnded", f"the processes are gone (jaxrun exited with status {code}); "
                               "restart the kernel", [])

        def _error(self, name: str, value: str, traceback: list[str]) -> dict:
            content = {"ename": name, "evalue": value, "traceback": traceback}
            self.send_response(self.iopub_socket, "error", content)
            return {"status": "error", "execution_count": self.execution_count, **content}

        async def do_execute(self, code, silent, store_history=True, user_expressions=None, allow_stdin=False,
                             **kwargs):
            if self.jaxrun.poll() is not None:
                return self._ended()
            if not self.ready:
                if self._reply(console.SessionReady) is None:
                    return self._ended()
                self.ready = True
                with self.errors_lock:  # the start-up's progress is no output of the first cell
                    self.errors[:] = [line for line in self.errors if not JOINED.match(line)]
            try:
                self.jaxrun.stdin.write(console.Execute(code, console.CELL).line())
                self.jaxrun.stdin.flush()
            except OSError:
                return self._ended()
            reply = self._reply(console.Reply)
            if reply is None:
                return self._ended()
            results = reply.results
            self._flush_stderr()
            if not silent:
                self._publish(results)
            failed = merge.error_summary(results)
            if failed is not None:
                name, value = failed
                traceback = [line for ranks, text in merge.raised(results)
                             for line in merge.marked(ranks, text).splitlines()]
                return self._error(name, value, traceback)
            return {"status": "ok", "execution_count": self.execution_count, "payload": [], "user_expressions": {}}

        def _publish(self, results) -> None:
            out = merge.merge([(r.rank, r.out) for r in results])
            err = merge.merge([(r.rank, r.err) for r in results])
            for name, text in (("stdout", out), ("stderr", err)):
                if text:
                    self.send_response(self.iopub_socket, "stream", {"name": name, "text": text})
            first = results[0]
            for bundle in first.displays:
                self.send_response(self.iopub_socket, "display_data", {"data": bundle, "metadata": {}, "transient": {}})
            if first.value is not None:
                self.send_response(self.iopub_socket, "execute_result",
                                   {"data": first.value, "metadata": {}, "execution_count": self.execution_count})

        async def do_shutdown(self, restart):
            self.end()
            return {"status": "ok", "restart": restart}

        def end(self) -> None:
            """End the session and wait for every process to be gone."""
            if self.jaxrun.poll() is None:
                try:
                    self.jaxrun.stdin.close()  # the end of input: the session ends, every process exits
                except OSError:
                    pass
                for stop in (None, signal.SIGTERM, signal.SIGKILL):
                    if stop is not None:
                        self.jaxrun.send_signal(stop)
                    try:
                        self.jaxrun.wait(END_WAIT)
                        break
                    except subprocess.TimeoutExpired:
                        continue
            self.stderr_reader.join(timeout=5)

        async def do_is_complete(self, code):
            import codeop

            try:
                compiled = codeop.compile_command(code, "<cell>", "exec")
            except (SyntaxError, OverflowError, ValueError):
                return {"status": "invalid"}
            return {"status": "incomplete", "indent": ""} if compiled is None else {"status": "complete"}

    return JaxrunKernel


def start_jaxrun() -> subprocess.Popen:
    """``jaxrun LAUNCH OPTIONS -i`` with the pipe frontend, in a session of its
    own: an interrupt reaches it from this kernel only, once."""
    return subprocess.Popen([sys.executable, "-m", "jaxrun", *launch_options, "--kernel-pipe"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


started: list[subprocess.Popen] = []  # the session, started before the kernel's own imports


def main(argv: list[str]) -> None:
    if "--" in argv:
        cut = argv.index("--")
        launch_options[:] = argv[cut + 1:]
        argv = argv[:cut]
    started.append(start_jaxrun())  # the processes start while the kernel's app loads
    from ipykernel.kernelapp import IPKernelApp

    kernel_app = IPKernelApp.instance(kernel_class=kernel_class())
    kernel_app.initialize(argv)
    try:
        kernel_app.start()
    finally:
        if kernel_app.kernel is not None:
            kernel_app.kernel.end()


if __name__ == "__main__":
    main(sys.argv[1:])
