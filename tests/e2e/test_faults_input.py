"""Bad input and hostile files, tried on the real jaxrun (#16).

Each bad input runs the real ``jaxrun`` as a subprocess and must end with
exit 2, exactly one line on stderr that starts ``jaxrun: error:``, no
traceback, no process started (the script and the fake engines leave a mark
when they run; where strace works, the trace shows that jaxrun never forked
at all) and no log folder created.

Then the files: a second user running after root with the default log
folder (``setpriv`` to ``nobody``, and a venv on the system Python that
reaches hard links of this Python's packages, since ``nobody`` cannot read
``/root``), symlinks planted in a reused ``--log-dir``, a report folder that
goes away during the run, and a 96 MiB stderr log whose summary must not cost
jaxrun its size in memory.

The README's "Faults and bad input" table quotes ``BAD_INPUTS`` (and the
inputs tried as ``nobody``) from this module.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fixtures.jobs import JAXRUN, ROOT

NOBODY = "nobody"
RAN = "ran"  # the mark any started script or fake engine leaves

# The local jobs' scripts are plain Python: one launch mode, without the preloading server.
pytestmark = pytest.mark.plain_python

# The script every bad input names: if it ever runs, it leaves a mark.
MARKING_SCRIPT = "from pathlib import Path\nPath(__file__).with_name('ran').touch()\nprint('hello')\n"
FAKE_ENGINE = "#!/bin/sh\ntouch \"$(dirname \"$0\")/../ran\"\nexit 0\n"

# (id, arguments, environment, the message's distinctive part).  In the
# arguments, {script} is the marking script, {file} a regular file, {dir} the
# test's folder, {hosts} a hosts file with slots=100000000, {empty} a folder
# with no programs (for PATH) and {fake} one with fake srun, mpirun and ssh.
BAD_INPUTS = [
    ("timeout-nan", ["--timeout", "nan"], {}, "'--timeout': 'nan' is not a finite number of seconds up to 1000000000"),
    ("timeout-inf", ["--timeout", "inf"], {}, "'--timeout': 'inf' is not a finite number of seconds"),
    ("timeout-1e300", ["--timeout", "1e300"], {}, "'--timeout': '1e300' is not a finite number of seconds"),
    ("grace-nan", ["--grace", "nan"], {}, "'--grace': 'nan' is not a finite number of seconds"),
    ("grace-inf", ["--grace", "inf"], {}, "'--grace': 'inf' is not a finite number of seconds"),
    ("connect-timeout-nan", ["--connect-timeout", "nan"], {}, "'--connect-timeout': 'nan' is not a finite"),
    ("connect-timeout-inf", ["--connect-timeout", "inf"], {}, "'--connect-timeout': 'inf' is not a finite"),
    ("python-missing", ["--python", "/nonexistent"], {}, "--python /nonexistent: no such file"),
    ("python-not-executable", ["--python", "{file}"], {}, "--python {file}: not an executable file"),
    ("python-is-a-folder", ["--python", "{dir}"], {}, "--python {dir}: not an executable file"),
    ("python-missing-slurm", ["--launcher", "slurm", "--python", "/nonexistent"], {"PATH": "{fake}"},
     "--python /nonexistent: no such file"),
    ("python-missing-mpirun", ["--launcher", "mpirun", "--python", "/nonexistent"], {"PATH": "{fake}"},
     "--python /nonexistent: no such file"),
    ("log-dir-under-a-file", ["--log-dir", "{file}/logs"], {}, "--log-dir {file}/logs: {file} is a file, not a folder"),
    ("log-dir-is-a-file", ["--log-dir", "{file}"], {}, "is a file"),
    ("mpirun-not-on-path", ["--launcher", "mpirun"], {"PATH": "{empty}"}, "--launcher mpirun: mpirun is not on PATH"),
    ("srun-not-on-path", ["--launcher", "slurm"], {"PATH": "{empty}"}, "--launcher slurm: srun is not on PATH"),
    ("ssh-not-on-path", ["-H", "localhost"], {"PATH": "{empty}"},
     "--hosts/-H: ssh (the OpenSSH client) is not on PATH"),
    ("report-folder-missing", ["--report", "{dir}/missing/r.json"], {},
     "--report {dir}/missing/r.json: the folder {dir}/missing does not exist"),
    ("junit-folder-missing", ["--junit-xml", "{dir}/missing/j.xml"], {},
     "--junit-xml {dir}/missing/j.xml: the folder {dir}/missing does not exist"),
    ("report-folder-is-a-file", ["--report", "{file}/r.json"], {}, "the folder {file} is not a folder"),
    ("n-100000000", ["-n", "100000000"], {}, "-n 100000000: jaxrun needs about 600000027 open files"),
    ("n-100000000-ssh", ["-n", "100000000", "-H", "localhost"], {"PATH": "{fake}"}, "(5 each, ssh run)"),
    ("slurm-ntasks-100000000", ["--launcher", "slurm"], {"PATH": "{fake}", "SLURM_NTASKS": "100000000"},
     "-n 100000000: jaxrun needs about 900000027 open files"),
    ("hosts-slots-100000000", ["--hosts", "{hosts}"], {}, "{hosts}:2: slots must be between 1 and 4096, got 100000000"),
    ("H-slots-100000000", ["-H", "localhost:100000000"], {},
     "-H localhost:100000000: slots must be between 1 and 4096"),
    ("H-slots-superscript", ["-H", "localhost:²"], {}, "slots must be a whole number, got '²'"),
    ("hosts-file-endless", ["--hosts", "/dev/zero"], {}, "/dev/zero: more than 1 MiB; is it a hosts file?"),
    ("console-ranks-0-100000000000", ["-n", "4", "--console-ranks", "0-100000000000"], {},
     "--console-ranks: there is no process 100000000000 among 4"),
    ("console-ranks-superscript", ["--console-ranks", "²"], {}, "'²' is not a list of ranks"),
    ("coordinator-superscript", ["--coordinator", "127.0.0.1:²"], {}, "is not HOST:PORT"),
    ("devices-per-process-1000000000", ["--devices-per-process", "1000000000"], {"CUDA_VISIBLE_DEVICES": None},
     "--devices-per-process 1000000000: "),
    ("devices-per-process-beyond-gpus", ["--devices-per-process", "3"], {"CUDA_VISIBLE_DEVICES": "0,1"},
     "--devices-per-process 3: this machine has 2 GPUs"),
    ("export-unset", ["-x", "JAXRUN_TEST_UNSET"], {"JAXRUN_TEST_UNSET": None},
     "-x JAXRUN_TEST_UNSET: JAXRUN_TEST_UNSET is not set here"),
    ("launcher-ssh-without-hosts", ["--launcher", "ssh"], {"PATH": "{fake}"},
     "--launcher ssh needs --hosts FILE or -H HOST"),
    ("hosts-with-launcher-slurm", ["--launcher", "slurm", "-H", "localhost"], {"PATH": "{fake}"},
     "--hosts and -H start processes over SSH; they do not work with --launcher slurm"),
    ("nodes-without-scheduler", ["--nodes", "2"], {},
     "--nodes, --ntasks-per-node and --scheduler-arg need --launcher slurm or mpirun"),
    ("nodes-with-mpirun", ["--launcher", "mpirun", "--nodes", "2"], {"PATH": "{fake}"},
     "--nodes works with --launcher slurm only; give mpirun its hosts with --scheduler-arg"),
]


@pytest.fixture
def place(tmp_path):
    """The files BAD_INPUTS refers to, and the values of its placeholders."""
    (tmp_path / "s.py").write_text(MARKING_SCRIPT)
    (tmp_path / "plain").write_text("")
    (tmp_path / "hosts").write_text("localhost\nnode2 slots=100000000\n")
    (tmp_path / "empty").mkdir()
    fake = tmp_path / "fake"
    fake.mkdir()
    for name in ("srun", "mpirun", "ssh"):
        (fake / name).write_text(FAKE_ENGINE)
        (fake / name).chmod(0o755)
    return {"script": str(tmp_path / "s.py"), "file": str(tmp_path / "plain"), "dir": str(tmp_path),
            "hosts": str(tmp_path / "hosts"), "empty": str(tmp_path / "empty"), "fake": str(fake)}


@pytest.fixture(scope="module")
def strace():
    """strace, where it can trace here (it needs ptrace), else None."""
    path = shutil.which("strace")
    if path and subprocess.run([path, "-f", "-qq", "-o", os.devnull, "true"], capture_output=True).returncode == 0:
        return path
    return None


def fill(text: str, values: dict) -> str:
    return text.format(**values)


def run_jaxrun(args, env=None, prefix=(), command=JAXRUN, cwd=None, timeout=60) -> subprocess.CompletedProcess:
    """jaxrun to the end (subprocess.run kills it if it outlives ``timeout``)."""
    full = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return subprocess.run([*prefix, *command, *map(str, args)], env=full, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def assert_one_error_line(proc: subprocess.CompletedProcess, message: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("jaxrun: error: ") and proc.stderr.endswith("\n"), proc.stderr
    assert message in proc.stderr, proc.stderr
    assert proc.stdout == ""


def forks_in(trace: str) -> list[str]:
    """Process-creating calls in an ``strace -f`` log (threads excluded), and
    every program executed after jaxrun's own interpreter."""
    lines = trace.splitlines()
    forks = [line for line in lines if re.search(r"\b(fork|vfork|clone3?)\(", line) and "CLONE_THREAD" not in line]
    execs = [line for line in lines if "execve(" in line][1:]
    return forks + execs


def log_folders(tmpdir: str) -> list[str]:
    return sorted(name for name in os.listdir(tmpdir) if name.startswith("jaxrun-logs"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name, args, env, message", BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_nothing_starts(name, args, env, message, place, strace, tmp_path):
    env = {k: None if v is None else fill(v, place) for k, v in env.items()}
    args = [fill(a, place) for a in args]
    logs = tmp_path / "logs"
    if "--log-dir" not in args:
        args = ["--log-dir", str(logs), *args]
    trace = tmp_path / "trace"
    prefix = (strace, "-f", "-qq", "-o", str(trace), "-e", "trace=execve,fork,vfork,clone,clone3") if strace else ()
    proc = run_jaxrun([*args, place["script"]], env=env, prefix=prefix)
    assert_one_error_line(proc, fill(message, place))
    assert not (tmp_path / RAN).exists(), "the script or an engine ran"
    assert not logs.exists()
    assert log_folders(os.environ["TMPDIR"]) == []
    if strace:
        assert forks_in(trace.read_text()) == []


# The bad inputs found last, after the default log folder's place is known.
FOUND_LATE = ("export-unset", "nodes-with-mpirun", "srun-not-on-path", "report-folder-missing", "python-missing")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", FOUND_LATE)
def test_bad_input_found_late_creates_no_default_log_folder(name, place, tmp_path):
    (_, args, env, message), = [case for case in BAD_INPUTS if case[0] == name]
    env = {k: None if v is None else fill(v, place) for k, v in env.items()}
    proc = run_jaxrun([*(fill(a, place) for a in args), place["script"]], env=env)
    assert_one_error_line(proc, fill(message, place))
    assert log_folders(os.environ["TMPDIR"]) == []


# -- limits the machine sets ------------------------------------------------------


@pytest.mark.timeout(60)
def test_open_file_limit_is_named(place, tmp_path):
    prlimit = shutil.which("prlimit") or pytest.skip("prlimit (util-linux) is not installed")
    proc = run_jaxrun(["--log-dir", tmp_path / "logs", "-n", 300, place["script"]],
                      prefix=(prlimit, "--nofile=256:256", "--"))
    assert_one_error_line(proc, "-n 300: jaxrun needs about 1827 open files for that many processes (6 each, "
                                "local run), but the open-file limit is 256 (ulimit -Hn); at most 38 processes")
    assert not (tmp_path / RAN).exists() and not (tmp_path / "logs").exists()


@pytest.mark.timeout(120)
@pytest.mark.both_modes
def test_soft_open_file_limit_is_raised_to_the_hard_one(jaxrun, tmp_path):
    # 24 of its own + 6 per process is more than a soft limit of 70 at -n 8: jaxrun raises it, as launchers do.
    prlimit = shutil.which("prlimit") or pytest.skip("prlimit (util-linux) is not installed")
    script = tmp_path / "limit.py"
    script.write_text("import resource\nprint('NOFILE', *resource.getrlimit(resource.RLIMIT_NOFILE))\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("fixtures.jobs.JAXRUN", [prlimit, "--nofile=70:4096", "--", *JAXRUN])
        code, out, err = jaxrun("-n", 8, "--cpu-devices", 1, script)  # (on a GPU host, 8 would share its GPUs)
    assert code == 0, err
    assert out.count("NOFILE 4096 4096") == 8, out


# -- the default log folder: per user, private -------------------------------------


def own_base(tmpdir: str) -> Path:
    return Path(tmpdir) / f"jaxrun-logs-{os.geteuid()}"


@pytest.mark.timeout(120)
def test_default_logs_are_private(jaxrun, tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise SystemExit(3)\n")
    code, _, err = jaxrun("-n", 2, "--cpu-devices", 1, "--max-restarts", 1, script)
    assert code == 3, err
    base = own_base(os.environ["TMPDIR"])
    (run_dir,) = base.iterdir()
    assert f"jaxrun: logs in {run_dir}/restart-1" in err
    for folder in (base, run_dir, run_dir / "restart-1"):
        assert stat.S_IMODE(folder.lstat().st_mode) == 0o700, folder
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    # stdout and stderr of 2 processes in 2 attempts, the run's record, its lock and its timeline
    assert sorted(p.name for p in files if p.parent == run_dir) == [
        "process-0.stderr", "process-0.stdout", "process-1.stderr", "process-1.stdout", "run.json", "run.lock",
        "timeline.jsonl"]
    assert len(files) == 11, files
    assert all(stat.S_IMODE(p.lstat().st_mode) == 0o600 for p in files), files


def plant_base(tmpdir: str, kind: str) -> Path:
    base = own_base(tmpdir)
    if kind == "symlink":
        elsewhere = Path(tmpdir) / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        base.symlink_to(elsewhere)
    elif kind == "file":
        base.write_text("")
    elif kind == "fifo":
        os.mkfifo(base)
    else:
        base.mkdir()
        base.chmod(0o755 if kind == "mode-0755" else 0o700)
        if kind == "other-owner":
            if os.geteuid() != 0:
                pytest.skip("giving a folder to another user needs root")
            nobody = pwd.getpwnam(NOBODY)
            os.chown(base, nobody.pw_uid, nobody.pw_gid)
    return base


NOT_A_FOLDER = "it is not a folder (a symlink or a file)"
BASE_PROBLEMS = [
    ("mode-0755", "other users have access to it (mode 0755)"),
    ("other-owner", "it belongs to uid {uid}"),
    ("symlink", NOT_A_FOLDER),
    ("file", NOT_A_FOLDER),
    ("fifo", NOT_A_FOLDER),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind, problem", BASE_PROBLEMS, ids=[p[0] for p in BASE_PROBLEMS])
def test_default_base_that_is_not_private_is_left_untouched_for_one_of_a_random_name(kind, problem, place):
    """Another user's name in the way stops no run (issue 70): the logs go to
    a private folder of a random name beside it, said in one line."""
    tmpdir = os.environ["TMPDIR"]
    base = plant_base(tmpdir, kind)
    before = base.lstat()
    proc = run_jaxrun([place["script"]])
    assert proc.returncode == 0, proc.stderr
    (logs,) = re.findall(r"jaxrun: logs in (\S+)", proc.stderr)
    chosen = Path(logs).parent
    assert chosen.parent == Path(tmpdir) and chosen.name.startswith(base.name + "-"), logs
    assert stat.S_IMODE(chosen.lstat().st_mode) == 0o700 and chosen.lstat().st_uid == os.geteuid()
    said = [line for line in proc.stderr.splitlines() if "is not yours alone" in line]
    assert said == [f"jaxrun: the log folder {base} is not yours alone ({problem.format(uid=before.st_uid)}): "
                    f"this run's logs are in {chosen}, a private folder of a random name"], proc.stderr
    after = base.lstat()
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)  # not repaired
    if kind == "symlink" or stat.S_ISDIR(after.st_mode):
        assert list(base.iterdir()) == []  # (through the symlink: the folder it points at)


# -- files in a reused --log-dir ------------------------------------------------------


FAILING = "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nraise ValueError('boom')\n"


# Process 1 fails only once process 0 has printed: whichever fails first,
# fail-fast cannot kill process 0 before its line is in its log.
FAILING_AFTER_0_PRINTED = """\
import os, sys, time
if os.environ["JAXRUN_PROCESS_ID"] == "1":
    deadline = time.monotonic() + 30
    while not os.path.getsize(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.01)
""" + FAILING


@pytest.mark.timeout(120)
def test_symlinks_planted_in_the_log_folder_are_never_followed(jaxrun, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    victim = tmp_path / "precious"
    victim.write_text("keep me\n")
    for name in ("process-0.stdout", "process-0.stderr", "process-0.error.json"):
        (logs / name).symlink_to(victim)
    (logs / "process-1.error.json").symlink_to(tmp_path / "created-through-a-link")  # dangling
    script = tmp_path / "fail.py"
    script.write_text(FAILING_AFTER_0_PRINTED)
    code, _, err = jaxrun("-n", 2, "--cpu-devices", 1, "--log-dir", logs, script, logs / "process-0.stdout")
    assert code == 1, err
    assert victim.read_text() == "keep me\n"
    assert not (tmp_path / "created-through-a-link").exists()
    assert "ValueError: boom" in err  # the error records were written, as files of their own
    assert (logs / "process-0.stdout").read_text() == "to stdout\n"
    for path in logs.iterdir():
        assert not path.is_symlink(), path


@pytest.mark.timeout(120)
def test_report_folder_gone_during_the_run_keeps_status_and_restarts(jaxrun, tmp_path):
    # Checked before the start; if it goes away anyway, one line says so, and
    # the job's exit status and its remaining restarts are kept.
    reports = tmp_path / "reports"
    reports.mkdir()
    script = tmp_path / "s.py"
    script.write_text(f"import shutil\nshutil.rmtree({str(reports)!r}, ignore_errors=True)\nraise SystemExit(3)\n")
    code, _, err = jaxrun("--max-restarts", 1, "--log-dir", tmp_path / "logs", "--report", reports / "r.json",
                          "--junit-xml", reports / "j.xml", script)
    assert code == 3, err
    assert "restarting the whole job (restart 1 of 1)" in err
    assert (tmp_path / "logs" / "restart-1" / "process-0.stderr").exists()
    assert err.count(f"jaxrun: --report {reports}/r.json: cannot write it (No such file or directory)") == 2
    assert err.count(f"jaxrun: --junit-xml {reports}/j.xml: cannot write it") == 2
    assert "Traceback" not in err


@pytest.mark.timeout(120)
def test_report_and_junit_replace_their_files_atomically(jaxrun, tmp_path):
    victim = tmp_path / "precious"
    victim.write_text("keep me\n")
    for name in ("r.json", "r.json.tmp", "j.xml"):
        (tmp_path / name).symlink_to(victim)
    script = tmp_path / "s.py"
    script.write_text("print('ok')\n")
    code, _, err = jaxrun("--report", tmp_path / "r.json", "--junit-xml", tmp_path / "j.xml", script)
    assert code == 0, err
    assert victim.read_text() == "keep me\n"
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 0
    assert (tmp_path / "j.xml").read_text().startswith("<?xml")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("r.", "j.", ".r.", ".j."))) == [
        "j.xml", "r.json", "r.json.tmp"]  # the planted name is left alone, no temporary file is left


# -- a huge log after a failure ------------------------------------------------------------

LOG_MIB = 96
FAILING_WITH = """\
import os
line = b"y" * 99 + b"\\n"
chunk = line * 10486  # 1 MiB of short lines
for _ in range({mib}):
    os.write(2, chunk)
os.write(2, b"THE END\\n")
raise SystemExit(3)
"""
# jaxrun's own peak memory, printed by jaxrun's process itself as it exits.
MEASURED = ("import atexit, resource, sys; "
            "atexit.register(lambda: print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
            "file=sys.stderr)); from jaxrun.cli import entry_point; entry_point(sys.argv[1:])")


def peak_after_failure(folder: Path, mib: int) -> tuple[int, subprocess.CompletedProcess]:
    """jaxrun's peak RSS (KiB) for a run whose process fails after writing ``mib`` MiB to stderr."""
    folder.mkdir()
    script = folder / "fail.py"
    script.write_text(FAILING_WITH.format(mib=mib))
    proc = run_jaxrun(["--no-preload", "--console-ranks", "none", "--log-dir", folder / "logs",
                       "--report", folder / "r.json", "--junit-xml", folder / "j.xml", script],
                      command=(sys.executable, "-c", MEASURED), timeout=150)
    assert proc.returncode == 3, proc.stderr[-2000:]
    (peak,) = re.findall(r"^MAXRSS_KIB (\d+)$", proc.stderr, re.M)
    return int(peak), proc


@pytest.mark.timeout(180)
def test_summary_and_reports_of_a_huge_log_cost_little_memory(tmp_path):
    # Without the preload server and with a child that never imports jax, only
    # jaxrun's own reading of the log can make its peak grow with the log.
    # Compared with the same run and a 1 MiB log, since Pythons start at different sizes.
    small, _ = peak_after_failure(tmp_path / "small", 1)
    big, proc = peak_after_failure(tmp_path / "big", LOG_MIB)
    assert (tmp_path / "big" / "logs" / "process-0.stderr").stat().st_size > LOG_MIB << 20
    assert "    THE END" in proc.stderr
    assert json.loads((tmp_path / "big" / "r.json").read_text())["root_cause"]["stderr_tail"][-1] == "THE END"
    assert "THE END" in (tmp_path / "big" / "j.xml").read_text()
    assert big - small < 16 * 1024, f"jaxrun's peak RSS grew by {(big - small) >> 10} MiB for a {LOG_MIB} MiB log"


# -- a second user --------------------------------------------------------------------------


def distributions(*names: str) -> dict[str, importlib.metadata.Distribution]:
    """``names`` and everything they require, by normalized name."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.match(r"[A-Za-z0-9_.-]+", todo.pop()).group()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in found:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # an optional one, behind a marker
        found[key] = dist
        todo += [req for req in dist.requires or [] if "extra ==" not in req]
    return found


def link_tree(files, source_root: Path, target_root: Path) -> None:
    """Hard links (a copy across file systems) of ``files``, in folders others may read."""
    for rel in files:
        rel = Path(rel)
        if rel.is_absolute() or ".." in rel.parts:
            continue  # scripts installed outside site-packages
        src, dst = source_root / rel, target_root / rel
        if not src.is_file():
            continue
        for parent in reversed(dst.relative_to(target_root).parents[:-1]):
            folder = target_root / parent
            if not folder.exists():
                folder.mkdir()
                folder.chmod(0o755)
        try:
            os.link(src, dst)
        except FileExistsError:
            pass
        except OSError:
            shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def other_user():
    """(argv prefix that runs a command as nobody, python for nobody, a folder
    nobody can read).  nobody cannot read this Python (under /root), so it
    gets a venv on the system Python whose site-packages reach hard links of
    the packages jaxrun and jax need, and a copy of jaxrun."""
    if os.geteuid() != 0:
        pytest.skip("switching to another user needs root")
    setpriv = shutil.which("setpriv") or pytest.skip("setpriv (util-linux) is not installed")
    system_python = "/usr/bin/python3"
    if not os.access(system_python, os.X_OK):
        pytest.skip(f"{system_python} is missing: nobody needs a Python it can read")
    nobody = pwd.getpwnam(NOBODY)
    as_nobody = [setpriv, f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups", "--"]
    place = Path(tempfile.mkdtemp(prefix="jaxrun-second-user-", dir="/tmp"))
    try:
        place.chmod(0o755)
        subprocess.run([system_python, "-m", "venv", "--without-pip", place / "venv"], check=True, capture_output=True)
        python = place / "venv" / "bin" / "python"
        site = place / "site"
        site.mkdir(mode=0o755)
        for dist in distributions("jax", "click", "psutil").values():
            link_tree(dist.files or [], Path(dist.locate_file("")), site)
        shutil.copytree(ROOT / "jaxrun", site / "jaxrun", ignore=shutil.ignore_patterns("__pycache__"))
        for path in [site / "jaxrun", *(site / "jaxrun").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        venv_site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                   check=True, capture_output=True, text=True).stdout.strip()
        Path(venv_site, "second_user.pth").write_text(f"{site}\n")
        home = place / "home"
        home.mkdir()
        home.chmod(0o777)
        probe = subprocess.run([*as_nobody, python, "-c", "import jax, jaxrun.cli"], capture_output=True, text=True,
                               env={"HOME": str(home), "PATH": os.environ["PATH"]}, timeout=120)
        if probe.returncode != 0:
            pytest.skip(f"nobody cannot import jax and jaxrun through a venv on {system_python}: "
                        f"{probe.stderr.strip().splitlines()[-1:]}")
        yield as_nobody, python, place
    finally:
        shutil.rmtree(place, ignore_errors=True)


JAX_JOB = "import jax\nprint('JOB', jax.process_index(), jax.process_count(), jax.device_count())\n"


def run_as(prefix, python, args, env, cwd, timeout=240) -> subprocess.CompletedProcess:
    """A command as another user, in a session of its own that is killed with
    its group if the test gives up on it."""
    proc = subprocess.Popen([*prefix, str(python), "-m", "jaxrun", *map(str, args)], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture
def shared_tmp(other_user):
    """A sticky, world-writable TMPDIR, like /tmp, that root and nobody share."""
    _, _, place = other_user
    tmp = Path(tempfile.mkdtemp(prefix="tmp-", dir=place))
    tmp.chmod(0o1777)
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def user_env(home: Path, tmpdir: Path) -> dict:
    env = dict(os.environ)
    env.update(HOME=str(home), TMPDIR=str(tmpdir))
    return env


@pytest.mark.timeout(600)
def test_second_user_runs_after_root_and_cannot_read_roots_logs(other_user, shared_tmp):
    as_nobody, nobody_python, place = other_user
    script = place / "job.py"
    script.write_text(JAX_JOB)
    script.chmod(0o644)
    env = user_env(place / "home", shared_tmp)
    # (From the checkout, as every test runs ``python -m jaxrun``; nobody gets a copy of the same package.)
    first = run_as((), sys.executable, ["-n", 2, "--cpu-devices", 1, script], env, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    second = run_as(as_nobody, nobody_python, ["-n", 2, "--cpu-devices", 1, script], env, cwd=place)
    assert second.returncode == 0, second.stderr  # was: PermissionError in root's 0755 folder
    assert "Traceback" not in second.stderr
    assert sorted(re.findall(r"JOB \d \d \d", second.stdout)) == ["JOB 0 2 2", "JOB 1 2 2"]

    (root_logs,) = re.findall(r"jaxrun: logs in (\S+)", first.stderr)
    (their_logs,) = re.findall(r"jaxrun: logs in (\S+)", second.stderr)
    nobody = pwd.getpwnam(NOBODY)
    assert Path(root_logs).parent == shared_tmp / "jaxrun-logs-0"
    assert Path(their_logs).parent == shared_tmp / f"jaxrun-logs-{nobody.pw_uid}"
    assert Path(their_logs).parent.stat().st_uid == nobody.pw_uid
    for path in (Path(root_logs) / "process-0.stdout", Path(root_logs)):
        peek = subprocess.run([*as_nobody, "/bin/cat" if path.is_file() else "/bin/ls", path],
                              capture_output=True, text=True, timeout=30)
        assert peek.returncode != 0 and "Permission denied" in peek.stderr, (path, peek)
    assert "JOB 0 2 2" in (Path(root_logs) / "process-0.stdout").read_text()


NOBODY_BAD_INPUTS = [
    ("log-dir-not-writable", ["--log-dir", "{root_only}/logs"],
     "--log-dir {root_only}/logs: cannot create folders in {root_only} (permission denied)"),
    ("log-dir-exists-not-writable", ["--log-dir", "{root_only}"],
     "--log-dir {root_only}: cannot write there (permission denied)"),
    ("report-folder-not-writable", ["--report", "{root_only}/r.json"],
     "--report {root_only}/r.json: cannot write in {root_only} (permission denied)"),
    ("junit-folder-not-writable", ["--junit-xml", "{root_only}/j.xml"],
     "--junit-xml {root_only}/j.xml: cannot write in {root_only} (permission denied)"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name, args, message", NOBODY_BAD_INPUTS, ids=[c[0] for c in NOBODY_BAD_INPUTS])
def test_folders_another_user_cannot_write_are_bad_input(name, args, message, other_user, shared_tmp):
    as_nobody, nobody_python, place = other_user
    root_only = place / "root-only"  # 0755, root's: nobody may look, not write
    root_only.mkdir(mode=0o755, exist_ok=True)
    script = place / "mark.py"
    script.write_text(MARKING_SCRIPT)
    script.chmod(0o644)
    values = {"root_only": root_only}
    proc = run_as(as_nobody, nobody_python, [*(fill(a, values) for a in args), script],
                  user_env(place / "home", shared_tmp), cwd=place, timeout=60)
    assert_one_error_line(proc, fill(message, values))
    assert not (place / RAN).exists() and list(root_only.iterdir()) == []
    assert log_folders(str(shared_tmp)) == []
