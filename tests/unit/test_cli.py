"""The command line: parsing, --dry-run, --help cost, and bad input (exit 2, nothing started)."""

import os
import socket
import subprocess
import sys

import pytest
from fixtures.jobs import JAXRUN


def run_cli(*args, env=None, cwd=None):
    full = dict(os.environ)
    full.update(env or {})
    proc = subprocess.run(JAXRUN + list(args), capture_output=True, text=True, env=full, cwd=cwd, timeout=60)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "s.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_help_is_instant_and_imports_no_jax():
    code, out, err = run_cli("--help", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert code == 0
    assert "--num-processes" in out and "--cpu-devices" in out
    imported = [line.rsplit("|", 1)[-1].strip() for line in err.splitlines() if line.startswith("import time:")]
    assert "click" in imported  # the profile really was recorded
    assert not [m for m in imported if m == "jax" or m.startswith(("jax.", "jaxlib"))]


def test_dry_run_prints_commands_and_contract_env(script):
    code, out, err = run_cli("-n", "2", "--cpu-devices", "2", "--dry-run", script, "--lr", "3e-4", "-x", "a b", "{process_id}")
    assert code == 0, err
    assert "process 0:" in out and "process 1:" in out
    assert "JAXRUN_PROCESS_ID=1" in out and "JAXRUN_NUM_PROCESSES=2" in out
    assert "JAX_NUM_CPU_DEVICES=2" in out and "JAX_PLATFORMS=cpu" in out
    assert "JAX_COORDINATOR_BIND_ADDRESS=127.0.0.1:" in out
    assert f"-m jaxrun.shim -- {script} --lr 3e-4 -x 'a b' 1" in out


def test_dry_run_module():
    code, out, _ = run_cli("-n", "1", "--dry-run", "-m", "pkg.mod", "-n", "7")
    assert code == 0
    assert "-m jaxrun.shim -m pkg.mod -n 7" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["missing_script.py"], "script not found: missing_script.py"),
        (["-n", "0", "S"], "-n"),
        (["-n", "-2", "S"], "-n"),
        (["-n", "two", "S"], "is not a valid integer"),
        (["--cpu-devices", "0", "S"], "--cpu-devices"),
        (["--timeout", "-1", "S"], "--timeout"),
        (["--bogus-option", "S"], "no such option: --bogus-option"),
        (["--coordinator", "nohost", "S"], "is not HOST:PORT"),
        (["--env", "NOEQUALS", "S"], "is not KEY=VALUE"),
        ([], "missing SCRIPT"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, script, tmp_path):
    args = [script if a == "S" else a for a in args]
    log_dir = tmp_path / "logs"
    code, out, err = run_cli("--log-dir", str(log_dir), *args)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("jaxrun: error: ")
    assert not log_dir.exists()


def test_taken_coordinator_port_is_rejected_before_start(script, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        log_dir = tmp_path / "logs"
        code, _, err = run_cli("--log-dir", str(log_dir), "--coordinator", f"127.0.0.1:{port}", script)
    assert code == 2
    assert f"127.0.0.1:{port}" in err and len(err.strip().splitlines()) == 1
    assert not log_dir.exists()


def test_python_dash_m_jaxrun_works():
    proc = subprocess.run([sys.executable, "-m", "jaxrun", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and "jaxrun" in proc.stdout


def test_dry_run_shows_device_ids_per_process(script):
    code, out, err = run_cli("-n", "4", "--dry-run", script, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"})
    assert code == 0, err
    ids = [line.split("=", 1)[1] for line in out.splitlines() if "JAX_LOCAL_DEVICE_IDS=" in line]
    assert ids == ["0,1", "2,3", "4,5", "6,7"]
    code, out, _ = run_cli("-n", "2", "--devices-per-process", "1", "--dry-run", script, env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert [line.split("=", 1)[1] for line in out.splitlines() if "JAX_LOCAL_DEVICE_IDS=" in line] == ["0", "1"]


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["-n", "2"], {"CUDA_VISIBLE_DEVICES": "0,1,2"}, "3 devices on localhost cannot be split evenly among 2 processes"),
        (["-n", "4", "--devices-per-process", "2"], {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "4 processes x 2 devices need 8 devices, but localhost has 4"),
        (["--cpu-devices", "2", "--devices-per-process", "1"], {}, "cannot be used together"),
    ],
)
def test_bad_device_layouts_are_rejected(script, args, env, message):
    code, _, err = run_cli(*args, script, env=env)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
