"""The SSH backend's command lines and preflight checks: pure, unit-tested.

What runs where: the ssh client's arguments, the one quoted string each
session hands to the remote shell, the stubs that start a far end's module
there (the preflight's is :mod:`jaxrun.backends.ssh.preflight`), and the
launcher's reading of the preflight's answers.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from jaxrun import __version__, contract
from jaxrun.backends.ssh.options import SshOptions
from jaxrun.core.spec import Host, ProcessSpec
from jaxrun.wire import preflight, ssh
from jaxrun.wire.preflight import PreflightKey as Key

# The first lines of every program a session runs with an environment: read
# the environment from stdin (``ssh.env_frame``), so that no value (a token
# given with --env) ever appears on a command line, where any local user's
# ``ps`` can read it.  PYTHONPATH is applied to this interpreter too, since it
# may be what makes jaxrun importable there.  Before anything, the stop
# signals are blocked: what runs here is a far end (an agent, a server), and
# the launcher alone decides what SIGINT, SIGTERM and SIGHUP mean (see
# ``backends.shield``); every controller unblocks them again.
ENV_STUB = f"_DIGITS = {ssh.ENV_FRAME_DIGITS}\n" + r"""
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
_env = json.loads(_exact(int(_exact(_DIGITS))))
os.environ.update(_env)
sys.path[1:1] = [p for p in _env.get("PYTHONPATH", "").split(os.pathsep) if p]
"""

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

# Runs as each host's ControlMaster session, argv VERSION MODULE ARGS...: the
# environment, then MODULE's ``main(ARGS)`` (``backends.ssh.preflight``, which
# answers, then serves the launcher's requests) if this host's jaxrun is the
# launcher's VERSION.  A host without it, or with another version, still
# answers in one line: its python, and which jaxrun it has, or why none.
_STUB_WORDS = (preflight.PREFLIGHT_ANSWER.decode(),
               *map(str, (Key.PYTHON, Key.EXECUTABLE, Key.JAXRUN, Key.JAXRUN_ERROR)))
PREFLIGHT = ENV_STUB + f"_ANSWER, _PYTHON, _EXECUTABLE, _JAXRUN, _ERROR = {_STUB_WORDS!r}\n" + r"""
import importlib, platform
_found = {_PYTHON: platform.python_version(), _EXECUTABLE: sys.executable, _JAXRUN: None}
_main = None
try:
    import jaxrun
    _found[_JAXRUN] = jaxrun.__version__
    if jaxrun.__version__ == sys.argv[1]:
        _main = importlib.import_module(sys.argv[2]).main
except Exception as e:
    _found[_JAXRUN], _found[_ERROR] = None, "%s: %s" % (type(e).__name__, e)
if _main is not None:
    sys.exit(_main(sys.argv[3:]))
print(_ANSWER + json.dumps(_found), flush=True)
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
    return mux_args(settings, host, control_path, "forward", "-L", f"{local}:{remote}")


def mux_args(settings: SshOptions, host: Host, control_path: str, operation: str, flag: str,
             spec: str) -> list[str]:
    """``ssh -O operation flag spec``: a forward added to (``forward``) or taken
    from (``cancel``) the host's running master, no new connection."""
    args = ssh_args(settings, host, ["-o", f"ControlPath={control_path}"])
    at = args.index("--")
    return args[:at] + ["-O", operation, flag, spec] + args[at:]


def remote_command(words: Sequence[str], setup: str | None = None) -> str:
    """The one string ssh hands to the remote shell: every word quoted.
    ``setup`` (--setup) is the user's own shell code, run first in that shell
    as given ('module load cuda; conda activate env'); the command runs only
    if it succeeds, with the environment it made."""
    command = " ".join(shlex.quote(w) for w in words)
    return f"{{ {setup}\n}} && exec {command}" if setup else command


def process_env(spec: ProcessSpec, extra_env: Mapping[str, str]) -> dict[str, str]:
    """What a remote process's environment adds to the host's; sent on stdin."""
    env = dict(spec.env)
    env.update(extra_env)
    # The agent makes its own lifeline, and its own private error record and
    # joined files on the host: a path of the launching machine means nothing there.
    env.pop(contract.LIFELINE_FD, None)
    env.pop(contract.ERROR_FILE, None)
    env.pop(contract.JOINED_FILE, None)
    env.pop(contract.ACTIVITY_FILE, None)
    env.pop(contract.MARKS_FILE, None)
    if contract.PROFILE_DIR in env:  # its traces stay on its host until they are asked for (traces_words)
        env[contract.PROFILE_DIR] = trace_name(spec)
    return env


def trace_name(spec: ProcessSpec) -> str:
    """The folder, in its host's per-user base, where a remote process keeps its traces."""
    return f"{spec.env.get(contract.RUN_ID, 'run')}-process-{spec.rank}"


def traces_words(spec: ProcessSpec, python: str, wait: float) -> list[str]:
    """The session that brings ``spec``'s finished traces home, as a tar stream on its stdout."""
    return [python, "-c", RUN_MODULE, contract.SSH_TRACES_MODULE, trace_name(spec), f"{wait:.3f}"]


def process_words(spec: ProcessSpec, chdir: str, python: str) -> list[str]:
    """Only harmless words: the environment travels on stdin (with the
    host's server's name, ``contract.FORKSERVER_NAME``, where it has one)."""
    return [python, "-c", RUN_MODULE, contract.SSH_AGENT_MODULE, "--chdir", chdir, "--", *spec.argv]


def server_words(python: str, chdir: str, modules: Sequence[str]) -> list[str]:
    """The host's preloading server; its name travels in its environment
    (``contract.FORKSERVER_NAME``): on a command line, any user of the host
    could read it and bind it first."""
    return [python, "-c", EXEC_MODULE, contract.FORKSERVER_AGENT_MODULE, "--listen", *modules]


def preflight_words(settings: SshOptions, server: Sequence[str] | None = None, hold: bool = False,
                    python: str | None = None) -> list[str]:
    """``server``: the preloading server's modules, to start it from the
    preflight session (its name travels in the session's environment,
    ``contract.FORKSERVER_NAME``); None for none.  ``hold``: listen on a free
    port for the coordinator at once (the first host).  ``python``: the
    host's own interpreter, where it has one."""
    words = [python or settings.python, "-c", PREFLIGHT, __version__, contract.SSH_PREFLIGHT_MODULE,
             f"{preflight.PREFLIGHT_CHDIR}={settings.chdir}"]
    if settings.script:
        words.append(f"{preflight.PREFLIGHT_SCRIPT}={settings.script}")
    if settings.sync:
        words.append(preflight.PREFLIGHT_SYNC)
    if hold:
        words.append(preflight.PREFLIGHT_HOLD)
    if server is not None:
        words += [preflight.PREFLIGHT_SERVER, *server]  # last: it takes every word after it
    return words


def check_preflight(results: Mapping[str, dict], python: str, pythons: Mapping[str, str] | None = None) -> list[str]:
    """Problems found in the preflight answers, one line each, host first.
    A host that could not run the preflight (another jaxrun, or none) has
    said nothing of jax: only what it said is checked.  ``pythons``: the
    hosts that have an interpreter of their own."""
    problems = []
    for name, info in results.items():
        python = (pythons or {}).get(name, python)
        if info.get(Key.JAXRUN) is None:
            problems.append(f"{name}: cannot import jaxrun with {python} ({info.get(Key.JAXRUN_ERROR)})")
        elif info[Key.JAXRUN] != __version__:
            problems.append(f"{name}: jaxrun {info[Key.JAXRUN]} there, {__version__} here")
        if Key.JAX in info and info[Key.JAX] is None:
            problems.append(f"{name}: jax is not installed for {python}")
        if info.get(Key.CHDIR_ERROR):
            problems.append(f"{name}: {info[Key.CHDIR_ERROR]}")
        if info.get(Key.SCRIPT_MISSING):
            problems.append(f"{name}: {info[Key.SCRIPT_MISSING]} does not exist there (--sync copies the working "
                            "directory to every host)")
    for key in (Key.PYTHON, Key.JAX, Key.JAXLIB):
        values = {name: _version_key(key, info.get(key)) for name, info in results.items() if key in info}
        if len(set(values.values())) > 1:
            listed = ", ".join(f"{name} has {results[name].get(key)}" for name in values)
            problems.append(f"hosts disagree on the {key} version: {listed}")
    return problems


def _version_key(key: str, value: str | None) -> str | None:
    # Patch releases of python may differ; jax and jaxlib must match exactly.
    if key == Key.PYTHON and value:
        return ".".join(value.split(".")[:2])
    return value


def preflight_table(results: Mapping[str, dict]) -> list[str]:
    shown = (Key.ADDRESS, Key.PYTHON, Key.JAX, Key.JAXLIB, Key.JAXRUN)
    rows = [("host", *map(str, shown))]
    for name, info in results.items():
        rows.append((name, *(str(info.get(k) or "-") for k in shown)))
    return ["jaxrun: " + line for line in contract.align_columns(rows)]
