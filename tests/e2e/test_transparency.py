"""Compatibility suite: a script behaves under jaxrun as under the guide's bash loop.

DESIGN.md makes transparency jaxrun's first promise (issue #15).  Each
pattern in ``tests/data/compat/`` is a script that takes ``COORD N ID``, as
the guide's toy does, and prints what proves the behaviour it stands for.
It runs three ways:

1. the reference, the guide's plain launch: two ``python SCRIPT COORD 2 ID``
   started side by side on a free loopback port;
2. ``jaxrun -n 2 SCRIPT {coordinator} {num_processes} {process_id}`` with the
   preloading fork server;
3. the same with ``--no-preload``.

Per process, the exit status and the normalized stdout and stderr must be
identical.  A pattern's three launches run side by side, started together by
the first of its two tests (the second reads its own launch's outcome): most
patterns spend their time waiting (for a peer, a barrier, a timeout), and
nothing of one launch is shared with another, not even a port.  For the same
reason the next pattern's three start while a test waits for its own (two
patterns at most at a time), each pattern with its own folder, token and
temporary folder, and whatever a pattern's launches leave is killed and
fails that pattern's tests.  jaxrun's output is read from its ``--log-dir``,
never from the console, which jaxrun is free to decorate.

Both ways get the same environment (``JAX_PLATFORMS=cpu`` and nothing else
that JAX reads), except for what DESIGN.md lists as deliberate: the plain
launch is given ``PYTHONUNBUFFERED=1`` and ``JAX_COORDINATOR_ADDRESS``
because every jaxrun child has them.
"""

from __future__ import annotations

import concurrent.futures
import difflib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fixtures.jobs import DATA, JAXRUN, MODES, TOKEN, outlived, run_in_session

from jaxrun import portable

pytestmark = pytest.mark.timeout(180)

COMPAT = DATA / "compat"
N = 2
# Generous: the slowest pattern (initialization_timeout) ends in about 8 s,
# and one whose timeout is ignored gives up through its own watchdog (30 s at most).
RUN_TIMEOUT = 90.0
OK = ("exit 0",) * N


@dataclass(frozen=True)
class Pattern:
    script: str  # under tests/data/compat, run from that folder by relative name
    # Proof that the reference itself shows the behaviour: text that must
    # appear in a process's stdout or stderr, by rank.
    expect: dict[int, tuple[str, ...]] = field(default_factory=dict)
    codes: tuple[str, ...] = OK
    # Files each run must leave in its scratch folder: with exactly this
    # content, or mentioning this text.
    files: dict[str, str] = field(default_factory=dict)
    file_mentions: dict[str, str] = field(default_factory=dict)
    via_symlink: bool = False


PATTERNS = {
    "env-before-import": Pattern(
        "env_before_import.py",
        expect={r: ("local devices 2", "global devices 4", "dtype int64", "platform cpu") for r in range(N)},
    ),
    "config-after-import": Pattern(
        "config_after_import.py",
        expect={r: ("local devices 2", "global devices 4", "dtype int64") for r in range(N)},
    ),
    "compilation-cache": Pattern("compilation_cache.py", expect={0: ("cache entries written True",)}),
    "cpu-collectives-gloo": Pattern(
        "cpu_collectives.py", expect={r: ("collectives gloo", "allgather [[0], [10]]") for r in range(N)}
    ),
    "init-explicit-keywords": Pattern(
        "init_explicit.py", expect={r: (f"process {r} of 2", "after shutdown False") for r in range(N)}
    ),
    "init-private-name": Pattern(
        "init_private_name.py", expect={r: (f"process {r} of 2", "client set True") for r in range(N)}
    ),
    "init-local-device-ids": Pattern(
        "init_local_device_ids.py", expect={r: ("cuda visible devices '0'",) for r in range(N)}
    ),
    "init-from-env": Pattern(
        "init_from_env.py", expect={r: (f"process {r} of 2", "after shutdown False") for r in range(N)}
    ),
    "init-shutdown-timeout": Pattern(
        "init_shutdown_timeout.py",
        expect={0: ("shutting down",), 1: ("leaving without shutdown",)},
        codes=(f"signal {signal.SIGABRT.value}", "exit 0"),
        file_mentions={"shutdown-0.log": "Barrier timed out"},
    ),
    "init-heartbeat-timeout": Pattern(
        "init_heartbeat_timeout.py",
        expect={0: ("waiting for the heartbeat timeout", "heartbeat timeout"), 1: ("vanishing",)},
        codes=(f"signal {signal.SIGABRT.value}", "exit 0"),
    ),
    "init-initialization-timeout": Pattern(
        "init_initialization_timeout.py",
        expect={0: ("joining", "RegisterTask"), 1: ("not joining",)},
        codes=(f"signal {signal.SIGABRT.value}", "exit 0"),
    ),
    "multihost-utils": Pattern(
        "multihost.py", expect={r: ("allgather [[0, 100], [1, 101]]", "synced", "broadcast [7]") for r in range(N)}
    ),
    "multiprocessing-spawn": Pattern("mp_spawn.py", expect={r: ("spawn pool [0, 1, 4, 9, 16]",) for r in range(N)}),
    "multiprocessing-forkserver": Pattern(
        "mp_forkserver.py", expect={r: ("forkserver pool [0, 1, 4, 9, 16]",) for r in range(N)}
    ),
    "grandchild-python": Pattern(
        "grandchild.py", expect={r: ("controller process count 2", "grandchild process count 1") for r in range(N)}
    ),
    "main-module": Pattern(
        "main_module.py",
        expect={
            r: (
                "__file__ absolute True",
                "__builtins__ type module",
                "__loader__ type SourceFileLoader",
                "sys.modules['__main__'] is this module True",
                "pickled function 42",
                "pickled class 5",
            )
            for r in range(N)
        },
    ),
    "symlinked-entry": Pattern(
        "symlinked/main.py",
        expect={r: ("helper found next to the real script", "sys.path[0] symlinked") for r in range(N)},
        via_symlink=True,
    ),
    "unclosed-file": Pattern("unclosed_file.py", files={f"unclosed-{r}.txt": "data" for r in range(N)}),
    "absl-app": Pattern(
        "absl_app.py", expect={r: (f"starting process {r}", f"process {r} of 2", "a warning from") for r in range(N)}
    ),
    "stdlib-logging-warnings": Pattern(
        "stdlib_logging.py",
        expect={
            0: ("INFO:root:before initialize", "Starting JAX distributed service", "UserWarning: a user warning"),
            1: ("INFO:root:before initialize", "Connecting to JAX distributed service", "UserWarning: a user warning"),
        },
    ),
    "early-exit-atexit": Pattern(
        "early_exit_atexit.py",
        expect={
            0: ("rank 0 carries on", "last hook: process 0", "first hook: distributed still up False"),
            1: ("rank 1 exits early", "last hook: process 1", "first hook: distributed still up False"),
        },
    ),
}


# --- normalization: each rule hides only what differs from run to run anyway --

_NORMALIZE = [
    # JAX's and absl's C++/Python log prefix "I1130 20:56:49.979701    1225 file.cc:12]":
    # date, time and thread id differ on every run; the level, file and line stay.
    (re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d{6}\s+\d+ ", re.MULTILINE), r"\1MMDD hh:mm:ss.uuuuuu TID "),
    # The service binds [::] in a plain launch and loopback under jaxrun, as
    # DESIGN.md promises ("Ports and binding"); only this one message shows it.
    (re.compile(r"(Starting JAX distributed service on )\S+"), r"\1BIND"),
    # A local job's service is on a socket file in jaxrun's private folder
    # (docs/security.md); a plain launch's on a port.
    (re.compile(r"(Connecting to JAX distributed service on )\S+"), r"\1ADDRESS"),
    # Ports are picked free on every run, by the test or by jaxrun.
    (re.compile(r"(127\.0\.0\.1|localhost|\[::\]):\d+"), r"\1:PORT"),
    # Coordination-service incarnation and barrier ids are random 64-bit numbers.
    (re.compile(r"\b\d{12,}\b"), "ID"),
    # Frames under "*** Check failure stack trace: ***" are raw addresses (ASLR).
    (re.compile(r"^\s+@\s+0x[0-9a-f]+ .*\n?", re.MULTILINE), ""),
]


def normalize(text: str) -> str:
    # Gloo prints "Rank R is connected to 1 peer ranks" from its own thread, at
    # no fixed point relative to the script's output.
    text = "".join(line for line in text.splitlines(keepends=True) if "is connected to" not in line)
    for pattern, replacement in _NORMALIZE:
        text = pattern.sub(replacement, text)
    return text


# --- the two ways to launch ---------------------------------------------------


@dataclass
class Outcome:
    codes: list[str]
    stdout: list[str]
    stderr: list[str]
    scratch: Path
    note: str = ""  # jaxrun's console, for failure messages

    def show(self, rank: int) -> str:
        return f"{self.codes[rank]}\n--- stdout\n{self.stdout[rank]}--- stderr\n{self.stderr[rank]}"


def free_port() -> int:
    """Below the ephemeral range, as jaxrun's own: bind(0)'s port can become an outgoing
    connection's source port before the plain launch's process 0 listens on it (a loaded
    run's other jobs connect all the time), and process 1 then waits for ever."""
    return portable.free_port("127.0.0.1")


def read_logs(log_dir: Path) -> tuple[list[str], list[str]]:
    def read(rank, stream):
        path = log_dir / f"process-{rank}.{stream}"
        return path.read_bytes().decode(errors="replace") if path.exists() else ""

    return [read(r, "stdout") for r in range(N)], [read(r, "stderr") for r in range(N)]


def plain_launch(script: str, cwd: Path, run_dir: Path, base_env: dict[str, str]) -> Outcome:
    """The guide's `for i in 0 1; do python script.py COORD 2 $i & done; wait`."""
    coord = f"127.0.0.1:{free_port()}"
    scratch, logs = run_dir / "scratch", run_dir / "logs"
    scratch.mkdir(parents=True)
    logs.mkdir()
    env = dict(base_env, PYTHONUNBUFFERED="1", JAX_COORDINATOR_ADDRESS=coord, COMPAT_SCRATCH=str(scratch))
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(N):
            with open(logs / f"process-{rank}.stdout", "wb") as out, open(logs / f"process-{rank}.stderr", "wb") as err:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, script, coord, str(N), str(rank)],
                        cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + RUN_TIMEOUT
        codes = []
        for proc in procs:
            rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            codes.append(f"signal {-rc}" if rc < 0 else f"exit {rc}")
    finally:
        for proc in procs:
            # The group too: a pool worker or grandchild may outlive its controller.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    stdout, stderr = read_logs(logs)
    return Outcome(codes, stdout, stderr, scratch)


def jaxrun_launch(mode: str, script: str, cwd: Path, run_dir: Path, base_env: dict[str, str]) -> Outcome:
    scratch, logs, report = run_dir / "scratch", run_dir / "logs", run_dir / "report.json"
    scratch.mkdir(parents=True)
    env = dict(base_env, COMPAT_SCRATCH=str(scratch), JAXRUN_NO_PRELOAD="1" if mode == "no-preload" else "0")
    argv = [*JAXRUN, "-n", str(N), "--log-dir", str(logs), "--report", str(report),
            script, "{coordinator}", "{num_processes}", "{process_id}"]
    code, out, err = run_in_session(argv, env=env, cwd=cwd, timeout=RUN_TIMEOUT + 30)
    console = f"jaxrun exit {code}\n--- console stdout\n{out}--- console stderr\n{err}"
    assert report.exists(), f"jaxrun wrote no report\n{console}"
    codes = []
    for proc in sorted(json.loads(report.read_text())["processes"], key=lambda p: p["process_id"]):
        if proc["signal"]:
            codes.append(f"signal {signal.Signals[proc['signal']].value}")
        else:
            codes.append(f"exit {proc['exit_code']}")
    stdout, stderr = read_logs(logs)
    return Outcome(codes, stdout, stderr, scratch, console)


# --- the suite ------------------------------------------------------------------


def jax_free(environ) -> dict[str, str]:
    """What JAX reads must come from the pattern, not from whoever runs pytest."""
    env = {k: v for k, v in environ.items() if not k.startswith(("JAX_", "XLA_", "TF_CPP_"))}
    env.pop("JAXRUN_NO_PRELOAD", None)
    env["JAX_PLATFORMS"] = "cpu"
    # The symlinked pattern imports a sibling module: keep tests/data free of
    # __pycache__ folders.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def where_to_run(pattern: Pattern, symlink_dir: Path) -> tuple[str, Path]:
    if pattern.via_symlink:
        return "entry.py", symlink_dir
    return pattern.script, COMPAT


def three_ways(pattern: Pattern, symlink_dir: Path, base: Path, environ: dict[str, str]) -> dict:
    """The plain launch and jaxrun in both modes, side by side, under a token
    and a temporary folder of their own; every one has ended (or been killed)
    when this returns, and ``left`` names what outlived them (killed too)."""
    script, cwd = where_to_run(pattern, symlink_dir)
    token = uuid.uuid4().hex
    # Short, as the leak guard's: a socket's path in it must fit a Unix address.
    tmpdir = tempfile.mkdtemp(prefix="jr-", dir="/tmp")
    env = dict(jax_free(environ), TMPDIR=tmpdir, **{TOKEN: token})
    try:
        with concurrent.futures.ThreadPoolExecutor(1 + len(MODES)) as pool:
            futures = {"plain": pool.submit(plain_launch, script, cwd, base / "plain", env)}
            for mode in MODES:
                futures[mode] = pool.submit(jaxrun_launch, mode, script, cwd, base / mode, env)
            runs = {way: future.exception() or future.result() for way, future in futures.items()}
        runs["left"] = outlived(token)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return runs


@pytest.fixture(scope="module")
def pattern_runs(request, tmp_path_factory):
    """name -> the future of its three launches' outcomes ({"plain" or a mode:
    its Outcome, or the exception its launch raised; "left": what outlived
    them}).  A call starts the pattern's three and those of the next pattern
    this run will check, each at most once: two patterns at a time, the next
    one's start-up beside this one's waiting.  Every launch has ended when the
    module does."""
    # By name, not node id (under xdist's loadgroup a node id carries a suffix).
    order = [item.callspec.params["name"] for item in request.session.items
             if item.path == request.path and hasattr(item, "callspec")]
    selected = list(dict.fromkeys(order))
    # Taken once, here: the test's own fixtures change os.environ while a
    # pattern started ahead of its test is still starting processes.
    environ = {k: v for k, v in os.environ.items() if k not in (TOKEN, "TMPDIR")}
    links = tmp_path_factory.mktemp("links")  # entry.py -> tests/data/compat/symlinked/main.py, elsewhere
    (links / "entry.py").symlink_to(COMPAT / "symlinked" / "main.py")
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=2)
    started: dict[str, concurrent.futures.Future] = {}

    def start(name: str) -> concurrent.futures.Future:
        if name not in started:
            base = tmp_path_factory.mktemp(f"runs-{name}")
            started[name] = pool.submit(three_ways, PATTERNS[name], links, base, environ)
        return started[name]

    def runs(name: str) -> concurrent.futures.Future:
        own = start(name)
        later = selected[selected.index(name) + 1:] if name in selected else []
        following = next((n for n in later if n not in started), None)
        if following is not None:
            start(following)
        return own

    yield runs
    pool.shutdown(wait=True)


def outcome(runs: dict, way: str) -> Outcome:
    got = runs[way]
    if isinstance(got, BaseException):
        raise got
    return got


def check_reference(name: str, pattern: Pattern, ref: Outcome) -> None:
    """The plain launch must show the behaviour, or the comparison proves nothing."""
    assert tuple(ref.codes) == pattern.codes, f"{name}: plain launch exited {ref.codes}\n" + ref.show(0) + ref.show(1)
    for rank, needles in pattern.expect.items():
        text = ref.stdout[rank] + ref.stderr[rank]
        missing = [n for n in needles if n not in text]
        assert not missing, f"{name}: plain process {rank} lacks {missing}\n{ref.show(rank)}"
    check_files(ref, pattern, "plain launch")
    assert "still waiting" not in "".join(ref.stdout)


def check_files(outcome: Outcome, pattern: Pattern, who: str) -> None:
    for file_name, content in pattern.files.items():
        path = outcome.scratch / file_name
        found = path.read_text() if path.exists() else None
        assert found == content, f"{who}: {file_name} holds {found!r}, not {content!r}"
    for file_name, text in pattern.file_mentions.items():
        path = outcome.scratch / file_name
        found = path.read_text(errors="replace") if path.exists() else ""
        assert text in found, f"{who}: {file_name} does not mention {text!r}:\n{found}"


def differences(ref: Outcome, got: Outcome, mode: str) -> list[str]:
    found = []
    for rank in range(N):
        if ref.codes[rank] != got.codes[rank]:
            found.append(f"process {rank}: plain launch {ref.codes[rank]}, jaxrun ({mode}) {got.codes[rank]}")
        for stream, want, have in (("stdout", ref.stdout, got.stdout), ("stderr", ref.stderr, got.stderr)):
            a, b = normalize(want[rank]), normalize(have[rank])
            if a != b:
                diff = difflib.unified_diff(
                    a.splitlines(keepends=True), b.splitlines(keepends=True),
                    f"plain process-{rank}.{stream}", f"jaxrun {mode} process-{rank}.{stream}",
                )
                found.append("".join(line if line.endswith("\n") else line + "\n" for line in diff))
    return found


@pytest.mark.parametrize("name", list(PATTERNS))
@pytest.mark.both_modes
def test_pattern_matches_the_plain_launch(name, launch_mode, pattern_runs):
    pattern = PATTERNS[name]
    # Its launches are bounded (RUN_TIMEOUT, jaxrun's 30 s more, 5 s for leftovers), and they
    # started at the latest now: a pattern starts in its own test or ahead of it, never queued.
    runs = pattern_runs(name).result(timeout=RUN_TIMEOUT + 45)
    assert not runs["left"], f"{name}: processes outlived the launches: {runs['left']}"
    ref = outcome(runs, "plain")
    check_reference(name, pattern, ref)

    got = outcome(runs, launch_mode)
    found = differences(ref, got, launch_mode)
    assert not found, "\n".join(found) + "\n" + got.note
    check_files(got, pattern, f"jaxrun ({launch_mode})")
