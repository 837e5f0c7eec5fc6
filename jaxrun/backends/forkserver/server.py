"""The far end of the fork server backend: the preloading server itself.

Started by :class:`jaxrun.backends.forkserver.client.ForkServer` as
``python -m jaxrun.backends.forkserver.server SOCKET_FD [MODULE...]``.  It imports jax (and any
``--preload`` modules) once, without touching a backend, then forks one
controller per request.  Each controller skips the ~0.5 s of CPU that
``import jax`` costs, which on a small machine is most of a short job's wall
time.

Messages (:mod:`jaxrun.wire.forkserver`), over a SOCK_STREAM socket, one per frame
(``encoding.send_frame``; a frame may be of any size, and a packet socket is not
to be had on macOS):

- ``Ready`` (server -> launcher) once the imports are done, or with the
  reason they failed;
- ``ForkRequest`` (launcher -> server): the shim's arguments and the whole
  environment, with three file descriptors attached: the child's stdout and
  stderr (its log files) and the launcher's lifeline;
- ``Started`` (server -> launcher) once the child is forked;
- ``ChildExited`` (Popen-style returncode) when it ends.

Single-threaded on purpose: forking is only safe while no other thread
exists.  EOF on the socket means the launcher is gone; the server exits and
the controllers' lifelines take them down.  SIGINT, SIGTERM and SIGHUP are
the launcher's to act on: the server holds them blocked, so a signal sent to
every process of the tree at once leaves it serving (see
:mod:`jaxrun.backends.shield`), and each controller unblocks them after the
fork.

On an SSH host the same server runs as ``... -m jaxrun.backends.forkserver.server --listen``
in a session of its own (see ``ssh.commands.server_words``), its NAME in its
environment (``contract.FORKSERVER_NAME``, never on a command line that any
user can read): it listens on the
Unix socket that ``portable.server_address(NAME)`` names, and each process's
host agent connects, sends its ``ForkRequest`` with the session's stdout and
stderr, and hears ``Started`` and ``ChildExited`` on its own connection.  Only
processes of the same user may connect: an abstract socket (Linux) is used
only where the peer's user id can be checked, and a socket file lies in a
folder only this user can enter.  The agents check the server's user in turn
(``far_end.fork_by_server``): another user's listener on the name gets nothing.
EOF on stdin (the session closed) ends it.
A request is read whole once its first byte arrives (within ``FRAME_WAIT``).
"""

from __future__ import annotations

import atexit
import importlib
import os
import select
import signal
import socket
import sys
import threading
import time

from jaxrun import contract, portable
from jaxrun.backends import shield
from jaxrun.child.join import warm
from jaxrun.core import usage
from jaxrun.wire import encoding, forkserver

# An agent writes each request at once; one that stops halfway is hung up on
# after this long, so that it cannot hold up the other agents of its host.
FRAME_WAIT = 10.0


def serve(sock: socket.socket | None, listener: socket.socket | None = None, check_peer: bool = False) -> None:
    """Fork a controller per request: from the launcher's one connection
    (``sock``; its EOF ends the server), or from any number of connections
    accepted on ``listener`` (stdin's EOF ends the server; with
    ``check_peer``, a connection whose user cannot be checked is refused).
    A host's server (``listener``) also kills what each controller left in
    its group, just before it reaps it: only the reaper can, while the
    group's id is surely the controller's (its agent hears of the end later)."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, socket.socket] = {}  # pid -> the connection that asked for it
    conns = [sock] if sock is not None else []
    ends = [0] if listener is not None else []  # stdin: its EOF is the session's end
    while True:
        waiting = [wake_r, *conns, *ends, *([listener] if listener is not None else [])]
        readable, _, _ = select.select(waiting, [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        for pid, code, used, reaped_at in reap(children, sweep=listener is not None):
            tell(children.pop(pid), forkserver.ChildExited(pid, code, used.to_dict() if used else None, reaped_at))
        if 0 in readable and not os.read(0, 4096):
            return
        if listener is not None and listener in readable:
            conn = accept_own_user(listener, check_peer)
            if conn is not None:
                conns.append(conn)
        for conn in [c for c in conns if c in readable]:
            try:
                frame = encoding.recv_frame(conn, max_fds=3)
            except (OSError, encoding.WireError):
                frame = None
            if frame is None:
                if conn is sock:
                    return
                conns.remove(conn)
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                os.close(wake_r)
                os.close(wake_w)
                for other in conns:
                    if other is not conn:
                        other.close()
                if listener is not None:
                    listener.close()
                become_controller(conn, encoding.decode(frame[0]), frame[1])
            encoding.close_all(frame[1])
            children[pid] = conn
            tell(conn, forkserver.Started(pid))


def tell(conn: socket.socket, msg: encoding.Message) -> None:
    try:
        encoding.send_frame(conn, msg.encode())
    except OSError:
        pass  # that agent is gone; its controller's lifeline ends it


def accept_own_user(listener: socket.socket, check_peer: bool) -> socket.socket | None:
    """A connection from a process of this user; anyone else is hung up on.
    With ``check_peer`` (an abstract socket: no file permissions keep others
    out), so is a peer whose user the system does not tell."""
    try:
        conn, _ = listener.accept()
    except OSError:
        return None
    uid = portable.peer_uid(conn)
    if uid != os.getuid() and (uid is not None or check_peer):
        conn.close()
        return None
    conn.settimeout(FRAME_WAIT)
    return conn


def reap(children, sweep: bool = False):
    """(pid, returncode, resources, reaped_at) of each ended controller:
    ``reaped_at`` is the wall clock as it was reaped, taken one by one, so
    that ends reaped in one pass keep their own times.  With ``sweep``, what
    is left in its group dies first, while the dead leader still holds the
    group's id (see ``portable.ended_unreaped``)."""
    if sweep:  # a host's server only: the launcher's own would import psutil and all for nothing
        from jaxrun.core.reaper import kill_group
    for pid in list(children):
        unreaped = portable.ended_unreaped(pid, block=False) if sweep else None
        if unreaped:
            kill_group(pid, signal.SIGKILL)
        done, code, used = usage.wait4(pid, os.WNOHANG)
        reaped_at = time.time()
        if done:
            if sweep and unreaped is None:  # the system cannot wait without reaping: at once, then
                kill_group(pid, signal.SIGKILL)
            yield pid, code, used, reaped_at


def become_controller(sock: socket.socket, request: forkserver.ForkRequest, fds: list[int]) -> None:
    """In the forked child: look exactly like a freshly started shim, then run it."""
    code = 1
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        # What a fresh interpreter of a plain launch has: default dispositions
        # (Python's own for SIGINT), and the stop signals that the server
        # holds blocked unblocked again below, once the log files are in
        # place.  One sent meanwhile was held, not lost: it arrives then.
        # A stop signal the server was started with ignored (``nohup``) stays
        # ignored, as it would be in a fresh interpreter.
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN if signum in IGNORED else signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN if signal.SIGINT in IGNORED else signal.default_int_handler)
        os.setpgid(0, 0)
        out, err, lifeline = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        for src, dst in ((devnull, 0), (out, 1), (err, 2)):
            os.dup2(src, dst)
            os.close(src)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, shield.STOP_SIGNALS)
        if request.cwd:
            os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        os.environ[contract.LIFELINE_FD] = str(lifeline)
        from jaxrun.child import shim
        from jaxrun.child.join import preloaded

        preloaded.note_preloaded_jax(IMPORT_ENV, IMPORT_EXIT_HOOKS)
        try:
            shim.main(request.shim_args)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        # What interpreter shutdown would do: join threads, run the atexit
        # hooks (JAX's distributed shutdown among them), then let go of the
        # script's module, so that what it left open (a file) is finalized.
        # (No full garbage collection: with jax loaded it costs ~60 ms, and
        # what a script leaves open is rarely held in a cycle.)
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.modules["__main__"].__dict__.clear()
    except BaseException:  # noqa: BLE001 - a forked child must never return into the server
        import traceback

        traceback.print_exc()
    finally:
        from jaxrun.child.ending import exit_now

        exit_now(code)


# The JAX_* values jax read at import here, and the atexit hooks the imports
# registered: a controller's script may set variables and register hooks of
# its own before its ``import jax`` (see preloaded.note_preloaded_jax).
IMPORT_ENV: dict[str, str] = {}
IMPORT_EXIT_HOOKS: list[tuple] = []


def preload(modules: list[str]) -> None:
    IMPORT_ENV.update((k, v) for k, v in os.environ.items() if k.startswith("JAX_"))
    register = atexit.register

    def recording(func, *args, **kwargs):
        IMPORT_EXIT_HOOKS.append((func, args, kwargs))
        return register(func, *args, **kwargs)

    atexit.register = recording
    try:
        import jax  # noqa: F401 - the point of this process

        for name in modules:
            importlib.import_module(name)
        # And what each controller would import after the fork, once here:
        # inside the window, so an exit hook one of them registers is the
        # script's to order, as jax's own are (preloaded.note_preloaded_jax).
        warm.warm()
    finally:
        atexit.register = register
    claim_title_area()


def claim_title_area() -> None:
    """Let controllers set their process titles (see child.shim.set_title).
    setproctitle finds the argv area when a title is first set, and gives up
    if the environment was replaced by then, as a controller's is right after
    the fork: so find it here, once, leaving the environment block alone."""
    try:
        import setproctitle
    except ImportError:
        return
    os.environ["SPT_NOENV"] = "1"
    try:
        setproctitle.getproctitle()  # finds the area; the title itself stays
    finally:
        del os.environ["SPT_NOENV"]


# The stop signals this process was started ignoring (``nohup jaxrun``
# ignores SIGHUP in the launcher, and so here): its controllers start so too.
IGNORED = frozenset(s for s in shield.STOP_SIGNALS if signal.getsignal(s) == signal.SIG_IGN)


def main(argv: list[str]) -> None:
    # The launcher decides what SIGINT, SIGTERM and SIGHUP mean (see
    # backends.shield): one sent to the whole tree at once must not end the
    # server, whose controllers then still have their grace.  The launcher
    # starts it with them blocked already; an SSH host's server too.
    shield.shield_self()
    if argv[:1] == ["--listen"]:
        # Its name comes in the environment, never on the command line (FORKSERVER_NAME).
        listen(os.environ.pop(contract.FORKSERVER_NAME, ""), argv[1:])
        return
    sock = socket.socket(fileno=int(argv[0]))
    try:
        preload(argv[1:])
    except BaseException as e:  # noqa: BLE001 - whatever the imports raise is the launcher's to report
        encoding.send_frame(sock, forkserver.Ready(f"{type(e).__name__}: {e}").encode())
        sys.exit(1)
    encoding.send_frame(sock, forkserver.Ready("").encode())
    serve(sock)
    leave()


def leave() -> None:
    """The server's end, without the interpreter's teardown of everything jax
    loaded (a quarter of a second of CPU here, on the way out of every run).
    Nothing of the user's lives in the server: there is nothing to finalize."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def listen(name: str, modules: list[str]) -> None:
    """The server of one SSH host.  It listens before it imports, so agents
    that connect early wait in the backlog instead of failing; if the imports
    fail, it exits, and they start their controllers themselves (as they do
    where no safe place to listen exists)."""
    from jaxrun.core import reaper

    address = portable.server_address(name) if name else None
    if address is None:
        print("jaxrun: the preloading server on this host has no private folder for its socket",
              file=sys.stderr, flush=True)
        sys.exit(1)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(address)
    except OSError as e:  # taken: the agents find its listener is not ours, and start their processes
        print(f"jaxrun: the preloading server on this host cannot listen ({e.strerror or e}): its processes "
              "start without it", file=sys.stderr, flush=True)
        sys.exit(1)
    try:
        listener.listen(256)
        reaper.become_subreaper()  # the controllers' daemons stay ours, and die with us
        try:
            preload(modules)
        except BaseException as e:  # noqa: BLE001
            print(f"jaxrun: the preloading server on this host could not import: {type(e).__name__}: {e}",
                  file=sys.stderr, flush=True)
            sys.exit(1)
        try:
            serve(None, listener, check_peer=portable.is_abstract(address))
        finally:
            reaper.kill_descendants()
    finally:
        if not portable.is_abstract(address):
            os.unlink(address)  # in the server only: a forked controller never returns here
    leave()


if __name__ == "__main__":
    main(sys.argv[1:])
