"""The SSH backend's command lines and preflight checks: pure, unit-tested.

What runs where: the ssh client's arguments, the one quoted string each
session hands to the remote shell, and the small Python program the
preflight runs on a host before anything starts (and the requests it
answers afterwards).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from jaxrun import __version__, contract, wire
from jaxrun.core.config import SshOptions
from jaxrun.core.spec import Host, ProcessSpec

# Marks the preflight answer: a login shell may print its own lines first.
ANSWER = b"jaxrun-preflight "
# Marks the preflight session's reply to each later request (see PREFLIGHT).
REPLY = b"jaxrun-reply "

# The first lines of every program a session runs with an environment: read
# the environment from stdin (``wire.env_frame``), so that no value (a token
# given with --env) ever appears on a command line, where any local user's
# ``ps`` can read it.  PYTHONPATH is applied to this interpreter too, since it
# may be what makes jaxrun importable there.  Before anything, the stop
# signals are blocked: what runs here is a far end (an agent, a server), and
# the launcher alone decides what SIGINT, SIGTERM and SIGHUP mean (see
# ``backends.shield``); every controller unblocks them again.
ENV_STUB = r"""
import signal
signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
import json, os, sys
def _exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit("jaxrun: the session ended before the environment arrived")
        data += chunk
    return data
_env = json.loads(_exact(int(_exact(%d))))
os.environ.update(_env)
sys.path[1:1] = [p for p in _env.get("PYTHONPATH", "").split(os.pathsep) if p]
""" % wire.ENV_FRAME_DIGITS

# A host's preloading server: the environment, then ``python -m MODULE ARGS``
# in its place.  The exec puts the environment where a process's environment
# belongs (/proc/PID/environ, readable by its own user only), before the
# interpreter starts, as whatever jax reads at import expects.
EXEC_MODULE = ENV_STUB + r"""
os.execv(sys.executable, [sys.executable, "-m", *sys.argv[1:]])
"""

# A process's session: the environment, then the host agent as ``python -m
# MODULE ARGS`` would run it, in this interpreter.  An exec would start a
# second interpreter per process, on the critical path of every start; the
# agent hands the environment on explicitly to the controller it starts.  It
# shows in ps as that command line, within this one's own argv area
# (SPT_NOENV), not as this program.
RUN_MODULE = ENV_STUB + r"""
import runpy
sys.argv = sys.argv[1:]
try:
    import setproctitle
except ImportError:
    pass
else:
    _ours = "SPT_NOENV" not in os.environ
    os.environ["SPT_NOENV"] = "1"
    setproctitle.setproctitle(" ".join([sys.executable, "-m", *sys.argv]))
    if _ours:
        del os.environ["SPT_NOENV"]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""

# Runs as the master's own session: report, then hold the connection until
# EOF, answering the launcher's requests meanwhile, one line each way, so that
# finding the coordinator's port and checking that every host reaches it cost
# no session and no interpreter start of their own:
#
#   listen ADDRESS PORT            bind and listen there (PORT 0: any free port)
#                                  -> "listening PORT", held until the next request
#   connect ADDRESS PORT SECONDS   -> "reached"
#   unlisten                       -> "closed"
#
# A request that fails is answered "error REASON".  With "hold", the first
# host's preflight already listens on a free port of the address the launcher
# reached it at, and says which in its answer ("port"): one request fewer.
# Once jaxrun is found, the session also runs the host's agent
# (``ssh_host.HostAgent``: its socket is "channels" in the answer), which runs
# the host's processes until EOF.
#
# argv: CHDIR AGENT_MODULE SCRIPT ("sync"|"") ("hold"|"") [SERVER_NAME MODULES...]
# The host's preloading server starts as soon as jaxrun is found and the
# folder entered: everything else here overlaps its import of jax.
PREFLIGHT = ENV_STUB + r"""
import json, os, platform, socket, sys
info = {"python": platform.python_version(), "executable": sys.executable}
conn = os.environ.get("SSH_CONNECTION", "").split()
info["address"] = conn[2] if len(conn) == 4 else None
try:
    import jaxrun
    info["jaxrun"] = jaxrun.__version__
    info["jaxrun_path"] = os.path.dirname(jaxrun.__file__)
except Exception as e:
    info["jaxrun"] = None
    info["jaxrun_error"] = "%s: %s" % (type(e).__name__, e)
syncing = sys.argv[4] == "sync"
if sys.argv[1] and not syncing:  # with --sync, the copy creates it
    try:
        os.chdir(sys.argv[1])
    except OSError as e:
        info["chdir_error"] = "cannot change to %r: %s" % (sys.argv[1], e.strerror)
    else:
        if sys.argv[3] and not os.path.isfile(sys.argv[3]):
            info["script_missing"] = os.path.join(sys.argv[1], sys.argv[3])
if len(sys.argv) > 6 and info.get("jaxrun") and not info.get("chdir_error"):
    # This host's preloading server.  Its stdin is a pipe this process holds
    # open: the server ends when this session does.
    import subprocess
    _hold_r, _hold_w = os.pipe()
    subprocess.Popen([sys.executable, "-m", sys.argv[2].rsplit(".", 2)[0] + ".forkserver.server", "--listen",
                      *sys.argv[6:]], stdin=_hold_r, stdout=subprocess.DEVNULL)
    os.close(_hold_r)
agent = None
if info["jaxrun"]:
    try:
        import importlib
        importlib.import_module(sys.argv[2])  # the agent every process will run
    except Exception as e:
        info["jaxrun"] = None
        info["jaxrun_error"] = "%s: %s" % (type(e).__name__, e)
if info["jaxrun"]:
    # This host's processes, over channels of this connection.
    try:
        _host_module = sys.argv[2].rsplit(".", 1)[0] + ".host_agent"
        agent = importlib.import_module(_host_module).HostAgent()
        info["channels"] = agent.start()
        try:  # in ps, what this session now is
            import setproctitle
            setproctitle.setproctitle(" ".join([sys.executable, "-m", _host_module, sys.argv[1], sys.argv[3]]))
        except ImportError:
            pass
    except Exception as e:
        info["channels_error"] = "%s: %s" % (type(e).__name__, e)
try:
    from importlib import metadata
    for name in ("jax", "jaxlib"):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
except ImportError:
    info["jax"] = info["jaxlib"] = None
import shutil
info["rsync"] = shutil.which("rsync") is not None
host = platform.node()
try:
    with open("/etc/machine-id") as f:
        host += "/" + f.read().strip()
except OSError:
    pass
info["machine"] = host
if shutil.which("nvidia-smi"):
    import subprocess
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=20).stdout
        info["gpus"] = sum(line.startswith(b"GPU ") for line in listed.splitlines())
    except (OSError, subprocess.SubprocessError):
        pass
def listen(address, port):
    sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(64)
    except BaseException:
        sock.close()
        raise
    return sock
held = None
if sys.argv[5] == "hold" and info["address"]:
    try:
        held = listen(info["address"], 0)
        info["port"] = held.getsockname()[1]
    except OSError:
        pass  # the launcher asks again, and hears why
print("jaxrun-preflight " + json.dumps(info), flush=True)
for line in sys.stdin.buffer:
    words = line.decode(errors="replace").split()
    try:
        if held is not None:
            held.close()
            held = None
        if words[0] == "listen":
            held = listen(words[1], int(words[2]))
            reply = "listening %d" % held.getsockname()[1]
        elif words[0] == "connect":
            socket.create_connection((words[1], int(words[2])), timeout=float(words[3])).close()
            reply = "reached"
        elif words[0] == "unlisten":
            reply = "closed"
        else:
            reply = "error unknown request"
    except (OSError, ValueError, IndexError) as e:
        reply = "error " + (getattr(e, "strerror", None) or str(e) or type(e).__name__)
    print("jaxrun-reply " + reply, flush=True)
if agent is not None:
    agent.stop()
    sys.stdout.flush()
    os._exit(0)  # nothing here to finalize: the teardown of what it imported only delays the end
"""

# -- pure: command lines ------------------------------------------------------

# ssh's keepalive over the encrypted channel: every 5 s, and the connection is
# given up after 3 unanswered (15 s).  The user's -o values win.
SERVER_ALIVE = (5, 3)


def ssh_args(settings: SshOptions, host: Host, control: Sequence[str]) -> list[str]:
    """``ssh ... -- [user@]host``: ours first where it must win (ssh keeps the
    first value of an option), the user's next, overridable defaults last."""
    args = ["ssh"]
    if settings.config_file:
        args += ["-F", settings.config_file]
    args += ["-o", "BatchMode=yes", *control]
    for opt in settings.options:
        args += ["-o", opt]
    # A host that vanishes without closing its connections (power lost, a
    # network cut) is noticed after SERVER_ALIVE seconds, not TCP's hours.
    args += ["-o", f"ConnectTimeout={max(1, round(settings.connect_timeout))}",
             "-o", f"ServerAliveInterval={SERVER_ALIVE[0]}", "-o", f"ServerAliveCountMax={SERVER_ALIVE[1]}", "-T"]
    if host.port:
        args += ["-p", str(host.port)]
    return args + ["--", host.ssh_target]


def master_control(path: str) -> list[str]:
    return ["-o", "ControlMaster=yes", "-o", f"ControlPath={path}", "-o", "ControlPersist=no"]


def session_control(path: str | None) -> list[str]:
    # LogLevel=ERROR keeps ssh's own warnings out of the process's stderr log.
    return ["-o", "ControlMaster=no", "-o", f"ControlPath={path or 'none'}", "-o", "LogLevel=ERROR"]


def forward_args(settings: SshOptions, host: Host, control_path: str, local: str, remote: str) -> list[str]:
    """Ask the host's master to forward the Unix socket ``local`` here to
    ``remote`` there (its agent's): every connection to it is a new channel."""
    args = ssh_args(settings, host, ["-o", f"ControlPath={control_path}"])
    at = args.index("--")
    return args[:at] + ["-O", "forward", "-L", f"{local}:{remote}"] + args[at:]


def remote_command(words: Sequence[str]) -> str:
    """The one string ssh hands to the remote shell: every word quoted."""
    return " ".join(shlex.quote(w) for w in words)


def process_env(spec: ProcessSpec, extra_env: Mapping[str, str]) -> dict[str, str]:
    """What a remote process's environment adds to the host's; sent on stdin."""
    env = dict(spec.env)
    env.update(extra_env)
    # The agent makes its own lifeline, and its own private error record and
    # joined files on the host: a path of the launching machine means nothing there.
    env.pop(contract.LIFELINE_FD, None)
    env.pop(contract.ERROR_FILE, None)
    env.pop(contract.JOINED_FILE, None)
    return env


def process_words(spec: ProcessSpec, chdir: str, python: str, server: str | None = None) -> list[str]:
    """Only harmless words: the environment travels on stdin."""
    via = ["--forkserver", server] if server else []
    return [python, "-c", RUN_MODULE, contract.SSH_AGENT_MODULE, "--chdir", chdir, *via, "--", *spec.argv]


def server_words(python: str, chdir: str, name: str, modules: Sequence[str]) -> list[str]:
    return [python, "-c", EXEC_MODULE, contract.FORKSERVER_AGENT_MODULE, "--listen", name, *modules]


def preflight_words(settings: SshOptions, server: Sequence[str] = (), hold: bool = False) -> list[str]:
    """``server``: the preloading server's socket name and modules, to start
    it from the preflight session; empty for none.  ``hold``: listen on a free
    port for the coordinator at once (the first host)."""
    return [settings.python, "-c", PREFLIGHT, settings.chdir, contract.SSH_AGENT_MODULE, settings.script or "",
            "sync" if settings.sync else "", "hold" if hold else "", *server]


def check_preflight(results: Mapping[str, dict], python: str) -> list[str]:
    """Problems found in the preflight answers, one line each, host first."""
    problems = []
    for name, info in results.items():
        if info.get("jaxrun") is None:
            problems.append(f"{name}: cannot import jaxrun with {python} ({info.get('jaxrun_error')})")
        elif info["jaxrun"] != __version__:
            problems.append(f"{name}: jaxrun {info['jaxrun']} there, {__version__} here")
        if info.get("jax") is None:
            problems.append(f"{name}: jax is not installed for {python}")
        if info.get("chdir_error"):
            problems.append(f"{name}: {info['chdir_error']}")
        if info.get("script_missing"):
            problems.append(f"{name}: {info['script_missing']} does not exist there (--sync copies the working "
                            "directory to every host)")
    for key, shown in (("python", "python"), ("jax", "jax"), ("jaxlib", "jaxlib")):
        values = {name: _version_key(key, info.get(key)) for name, info in results.items()}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{name} has {results[name].get(key)}" for name in values)
            problems.append(f"hosts disagree on the {shown} version: {listed}")
    return problems


def _version_key(key: str, value: str | None) -> str | None:
    # Patch releases of python may differ; jax and jaxlib must match exactly.
    if key == "python" and value:
        return ".".join(value.split(".")[:2])
    return value


def preflight_table(results: Mapping[str, dict]) -> list[str]:
    rows = [("host", "address", "python", "jax", "jaxlib", "jaxrun")]
    for name, info in results.items():
        rows.append((name, *(str(info.get(k) or "-") for k in ("address", "python", "jax", "jaxlib", "jaxrun"))))
    return ["jaxrun: " + line for line in contract.align_columns(rows)]
