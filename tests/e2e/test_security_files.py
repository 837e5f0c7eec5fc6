"""Nothing another user made first is followed, written through, read or
trusted (issue 75): the six ways in that files and folders in a place
another user can write gave, each tried by ``nobody`` (with an interpreter of
its own, tests/data/squatter.py, or its shell) against a job of root's.

Each test has a folder of its own in /var/tmp, root's and open to read
(0755), in which ``nobody`` makes what it makes: a team's log folder (0777,
nobody's), a shared temporary folder (1777, as /tmp), its links.
"""

import json
import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from fixtures.guide import check_guide_output
from fixtures.jobs import EXAMPLES, ROOT
from fixtures.others import as_nobody, nobody_runs

from jaxrun.launcher import channel

pytestmark = pytest.mark.timeout(240)
NOBODY = 65534


@pytest.fixture
def place(nobody):
    """A folder of root's (0755) where ``nobody`` may make things in ``team``
    (its own, 0777: a team's log folder) and ``tmp`` (1777: a shared
    temporary folder); ``private`` is root's (0700: this run's $TMPDIR)."""
    base = Path(tempfile.mkdtemp(prefix="jaxrun-files-", dir="/var/tmp"))
    os.chmod(base, 0o755)
    (base / "tmp").mkdir()
    os.chmod(base / "tmp", 0o1777)
    (base / "private").mkdir(mode=0o700)
    as_nobody(f"mkdir -m 0777 {base}/tmp/team")  # nobody's own
    os.rename(base / "tmp" / "team", base / "team")
    yield base
    subprocess.run(["rm", "-rf", str(base)], check=False)


@pytest.fixture
def squatter(nobody):
    """Start tests/data/squatter.py as ``nobody`` (it says "ready" once its
    plant is there); ``stop`` closes its stdin and gives its report.
    Every one started is killed at the end."""
    with nobody_runs(nobody, "squatter.py", ready=True) as start:
        yield start


def env_of(place: Path, **more) -> dict:
    env = {"TMPDIR": str(place / "private"), "XDG_RUNTIME_DIR": "", **more}
    return env


def everything(folder: Path) -> list[Path]:
    return [Path(top) / name for top, dirs, files in os.walk(folder) for name in dirs + files]


def test_a_team_log_folder_another_user_made_runs_the_toy_and_its_files_are_root_s_alone(jaxrun, place):
    """The acceptance: jaxrun's own files in a team's folder (nobody's, 0777)
    are 0600 and its folders 0700, all root's."""
    team = place / "team"
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, "--log-dir", team, EXAMPLES / "toy.py",
                            env=env_of(place), cwd=ROOT)
    assert code == 0, err
    check_guide_output(out)
    made = everything(team)
    assert any(p.name == "process-0.stdout" for p in made) and any(p.name == "run.json" for p in made), made
    for path in made:
        st = os.lstat(path)
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, want), (path, st.st_uid, oct(st.st_mode))


# -- 1: --profile in a team's log folder -------------------------------------------------

TRACED_SCRIPT = """\
import glob, sys, time
import jax, jax.numpy as jnp
x = jnp.ones((64, 64))
end = time.monotonic() + 90
while time.monotonic() < end and not glob.glob(sys.argv[1] + "/profile*/plugins/profile/*/*"):
    x = (x @ x) / 64
    x.block_until_ready()
    time.sleep(0.05)  # a step, then the host's own pause (as test_profile.py's job): traced, not a busy loop
time.sleep(2)  # the launcher's lines come once every file has moved
print("traced script done", flush=True)
"""


def test_profile_gathering_follows_no_link_and_moves_no_file_another_user_planted(start_job, squatter, place):
    """nobody makes links under LOGDIR/profile/plugins/profile/ for every
    second just past, into a folder only root may write (a login-script
    folder), and planted a finished trace under LOGDIR/profiling/process-0/.
    Nothing lands in root's folder, the planted file stays where it was,
    and no planted file is counted as a trace."""
    team, login = place / "team", place / "login"
    login.mkdir(mode=0o700)
    as_nobody(f"mkdir -p {team}/profiling/process-0/1-0/plugins/profile/2026_01_01_00_00_00 && "
              f"echo planted > {team}/profiling/process-0/1-0/plugins/profile/2026_01_01_00_00_00/h.xplane.pb && "
              f"echo '{{\"host\": \"h\"}}' > {team}/profiling/process-0/1-0/jaxrun-trace.json")
    links = squatter("links", team / "profile" / "plugins" / "profile", login, 10)
    script = place / "private" / "traced.py"
    script.write_text(TRACED_SCRIPT)
    # Two processes: --profile's clock starts once both joined, when each has its handler of the ask.
    job = start_job("-n", 2, "--cpu-devices", 1, "--log-dir", team, "--profile", "2:2", script, team,
                    env=env_of(place), cwd=ROOT)
    assert job.wait(timeout=150) == 0, job.stderr
    assert squatter.stop(links)["links"] > 0
    assert job.stdout.count("traced script done") == 2, job.stdout
    assert os.listdir(login) == [], job.stderr  # nothing moved through a link
    planted = team / "profiling" / "process-0" / "1-0" / "plugins" / "profile" / "2026_01_01_00_00_00" / "h.xplane.pb"
    assert planted.read_text() == "planted\n" and os.lstat(planted).st_uid == NOBODY, job.stderr
    traced = [line for line in job.stderr.splitlines() if "processes traced into" in line]
    assert len(traced) == 1 and f"2 of 2 processes traced into {team}/profile-" in traced[0], job.stderr
    session = Path(traced[0].split(" traced into ")[1])
    owners = {p.name: os.lstat(p).st_uid for p in session.iterdir()}  # root's own trace, not the plant
    assert owners and set(owners.values()) == {0} and not any(name.startswith("h-") for name in owners), owners
    for path in everything(team):
        if os.lstat(path).st_uid == 0:  # whatever root made: its own, private, never under nobody's
            assert all(os.lstat(parent).st_uid == 0 for parent in path.parents if team in parent.parents), path


# -- 2: the compile cache swapped after its check ------------------------------------------

CACHED_SCRIPT = """\
import os, sys, time
import jax, jax.numpy as jnp
attempt = int(os.environ["JAXRUN_RESTART_COUNT"])
open(os.path.join(sys.argv[1], f"ready-{attempt}"), "w").close()
while not os.path.exists(sys.argv[2]):
    time.sleep(0.05)
print("attempt", attempt, jax.jit(lambda x: x * 3 + 1)(jnp.arange(8)).tolist(), flush=True)
sys.exit(1 if attempt == 0 else 0)
"""


def test_the_compile_cache_cannot_be_swapped_for_another_user_s_between_or_within_attempts(start_job, place):
    """With --max-restarts 1 and a team's log folder, nobody renames root's
    compile-cache aside once process 0 has checked it, and makes its own in
    its place, and makes the next attempt's restart-1 first: no cache entry
    or log of root's lands in a folder of nobody's, and the attempts still
    share a cache (root's, private)."""
    team, private = place / "team", place / "private"
    script = private / "cached.py"
    script.write_text(CACHED_SCRIPT)
    go = private / "go"
    job = start_job("-n", 1, "--cpu-devices", 1, "--max-restarts", 1, "--log-dir", team, script, private, go,
                    env=env_of(place, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0"), cwd=ROOT)
    deadline = time.monotonic() + 120
    while not (private / "ready-0").exists():
        assert job.proc.poll() is None and time.monotonic() < deadline, job.wait()
        time.sleep(0.1)
    as_nobody(f"if [ -d {team}/compile-cache ]; then mv {team}/compile-cache {team}/aside && "
              f"mkdir -m 0777 {team}/compile-cache; fi; mkdir -m 0777 {team}/restart-1")
    go.write_text("")
    assert job.wait(timeout=150) == 0, job.stderr
    assert "attempt 1 [1, 4, 7" in job.stdout, job.stdout
    for path in everything(team):
        st = os.lstat(path)
        if st.st_uid == NOBODY and stat.S_ISDIR(st.st_mode):
            assert os.listdir(path) == [], (path, job.stderr)  # nothing of root's written into nobody's folder
    assert os.listdir(team / "restart-1") == [], job.stderr  # the attempt's logs: in a private restart-1-XXXXXXXX
    restarted = [p for p in team.iterdir() if p.name.startswith("restart-1-")]
    assert len(restarted) == 1 and contract_private(restarted[0]), job.stderr
    assert f"jaxrun: logs in {restarted[0]}" in job.stderr, job.stderr
    entries = [p for p in everything(private) if "jaxrun-cache-" in str(p) and p.is_file()]
    assert entries, everything(private)  # the attempts' cache: in root's private base
    for path in entries:
        assert all(contract_private(parent) for parent in path.parents if private in parent.parents), path


def contract_private(folder: Path) -> bool:
    st = os.lstat(folder)
    return stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o077


# -- 3: $XDG_RUNTIME_DIR through another user's link; a channel another user answers ----------

ADDRESS_SCRIPT = "import os\nprint('address', os.environ['JAXRUN_COORDINATOR_ADDRESS'], flush=True)\n"


def test_a_runtime_folder_reached_through_another_user_s_link_is_not_used(jaxrun, place):
    """$XDG_RUNTIME_DIR names nobody's link to a folder of root's (0700): the
    link is judged, not followed, and the job's sockets go elsewhere."""
    (place / "rootrun").mkdir(mode=0o700)
    as_nobody(f"ln -s {place}/rootrun {place}/tmp/runtime")
    script = place / "private" / "address.py"
    script.write_text(ADDRESS_SCRIPT)
    code, out, err = jaxrun("-n", 2, "--no-preload", script, env=env_of(place, XDG_RUNTIME_DIR=f"{place}/tmp/runtime"),
                            cwd=ROOT)
    assert code == 0, err
    addresses = [line.split()[-1] for line in out.splitlines() if " address " in line]
    assert len(addresses) == 2 and all("runtime" not in a and "rootrun" not in a for a in addresses), out
    assert os.listdir(place / "rootrun") == []


def test_jaxrun_top_asks_nothing_of_another_user_s_listener_on_a_channel_s_name(squatter, place):
    """A listener of nobody's at a run channel's name in root's socket folder
    (as a swap of the folder would leave it): top checks who listens and
    sends it nothing, in one line."""
    sockets = place / "tmp" / f"jaxrun-sockets-{os.getuid()}"
    sockets.mkdir(mode=0o700)
    os.chown(sockets, NOBODY, NOBODY)  # nobody may bind in it, for the time of the plant
    listener = squatter("listen", sockets / f"{channel.PREFIX}20991231-000000-aaaaaa{channel.SUFFIX}")
    os.chown(sockets, 0, 0)
    top = subprocess.run([sys.executable, "-m", "jaxrun", "top", "--once"], capture_output=True, text=True,
                         timeout=60, cwd=ROOT, env={**os.environ, **env_of(place, TMPDIR=str(place / "tmp"))})
    taken = squatter.stop(listener)
    assert taken == {"connections": 0, "bytes": 0}, (taken, top.stderr)
    assert top.returncode == 1 and "another user's" in top.stderr, top.stderr
    assert "Traceback" not in top.stderr


# -- 4: run.lock -----------------------------------------------------------------------------

SECRET = "TOKEN=s3cr3t-of-root"


def test_a_lock_another_user_planted_is_neither_written_nor_read(jaxrun, place):
    """A 0666 run.lock of nobody's in the team folder: root's command line
    (with a secret) never goes into it."""
    team = place / "team"
    as_nobody(f"touch {team}/run.lock && chmod 0666 {team}/run.lock")
    script = place / "private" / "hello.py"
    script.write_text("print('hello', flush=True)\n")
    code, out, err = jaxrun("-n", 1, "--no-preload", "--log-dir", team, "-x", SECRET, script, env=env_of(place),
                            cwd=ROOT)
    assert code == 0, err
    said = as_nobody(f"cat {team}/run.lock 2>/dev/null || true")
    assert "s3cr3t" not in said, said
    st = os.lstat(team / "run.lock")
    assert (st.st_uid, stat.S_IMODE(st.st_mode), st.st_nlink) == (0, 0o600, 1)


def test_a_lock_another_user_holds_is_not_obeyed_nor_quoted(jaxrun, squatter, place):
    """nobody holds a flock on its own run.lock, which names a run of its
    words: root's run goes on, and never prints them."""
    team = place / "team"
    words = json.dumps({"run_id": "NOBODY-SAYS-HI", "pid": 1, "started": 0, "argv": ["rm", "-rf", "/"]})
    holder = squatter("lock", team / "run.lock", words)
    script = place / "private" / "hello.py"
    script.write_text("print('hello', flush=True)\n")
    try:
        code, out, err = jaxrun("-n", 1, "--no-preload", "--log-dir", team, script, env=env_of(place), cwd=ROOT)
    finally:
        squatter.stop(holder)
    assert code == 0 and "hello" in out, err
    assert "NOBODY-SAYS-HI" not in out + err and "rm -rf" not in out + err, err


# -- 5: jaxrun logs ----------------------------------------------------------------------------

def planted_run(base: str, name: str, record: str, output: str) -> str:
    return (f"mkdir -p {base}/{name} && echo '{record}' > {base}/{name}/run.json && "
            f"echo '{output}' > {base}/{name}/process-0.stdout")


def test_jaxrun_logs_shows_no_run_of_another_user_s_and_skips_a_malformed_record(jaxrun, place):
    """nobody made the predictable base first, with a run of its own in it
    (the newest) and one whose run.json has ``started`` as a string; root's
    own base holds a malformed record too.  jaxrun logs lists and prints
    none of them, one line each, never a traceback."""
    shared = place / "tmp"
    base = f"{shared}/jaxrun-logs-{os.getuid()}"
    newest = json.dumps({"argv": ["planted"], "exit_code": 0, "started": 4102444800.0})
    as_nobody(f"mkdir -m 0755 {base} && "
              + planted_run(base, "20991231-000000-aaaaaa", newest, "PLANTED OUTPUT") + " && "
              + planted_run(base, "20991231-000000-bbbbbb", '{"started": "yesterday"}', "PLANTED TOO"))
    script = place / "private" / "hello.py"
    script.write_text("print('hello from root', flush=True)\n")
    env = env_of(place, TMPDIR=str(shared))
    code, out, err = jaxrun("-n", 1, "--no-preload", script, env=env, cwd=ROOT)
    assert code == 0, err
    mine = [line for line in err.splitlines() if "is not yours alone" in line]
    assert mine, err  # the run's logs went to a private folder of a random name
    mine_base = mine[0].split("this run's logs are in ")[1].split(",")[0]
    os.makedirs(f"{mine_base}/20000101-000000-cccccc")
    Path(f"{mine_base}/20000101-000000-cccccc/run.json").write_text('{"started": "then", "argv": 3}')
    for args in ([], ["--last"], ["--log-dir", base], ["--log-dir", base, "--last"]):
        logs = subprocess.run([sys.executable, "-m", "jaxrun", "logs", *args], capture_output=True, text=True,
                              timeout=60, cwd=ROOT, env={**os.environ, **env})
        assert "Traceback" not in logs.stderr, (args, logs.stderr)
        assert "PLANTED" not in logs.stdout and "planted" not in logs.stdout, (args, logs.stdout)
        assert "aaaaaa" not in logs.stdout and "bbbbbb" not in logs.stdout, (args, logs.stdout)
        if not args:
            assert "hello.py" in logs.stdout and "exit 0" in logs.stdout, logs.stdout  # root's own run, listed
            assert len([line for line in logs.stderr.splitlines() if "cccccc" in line]) == 1, logs.stderr
        if args == ["--last"]:
            assert logs.returncode == 0 and "hello from root" in logs.stdout, (logs.stdout, logs.stderr)
        if args[:2] == ["--log-dir", base]:
            skipped = [line for line in logs.stderr.splitlines() if "skipped" in line]
            assert len(skipped) == 2, logs.stderr  # one line each


# -- 6: an SSH host's cache and trace bases, made first by another user ------------------------

FAR_END = """\
import os, sys
from jaxrun import contract
from jaxrun.child.join import compile_cache
from jaxrun.child.watch.profiling import Tracer
env = {contract.COMPILE_CACHE: "run-1"}
print("cache", compile_cache.apply(env), flush=True)
tracer = Tracer("run-1-process-0")
tracer.start()  # jax is not imported: the session ends at once, with its marker
print("sessions", contract.trace_sessions(contract.trace_folder("run-1-process-0")), flush=True)
"""


def test_an_ssh_host_s_bases_made_first_by_another_user_give_way_to_private_ones(place):
    """nobody made this host's jaxrun-cache-UID and jaxrun-profile-UID first:
    the process's cache and its traces go to private folders of a random
    name beside them, where the host's traces agent finds them."""
    shared = place / "tmp"
    uid = os.getuid()
    as_nobody(f"mkdir -m 0777 {shared}/jaxrun-cache-{uid} {shared}/jaxrun-profile-{uid}")
    env = {**os.environ, "TMPDIR": str(shared)}
    done = subprocess.run([sys.executable, "-c", FAR_END], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env)
    assert done.returncode == 0, done.stderr
    cache = done.stdout.split("cache ")[1].split()[0]
    assert cache.startswith(f"{shared}/jaxrun-cache-{uid}-") and contract_private(Path(cache)), done.stdout
    assert "sessions (['" in done.stdout, (done.stdout, done.stderr)
    agent = subprocess.run([sys.executable, "-m", "jaxrun.backends.ssh.traces_agent", "run-1-process-0", "1"],
                           capture_output=True, timeout=60, cwd=ROOT, env=env)
    assert agent.returncode == 0 and len(agent.stdout) > 0, agent.stderr
    assert os.listdir(f"{shared}/jaxrun-cache-{uid}") == [] and os.listdir(f"{shared}/jaxrun-profile-{uid}") == []
