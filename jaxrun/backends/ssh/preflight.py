"""The SSH preflight, at the far end: what a host has, before anything starts there.

Each host's ControlMaster session runs it, through ``commands.PREFLIGHT``: a
stub that reads the environment from stdin and calls :func:`main` once it
has found this host's jaxrun, of the launcher's version.  By hand, with the
environment as it is: ``python -m jaxrun.backends.ssh.preflight --chdir=DIR``.

It answers one line (``preflight.preflight_answer``, keyed by
``preflight.PreflightKey``): the versions of python, jax and jaxlib, the address
the launcher reached the host at, whether the job's folder and script are
there, rsync, the machine and its GPUs.  Then it holds the connection until
EOF and answers the launcher's requests on stdin, one line each way (a
``preflight.PREFLIGHT_REPLY`` line each), so that finding the coordinator's port
and checking that every host reaches it cost no session and no interpreter
start of their own:

    preflight.Listen(address, port)        -> preflight.Listening(port), held until the next request
    preflight.Connect(address, port, secs) -> preflight.Reached()
    preflight.Unlisten()                   -> preflight.Closed()

and ``preflight.Failed(reason)`` for a request that fails.  With ``--hold`` (the
first host) it listens on a free port of the address the launcher reached it
at before it answers, and says which: one request fewer.

Meanwhile this session is the host's agent (``host_agent.HostAgent``), which
runs the host's processes over channels of this connection until EOF.  With
``--server``, the host's preloading server starts as soon as the folder is
entered: everything else here overlaps its import of jax.

It runs on the host, so it imports the standard library, the contract and
the wire only; the agents it starts are found by their contract names.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import shutil
import socket
import subprocess
import sys
from importlib import metadata

import jaxrun
from jaxrun import contract
from jaxrun.wire import encoding, preflight
from jaxrun.wire.preflight import PreflightKey as Key

GPU_LIST_WAIT = 20.0  # for nvidia-smi -L, whose driver may be slow to wake


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=f"python -m {contract.SSH_PREFLIGHT_MODULE}", allow_abbrev=False)
    parser.add_argument(preflight.PREFLIGHT_CHDIR, dest="chdir", default="", metavar="FOLDER")
    parser.add_argument(preflight.PREFLIGHT_SCRIPT, dest="script", default="", metavar="PATH")
    parser.add_argument(preflight.PREFLIGHT_SYNC, dest="sync", action="store_true")
    parser.add_argument(preflight.PREFLIGHT_HOLD, dest="hold", action="store_true")
    parser.add_argument(preflight.PREFLIGHT_SERVER, dest="server", nargs="*", default=None, metavar="MODULE",
                        help="start the preloading server (its name in the environment), with these modules")
    return parser.parse_args(argv)


def described(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def interpreter_facts() -> dict:
    connection = os.environ.get("SSH_CONNECTION", "").split()
    return {Key.PYTHON: platform.python_version(), Key.EXECUTABLE: sys.executable,
            Key.ADDRESS: connection[2] if len(connection) == 4 else None,
            Key.JAXRUN: jaxrun.__version__, Key.JAXRUN_PATH: os.path.dirname(jaxrun.__file__)}


def enter_folder(chdir: str, script: str, facts: dict) -> None:
    try:
        os.chdir(chdir)
    except OSError as e:
        facts[Key.CHDIR_ERROR] = f"cannot change to {chdir!r}: {e.strerror}"
        return
    if script and not os.path.isfile(script):
        facts[Key.SCRIPT_MISSING] = os.path.join(chdir, script)


def start_server(name: str, modules: list[str]) -> None:
    """The host's preloading server, its name in its environment alone.  Its
    stdin is a pipe whose write end this process holds, never closed: the
    server ends when this session does."""
    hold_r, _ = os.pipe()
    subprocess.Popen([sys.executable, "-m", contract.FORKSERVER_AGENT_MODULE, "--listen", *modules],
                     stdin=hold_r, stdout=subprocess.DEVNULL, env={**os.environ, contract.FORKSERVER_NAME: name})
    os.close(hold_r)


def start_agent(chdir: str, script: str, facts: dict):
    """The host agent, once the session agent that every process runs imports
    here; None if either fails (``facts`` says why)."""
    try:
        importlib.import_module(contract.SSH_AGENT_MODULE)
    except Exception as e:
        facts[Key.JAXRUN], facts[Key.JAXRUN_ERROR] = None, described(e)
        return None
    agent = None
    try:
        agent = importlib.import_module(contract.SSH_HOST_AGENT_MODULE).HostAgent()
        facts[Key.CHANNELS] = agent.start()
        try:  # in ps, what this session now is
            import setproctitle
        except ImportError:
            pass
        else:
            setproctitle.setproctitle(" ".join([sys.executable, "-m", contract.SSH_HOST_AGENT_MODULE, chdir, script]))
    except Exception as e:
        facts[Key.CHANNELS_ERROR] = described(e)
    return agent


def package_facts() -> dict:
    facts = {}
    for key in (Key.JAX, Key.JAXLIB):
        try:
            facts[key] = metadata.version(key)
        except metadata.PackageNotFoundError:
            facts[key] = None
    facts[Key.RSYNC] = shutil.which("rsync") is not None
    facts[Key.MACHINE] = machine()
    gpus = gpu_count()
    if gpus is not None:
        facts[Key.GPUS] = gpus
    return facts


def machine() -> str:
    """Hostname and machine-id: two host names of one machine say the same."""
    host = platform.node()
    try:
        with open("/etc/machine-id") as f:
            host += "/" + f.read().strip()
    except OSError:
        pass
    return host


def gpu_count() -> int | None:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=GPU_LIST_WAIT).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return sum(line.startswith(b"GPU ") for line in listed.splitlines())


def listen(address: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock


def answer(request: encoding.Message) -> tuple[encoding.Message, socket.socket | None]:
    """The reply to one request, and the socket it leaves listening, if any."""
    if isinstance(request, preflight.Listen):
        held = listen(request.address, request.port)
        return preflight.Listening(held.getsockname()[1]), held
    if isinstance(request, preflight.Connect):
        socket.create_connection((request.address, request.port), timeout=request.seconds).close()
        return preflight.Reached(), None
    if isinstance(request, preflight.Unlisten):
        return preflight.Closed(), None
    return preflight.Failed(f"unknown request {request.WORD!r}"), None


def serve(requests, out, held: socket.socket | None = None) -> None:
    """Reply to each request line of ``requests`` on ``out`` until EOF.
    ``held``: the port the answer said, let go of at the first request."""
    for line in requests:
        if held is not None:
            held.close()
            held = None
        try:
            reply, held = answer(encoding.decode(line))
        except (OSError, ValueError, TypeError, OverflowError) as e:  # a WireError is a ValueError
            reply = preflight.Failed(getattr(e, "strerror", None) or str(e) or type(e).__name__)
        out.write(preflight.PREFLIGHT_REPLY + reply.line())
        out.flush()
    if held is not None:
        held.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    facts = interpreter_facts()
    if args.chdir and not args.sync:  # with --sync, the copy creates it
        enter_folder(args.chdir, args.script, facts)
    name = os.environ.pop(contract.FORKSERVER_NAME, "")  # the host agent and its processes never see it
    if args.server is not None and name and not facts.get(Key.CHDIR_ERROR):
        start_server(name, args.server)
    agent = start_agent(args.chdir, args.script, facts)
    facts.update(package_facts())
    held = None
    if args.hold and facts[Key.ADDRESS]:
        try:
            held = listen(facts[Key.ADDRESS], 0)
            facts[Key.PORT] = held.getsockname()[1]
        except OSError:
            pass  # the launcher asks again, and hears why
    out = sys.stdout.buffer
    out.write(preflight.preflight_answer(facts))
    out.flush()
    serve(sys.stdin.buffer, out, held)
    if agent is not None:
        agent.stop()
        sys.stdout.flush()
        os._exit(0)  # nothing here to finalize: the teardown of what it imported only delays the end
    return 0


if __name__ == "__main__":
    sys.exit(main())
