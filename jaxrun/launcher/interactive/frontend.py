"""``jaxrun -i``: an interactive session over any launch, and its two frontends.

The run is the same as a script's: the same backends, the same attempt and
the same supervision, in a thread of its own (``drive``), while the main
thread keeps the frontend, which owns the signals as Python's console does:

- ``Console``, for a person at a terminal: Python's own console rules
  (``code.InteractiveConsole``) read each block; readline gives line editing
  and the history, kept in ``$XDG_STATE_HOME/jaxrun/history``;
- ``Pipe``, for the Jupyter kernel (``launcher.interactive.kernel``): one JSON request a
  line on stdin, one JSON reply a line on the stdout it was started with.

Every process runs every statement (``child.controllers.console``); the
replies are merged (``launcher.interactive.merge``).  Ctrl-C while a statement runs goes
to every process as SIGINT, again each second until the statement's results
are in, and the session goes on (a fourth Ctrl-C during one statement stops
the run as it stops a script); Ctrl-C at the prompt drops the line.  The
end of input (Ctrl-D) asks every process to end, and the run ends as a
script's does: exit 0.  A process that dies ends the run as it would end a
script's, with the supervisor's summary and exit status.
"""

from __future__ import annotations

import code
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from jaxrun.core import modes
from jaxrun.core.config import RunConfig
from jaxrun.core.events import Forward
from jaxrun.launcher.control import RunControl
from jaxrun.launcher.interactive import merge
from jaxrun.launcher.interactive.session import Session, listen_address
from jaxrun.wire import console, encoding

RESEND = 1.0  # after a Ctrl-C, SIGINT again this often until the statement is over
PRESSES = 3  # a Ctrl-C beyond this many during one statement stops the run, as for a script
QUIT_WAIT = 15.0  # after Ctrl-D, how long the processes may take to end before jaxrun stops them
HISTORY_LENGTH = 10000
SETTLE_WAIT = 1.0  # the longest the first prompt waits for the start-up's last line


class SessionEnded(Exception):
    """The run is over (a process died): the frontend stops reading."""


def drive(config: RunConfig, control: RunControl, attempts: Callable[..., int],
          settled: Callable[[], bool] = lambda: True) -> int:
    """Run the attempts in a thread, the frontend here; the run's exit status.
    ``attempts`` takes the session's variables for each attempt's plan;
    ``settled`` says when the start-up's joins line is done, so that the
    first prompt comes after it."""
    session = Session()

    def session_env(coordinator: str) -> dict[str, str]:
        """Asked by each attempt's plan once its coordinator is chosen."""
        return session.listen(listen_address(config.options, coordinator))

    frontend = FRONTENDS[type(config.mode)](session, control, config.options.num_processes)
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["code"] = attempts(session_env)
        except BaseException as error:  # noqa: BLE001 -- raised again in the main thread
            outcome["error"] = error
        finally:
            frontend.run_ended()

    runner = threading.Thread(target=work, name="jaxrun-session-run", daemon=True)
    frontend.runner, frontend.settled = runner, settled
    control.intercept = frontend.on_sigint
    runner.start()
    try:
        frontend.serve()
    except SessionEnded:
        pass
    finally:
        frontend.state = Frontend.CLOSING
        session.quit()
        runner.join(QUIT_WAIT)
        if runner.is_alive():  # a process that does not end: stop the run as a SIGTERM would
            control.intercept = None
            os.kill(os.getpid(), signal.SIGTERM)
            runner.join()
        session.close()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["code"]


class Frontend:
    STARTING, PROMPT, RUNNING, CLOSING = range(4)

    def __init__(self, session: Session, control: RunControl, count: int = 1):
        self.session, self.control, self.count = session, control, count
        self.state = Frontend.STARTING
        self.runner: threading.Thread | None = None
        self.over = False
        self.interrupted_at: float | None = None
        self.presses = 0  # Ctrl-C pressed during the statement that runs
        self.settled: Callable[[], bool] = lambda: True

    # -- from the run's thread, and the signal handler ----------------------------------
    def run_ended(self) -> None:
        self.over = True
        if self.state in (Frontend.PROMPT, Frontend.STARTING):  # wake a read that would wait for input
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    def on_sigint(self, signum: int) -> bool:
        if self.over and self.state != Frontend.CLOSING:
            raise SessionEnded()
        if self.state == Frontend.RUNNING:
            self.presses += 1
            if self.presses > PRESSES:  # a statement that takes no interrupt: stop as for a script
                return False
            self.interrupted_at = time.monotonic()
            self.control.events.put(Forward(signal.SIGINT))
            return True
        if self.state == Frontend.PROMPT:
            return self.at_prompt()
        return False  # starting up or closing: Ctrl-C stops the run, as for a script

    def at_prompt(self) -> bool:
        raise KeyboardInterrupt

    def going_on(self) -> bool:
        if self.over:
            return False
        if self.interrupted_at is not None and time.monotonic() - self.interrupted_at >= RESEND:
            self.interrupted_at = time.monotonic()
            self.control.events.put(Forward(signal.SIGINT))
        return True

    def wait_over(self, within: float = 60.0) -> None:
        """Until the run's thread has said all it has to say (its summary)."""
        if self.runner is not None:
            self.state = Frontend.CLOSING
            self.runner.join(within)

    def connect(self) -> bool:
        try:
            if not self.session.accept(lambda: not self.over):
                return False
            end = time.monotonic() + SETTLE_WAIT
            while not self.settled() and time.monotonic() < end and not self.over:
                time.sleep(0.01)
            return True
        except SessionEnded:
            return False

    def execute(self, source: str, mode: str) -> console.Reply | None:
        self.state, self.interrupted_at, self.presses = Frontend.RUNNING, None, 0
        try:
            return self.session.run(source, mode, self.going_on)
        finally:
            self.state = Frontend.PROMPT

    def serve(self) -> None:
        raise NotImplementedError


def history_path(environ=os.environ) -> str:
    state = environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "jaxrun", "history")


class Console(Frontend):
    def serve(self) -> None:
        if not self.connect():
            return
        count = self.session_count()
        reader = Reader(self)
        history = load_history()
        try:
            reader.interact(banner=f"jaxrun: an interactive session over {count}; every statement runs in "
                                   "each process (Ctrl-C interrupts it, Ctrl-D ends the session)", exitmsg="")
        except (SessionEnded, SystemExit):
            pass
        finally:
            self.state = Frontend.CLOSING
            save_history(history)

    def session_count(self) -> str:
        n = self.count
        return f"{n} process{'es' if n != 1 else ''}"

    def show(self, reply: console.Reply | None) -> None:
        if reply is None:
            return
        out, err = merge.render(reply.results)
        sys.stdout.write(out)
        sys.stdout.flush()
        sys.stderr.write(err)
        sys.stderr.flush()


class Reader(code.InteractiveConsole):
    """Python's console rules, each complete block sent to every process."""

    def __init__(self, frontend: Console):
        super().__init__(filename="<stdin>")
        self.frontend = frontend

    def raw_input(self, prompt: str = "") -> str:
        self.frontend.state = Frontend.PROMPT
        if self.frontend.over:
            raise SessionEnded()
        return input(prompt)

    def runsource(self, source: str, filename: str = "<input>", symbol: str = "single") -> bool:
        try:
            compiled = self.compile(source, filename, symbol)
        except (OverflowError, SyntaxError, ValueError):
            self.showsyntaxerror(filename)  # the same in every process: shown once, from here
            return False
        if compiled is None:
            return True  # more lines to come
        if says_nothing(source):  # an empty line, or only comments: nothing runs, as at Python's own prompt
            return False
        reply = self.frontend.execute(source, console.SINGLE)
        if reply is None:  # process 0 is gone: the summary comes before anything else
            self.frontend.wait_over()
            raise SessionEnded()
        if reply.results and all(r.error_name == "SystemExit" for r in reply.results):
            raise SystemExit  # exit() in every process: the session ends, as with Ctrl-D
        self.frontend.show(reply)
        return False


def says_nothing(source: str) -> bool:
    """Blank lines and comments only: Python's console compiles it to ``pass``,
    which the processes' "single" compile would take for a syntax error."""
    return all(not line.strip() or line.lstrip().startswith("#") for line in source.split("\n"))


def load_history():
    try:
        import readline
    except ImportError:
        return None
    path = history_path()
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(HISTORY_LENGTH)
    if "libedit" not in (readline.__doc__ or ""):
        readline.parse_and_bind("tab: tab-insert")  # no completion of names the processes hold
    return readline, path


def save_history(history) -> None:
    if history is None:
        return
    readline, path = history
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        readline.write_history_file(path)
    except OSError:
        pass


class Pipe(Frontend):
    """The kernel's frontend: a request a line in, a reply a line out."""

    def __init__(self, session: Session, control: RunControl, count: int = 1):
        super().__init__(session, control, count)
        self.out = os.fdopen(os.dup(1), "wb", buffering=0)
        os.dup2(2, 1)  # anything else printed goes to stderr, never into the replies
        self.parent = os.getppid()

    def at_prompt(self) -> bool:
        return True  # an interrupt between two cells interrupts nothing

    def going_on(self) -> bool:
        if os.getppid() != self.parent:  # the kernel is gone: so is the session
            raise SessionEnded()
        return super().going_on()

    def serve(self) -> None:
        if not self.connect():
            return
        try:
            self.out.write(console.SessionReady().line())
            while True:
                self.state = Frontend.PROMPT
                line = sys.stdin.buffer.readline(console.MAX_LINE)
                if not line:
                    return
                request = encoding.decode(line)
                if not isinstance(request, console.Execute):
                    raise encoding.WireError(f"a {request.WORD} where a cell belongs")
                reply = self.execute(request.code, request.mode)
                if reply is None:
                    return
                self.out.write(reply.line())
        except (SessionEnded, BrokenPipeError):
            return


# The frontend of each interactive mode.
FRONTENDS: dict[type[modes.Interactive], type[Frontend]] = {modes.Terminal: Console, modes.Jupyter: Pipe}
