"""Local runs with real JAX processes: the toy, argument passing, logs, binding."""

import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from fixtures.guide import GUIDE_SHARDS, RESULT, check_guide_output
from fixtures.jobs import DATA, EXAMPLES, joins_said, processes_with_token

from jaxrun import contract, portable

pytestmark = pytest.mark.timeout(120)

def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    mapped = getattr(addr, "ipv4_mapped", None)
    return addr.is_loopback or bool(mapped and mapped.is_loopback)


# The guide's own toy, unchanged: its argv from placeholders, and its own
# initialize("localhost:10000", ...), which is noted, not obeyed.  (examples/toy.py,
# which calls none, is test_examples.py's and the README's.)
@pytest.mark.both_modes
def test_the_guides_toy_runs_unchanged_with_placeholders_and_matches_the_guide(jaxrun, tmp_path):
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, "--log-dir", tmp_path, DATA / "guide_toy.py",
                            "{process_id}", "{num_processes}")
    assert code == 0, err
    check_guide_output(out)
    assert "ignoring coordinator_address='localhost:10000'" in err
    assert "[Gloo]" not in out  # noise hidden on the console ...
    for rank in range(4):  # ... but every byte is in the logs
        log = (tmp_path / f"process-{rank}.stdout").read_text()
        assert "[Gloo]" in log and f"process={rank} {RESULT}" in log
    assert f"jaxrun: logs in {tmp_path}" in err
    # Off a terminal, start-up progress is no line when all is well (one,
    # drawn with no escape sequence, for a slow join), and no joined file
    # is left in the log folder.
    joins_said(err, tmp_path, 4)
    assert "\x1b" not in err
    assert not list(tmp_path.glob("*.joined"))


# One 8-device process is test_examples.py's toy-1x8, which checks every block.
@pytest.mark.parametrize("n, devices", [(2, 4)])
def test_toy_gives_the_same_result_in_other_layouts(jaxrun, n, devices):
    code, out, err = jaxrun("-n", n, "--cpu-devices", devices, EXAMPLES / "toy.py")
    assert code == 0, err
    data = sorted(re.findall(r"has local data (\[\[.*\]\])", out))
    assert len(data) == 8
    assert all(f"process={r} {RESULT}" in out for r in range(n))


def test_a_one_process_job_whose_script_initializes_gets_its_plain_launch_numbers(jaxrun, tmp_path):
    # A plain launch's initialize() builds JAX's CPU collectives even for one
    # process, and 8 devices then reduce through them: the guide's toy's last
    # digits differ from a bare python's.  (Where the machine refuses internet
    # sockets jaxrun builds none: test_no_network.py.)
    script = tmp_path / "toy.py"
    script.write_text((DATA / "guide_toy.py").read_text().replace('"localhost:10000"', "sys.argv[3]"))
    env = {k: v for k, v in os.environ.items() if k != "JAXRUN_NO_PRELOAD"} | contract.cpu_env(8)
    coordinator = f"127.0.0.1:{portable.free_port('127.0.0.1')}"
    plain = subprocess.run([sys.executable, script, "0", "1", coordinator], env=env, capture_output=True,
                           text=True, timeout=90)
    (expected,) = re.findall(r"got result: \S+", plain.stdout) or [plain.stderr]
    code, out, err = jaxrun("--cpu-devices", 8, script, "0", "1", coordinator)
    assert code == 0, err
    assert re.findall(r"got result: \S+", out) == [expected]


def test_mismatched_initialize_is_an_error_naming_both_values(jaxrun, tmp_path):
    script = tmp_path / "wrong.py"
    script.write_text("import jax\njax.distributed.initialize('localhost:1', 2, 5)\n")
    code, _, err = jaxrun("-n", 2, "--cpu-devices", 1, script)
    assert code == 1
    # Both processes disagree; whichever fails first shows its error in full,
    # with its own value and jaxrun's for it (the other's is folded).
    mismatch = re.compile(r"^\[(\d)\] RuntimeError: jax\.distributed\.initialize\(process_id=5\) disagrees with "
                          r"jaxrun, which started this process with process_id=\1$", re.M)
    assert mismatch.search(err), err


@pytest.mark.both_modes
def test_arguments_argv_path_and_main_block(jaxrun, tmp_path):
    script = tmp_path / "args.py"
    script.write_text(
        "import json, sys\n"
        "if __name__ == '__main__':\n"
        "    print('ARGS ' + json.dumps(sys.argv))\n"
        "    print('PATH0 ' + sys.path[0])\n"
    )
    code, out, err = jaxrun("-n", 1, script, "--lr", "3e-4", "-x", "a b", "$HOME", "--", "{process_id}")
    assert code == 0, err
    assert f'ARGS ["{script}", "--lr", "3e-4", "-x", "a b", "$HOME", "--", "0"]' in out
    assert f"PATH0 {tmp_path}" in out


@pytest.mark.both_modes
def test_module_mode(jaxrun, tmp_path):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(
        "import sys, jaxrun\n"
        "if __name__ == '__main__':\n"
        "    print('MOD', __name__, sys.argv[1:], sys.argv[0].endswith('train.py'))\n"
    )
    code, out, err = jaxrun("-n", 2, "-m", "mypkg.train", "-n", "{num_processes}", cwd=tmp_path)
    assert code == 0, err
    assert "[0] MOD __main__ ['-n', '2'] True" in out
    assert "[1] MOD __main__ ['-n', '2'] True" in out


@pytest.mark.plain_python
def test_a_stack_dump_asked_for_as_the_interpreter_finalizes_is_written_and_does_not_kill_it(jaxrun, tmp_path):
    """A dump asked for at the end (the launcher probing a job whose
    processes are exiting): in an atexit function, as JAX's shutdown barrier
    is, the dump is written; past the atexit functions, where Python would
    give SIGUSR1 back its default, the process lives on and exits 0.  And a
    script that took the wakeup fd for itself (asyncio does) still gets its
    dump, from the main thread."""
    script = tmp_path / "late.py"
    script.write_text(
        "import atexit, os, signal, sys, time\n"
        "class Late:\n"
        "    def __del__(self):  # in the modules' teardown, past every atexit function\n"
        "        os.kill(os.getpid(), signal.SIGUSR1)\n"
        "        os.write(1, b'survived the teardown\\n')\n"
        "late = Late()\n"
        "def in_atexit():\n"
        "    os.kill(os.getpid(), signal.SIGUSR1)\n"
        "    time.sleep(0.5)\n"
        "atexit.register(in_atexit)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "time.sleep(0.5)\n"
        "ours = signal.set_wakeup_fd(-1)  # the script's own use of it\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "time.sleep(0.5)\n"
        "signal.set_wakeup_fd(ours)\n"
        "print('survived', flush=True)\n"
    )
    code, out, err = jaxrun("-n", 2, "--log-dir", tmp_path / "logs", script)
    assert code == 0, err
    assert out.count("survived the teardown") == 2 and out.count("survived\n") == 2, out
    at = re.compile(r'late\.py", line (\d+) in (\S+)')
    for rank in range(2):
        text = (tmp_path / "logs" / f"process-{rank}.stderr").read_text()
        dumped = [at.search(part) for part in text.split("Current thread 0x")[1:]]
        assert [(int(m[1]), m[2]) for m in dumped] in (
            [(line, "<module>"), (again, "<module>"), (8, "in_atexit")] for line in (11, 12) for again in (14, 15)
        ), text


# Modules that a plain `python script.py` does not load, and that only a
# joining process (socket) or the processes' exchanges (json) need: a script
# that never touches jax must not pay for them at start-up.
NOT_AT_START_UP = ("socket", "selectors", "json")


@pytest.mark.plain_python
def test_a_script_without_jax_pays_for_no_module_that_only_joining_needs(jaxrun, tmp_path):
    """Every process of a job pays the child's start-up imports, and each
    Slurm, Open MPI or Ray task pays them with no preloading server to share
    them: what a script that never imports jax finds loaded is what it finds
    under plain python, as far as these modules go."""
    script = tmp_path / "job.py"
    script.write_text("import sys\n"
                      f"print('loaded', sorted(m for m in {NOT_AT_START_UP!r} if m in sys.modules))\n")
    plain = subprocess.run([sys.executable, script], capture_output=True, text=True, check=True)
    assert plain.stdout == "loaded []\n"  # else this python's site loads them, and the test proves nothing
    code, out, err = jaxrun("-n", 2, "--no-preload", script)
    assert code == 0, err
    assert sorted(re.findall(r"^\[\d\] (loaded .*)$", out, re.M)) == ["loaded []"] * 2, out


@pytest.mark.plain_python
def test_nonzero_exit_is_reported_and_easy_to_find(jaxrun, tmp_path):
    script = tmp_path / "three.py"
    script.write_text(
        "import os, sys\n"
        "print('about to fail', file=sys.stderr)\n"
        "sys.exit(3 if os.environ['JAXRUN_PROCESS_ID'] == '1' else 0)\n"
    )
    code, out, err = jaxrun("-n", 2, "--log-dir", tmp_path / "logs", script)
    assert code == 3
    assert "process 1 failed first: exit code 3" in err
    assert "about to fail" in err
    assert "about to fail" in (tmp_path / "logs" / "process-1.stderr").read_text()


def test_coordinator_listens_on_loopback_only(launch, tmp_path, no_leftover_processes):
    go = tmp_path / "go"
    script = tmp_path / "wait.py"
    script.write_text(
        "import os, time, jax, jax.numpy as jnp\n"
        "n = jax.device_count()  # the first device use joins the job: the coordinator is up\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.05)\n"
        "print(jnp.sum(jnp.ones(n)))\n"
    )
    job = launch("-n", 4, "--cpu-devices", 2, script)
    try:
        listening = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(listening) < 1:
            time.sleep(0.5)
            for proc in processes_with_token(no_leftover_processes):
                try:
                    listening += [c.laddr for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN]
                except psutil.NoSuchProcess:
                    pass
        assert listening, "no process of the job was listening"
        assert all(is_loopback(addr.ip) for addr in listening), listening
    finally:
        go.write_text("")
    assert job.wait(timeout=60) == 0, job.stderr


@pytest.mark.both_modes
def test_logs_hold_every_byte_partial_lines_and_non_utf8(jaxrun, tmp_path):
    script = tmp_path / "bytes.py"
    script.write_text(
        "import os\n"
        "os.write(1, b'line one\\n\\xff\\xfe not utf8\\nno newline at end')\n"
        "os.write(2, b'err \\x80\\n partial err')\n"
    )
    code, out, err = jaxrun("-n", 2, "--log-dir", tmp_path / "logs", script)
    assert code == 0, err
    for rank in range(2):
        assert (tmp_path / "logs" / f"process-{rank}.stdout").read_bytes() == \
            b"line one\n\xff\xfe not utf8\nno newline at end"
        assert (tmp_path / "logs" / f"process-{rank}.stderr").read_bytes() == b"err \x80\n partial err"
    assert "[0] no newline at end" in out and "[1]  partial err" in err


def test_grouped_output_uses_the_bash_loop_blocks(jaxrun):
    code, out, err = jaxrun("-n", 4, "--cpu-devices", 2, "--output", "grouped", EXAMPLES / "toy.py")
    assert code == 0, err
    blocks = re.split(r"=================== process (\d) output ===================\n", out)
    assert [blocks[i] for i in (1, 3, 5, 7)] == ["0", "1", "2", "3"]
    for rank in range(4):
        body = blocks[2 + 2 * rank].splitlines()
        # Gloo's noise comes from several threads and can leave stray fragments.
        assert [line for line in body if line.startswith("device ")] == GUIDE_SHARDS[rank]
        assert f"process={rank} {RESULT}" in body


@pytest.mark.both_modes
def test_each_process_is_forked_by_the_preload_server_or_started_by_jaxrun(launch, launch_mode, tmp_path):
    # Both spawners give the same behaviour, so only the process tree shows
    # which one ran.  The server is gone when jaxrun exits: each process
    # records its parent while it runs.
    script = tmp_path / "parent.py"
    script.write_text(
        "import json, psutil\n"
        "parent = psutil.Process().parent()\n"
        "print('PARENT ' + json.dumps([parent.pid, parent.cmdline(), parent.ppid()]))\n"
    )
    job = launch("-n", 2, script)
    assert job.wait(timeout=60) == 0, job.stderr
    found = [json.loads(line.partition("PARENT ")[2]) for line in job.stdout.splitlines() if "PARENT " in line]
    assert len(found) == 2, job.stdout
    if launch_mode == "no-preload":
        assert [pid for pid, _, _ in found] == [job.proc.pid] * 2
    else:
        (pid, cmd, grandparent), other = found
        assert other[0] == pid != job.proc.pid  # one server forked both
        # (The server shows its command line as one string: see forkserver.server.claim_title_area.)
        assert " -m jaxrun.backends.forkserver.server " in " ".join(cmd) + " ", cmd
        assert grandparent == job.proc.pid


@pytest.mark.both_modes
def test_default_log_dir_is_under_tmpdir(jaxrun, tmp_path):
    # conftest points TMPDIR at a folder of each test's own, so runs without
    # --log-dir leave nothing in the machine's shared temporary directory.
    tmpdir = os.environ["TMPDIR"]
    script = tmp_path / "where.py"
    script.write_text("import tempfile\nprint('TMP', tempfile.gettempdir())\n")
    code, out, err = jaxrun("-n", 2, script)
    assert code == 0, err
    assert out.count(f"] TMP {tmpdir}\n") == 2, out
    (logs,) = re.findall(r"jaxrun: logs in (\S+)", err)
    assert Path(logs).parent == Path(tmpdir) / f"jaxrun-logs-{os.geteuid()}"  # private to this user
    assert (Path(logs) / "process-1.stdout").read_text() == f"TMP {tmpdir}\n"
