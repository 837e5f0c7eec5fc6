"""The far end of the fork server backend: the preloading server itself.

Started by :class:`jaxrun.backends.forkserver.ForkServer` as
``python -m jaxrun.backends.forkserver_agent SOCKET_FD [MODULE...]``.  It imports jax (and any
``--preload`` modules) once, without touching a backend, then forks one
controller per request.  Each controller skips the ~0.5 s of CPU that
``import jax`` costs, which on a small machine is most of a short job's wall
time.

Messages (:mod:`jaxrun.wire`), over a SOCK_SEQPACKET socket, one per packet:

- ``Ready`` (server -> launcher) once the imports are done, or with the
  reason they failed;
- ``ForkRequest`` (launcher -> server): the shim's arguments and the whole
  environment, with three file descriptors attached: the child's stdout and
  stderr (its log files) and the launcher's lifeline;
- ``Started`` (server -> launcher) once the child is forked;
- ``ChildExited`` (Popen-style returncode) when it ends.

Single-threaded on purpose: forking is only safe while no other thread
exists.  EOF on the socket means the launcher is gone; the server exits and
the controllers' lifelines take them down.
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

from jaxrun import contract, wire


def serve(sock: socket.socket) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the launcher decides about signals
    children: set[int] = set()
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
        for pid, code in reap(children):
            sock.send(wire.ChildExited(pid, code).encode())
        if sock in readable:
            message, fds, _, _ = socket.recv_fds(sock, wire.MAX_PACKET, 3)
            if not message:
                return
            pid = os.fork()
            if pid == 0:
                os.close(wake_r)
                os.close(wake_w)
                become_controller(sock, wire.decode(message), fds)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            sock.send(wire.Started(pid).encode())


def reap(children: set[int]):
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            yield pid, os.waitstatus_to_exitcode(status)


def become_controller(sock: socket.socket, request: wire.ForkRequest, fds: list[int]) -> None:
    """In the forked child: look exactly like a freshly started shim, then run it."""
    code = 1
    try:
        sock.close()
        signal.set_wakeup_fd(-1)
        for signum in (signal.SIGCHLD, signal.SIGINT):
            signal.signal(signum, signal.SIG_DFL if signum == signal.SIGCHLD else signal.default_int_handler)
        os.setpgid(0, 0)
        out, err, lifeline = fds
        devnull = os.open(os.devnull, os.O_RDONLY)
        for src, dst in ((devnull, 0), (out, 1), (err, 2)):
            os.dup2(src, dst)
            os.close(src)
        os.environ.clear()
        os.environ.update(request.env)
        os.environ[contract.LIFELINE_FD] = str(lifeline)
        from jaxrun.child import bootstrap, shim

        bootstrap.note_preloaded_jax(IMPORT_ENV, IMPORT_EXIT_HOOKS)
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
# its own before its ``import jax`` (see bootstrap.note_preloaded_jax).
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
    finally:
        atexit.register = register


def main(argv: list[str]) -> None:
    sock = socket.socket(fileno=int(argv[0]))
    try:
        preload(argv[1:])
        from jaxrun.child import bootstrap, shim  # noqa: F401 - warm the shim's imports too
    except BaseException as e:  # noqa: BLE001 - whatever the imports raise is the launcher's to report
        sock.send(wire.Ready(f"{type(e).__name__}: {e}").encode())
        sys.exit(1)
    sock.send(wire.Ready("").encode())
    serve(sock)


if __name__ == "__main__":
    main(sys.argv[1:])
