"""The command line: parsing, -x, --dry-run, --help and --help-all, and bad input (exit 2, nothing started)."""

import os
import re
import socket
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner
from fixtures.jobs import JAXRUN, ROOT

from jaxrun import cli
from jaxrun.core.config import LaunchError
from jaxrun.core.ranks import console_rank_set
from jaxrun.launcher.setup import configure, limits


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
    code, out, err = run_cli("-n", "2", "--cpu-devices", "2", "--dry-run", script, "--lr", "3e-4", "-x", "a b",
                             "{process_id}")
    assert code == 0, err
    assert "process 0:" in out and "process 1:" in out
    assert "JAXRUN_PROCESS_ID=1" in out and "JAXRUN_NUM_PROCESSES=2" in out
    assert "JAX_NUM_CPU_DEVICES=2" in out and "JAX_PLATFORMS=cpu" in out
    # process 0 serves the job on a socket file in the user's private socket folder
    assert re.search(r"JAX_COORDINATOR_BIND_ADDRESS=unix:\S*/jaxrun-sockets-\d+/coordinator-\w+\.sock\b", out), out
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
        (["-x", "=x", "S"], "'=x' is not KEY=VALUE or KEY"),
        (["-x", "A B=1", "S"], "'A B=1' is not KEY=VALUE or KEY"),
        (["-x", "1A", "S"], "'1A' is not KEY=VALUE or KEY"),
        (["-x", "A-B", "S"], "'A-B' is not KEY=VALUE or KEY"),
        (["-x", "", "S"], "'' is not KEY=VALUE or KEY"),
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
    code, out, _ = run_cli("-n", "2", "--devices-per-process", "1", "--dry-run", script,
                           env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert [line.split("=", 1)[1] for line in out.splitlines() if "JAX_LOCAL_DEVICE_IDS=" in line] == ["0", "1"]


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["-n", "2"], {"CUDA_VISIBLE_DEVICES": "0,1,2"},
         "3 devices on localhost cannot be split evenly among 2 processes"),
        (["-n", "4", "--devices-per-process", "2"], {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
         "4 processes x 2 devices need 8 devices, but localhost has 4"),
        (["--cpu-devices", "2", "--devices-per-process", "1"], {}, "cannot be used together"),
    ],
)
def test_bad_device_layouts_are_rejected(script, args, env, message):
    code, _, err = run_cli(*args, script, env=env)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("given, message", [
    ("--probe=bogus", "--probe=bogus: --probe takes report, strict or nothing"),
    ("--flight-recorder=abc", "--flight-recorder=abc: --flight-recorder takes a whole number or nothing"),
])
def test_a_value_given_with_equals_that_an_optional_value_cannot_take_is_refused(script, given, message):
    # Without "=" the next word is the script's when the option cannot take it;
    # with "=" it was meant for the option, and taking it for the script said
    # "script not found: bogus".
    code, out, err = run_cli(given, "--dry-run", script)
    assert (code, out) == (2, "") and message in err and len(err.strip().splitlines()) == 1
    assert run_cli("--probe", "--dry-run", script)[0] == 0


# -- pure checks behind the bad-input errors (#16) ---------------------------

@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "infinity", "1e300", "1000000001"])
def test_seconds_must_be_finite_and_bounded(text):
    # FloatRange lets nan through (every comparison is false) and inf overflows the loop's waits.
    with pytest.raises(click.BadParameter, match="is not a finite number of seconds up to 1000000000"):
        cli.Seconds(min=0).convert(text, None, None)


def test_seconds_keep_the_range_and_ordinary_values():
    assert cli.Seconds(min=0, min_open=True).convert("2.5", None, None) == 2.5
    with pytest.raises(click.BadParameter):
        cli.Seconds(min=0, min_open=True).convert("0", None, None)


def test_huge_console_rank_range_stays_compact_and_is_checked_against_n():
    ranges = cli.RankList().convert("0-100000000000", None, None)  # a set of these would be a MemoryError
    with pytest.raises(LaunchError, match="there is no process 100000000000 among 4"):
        console_rank_set(ranges, 4)


@pytest.mark.parametrize("text, n, ranks", [("0,2-3", 4, {0, 2, 3}), ("none", 1, set()), ("1-1", 2, {1})])
def test_console_ranks_become_the_set_the_printer_asks(text, n, ranks):
    assert console_rank_set(cli.RankList().convert(text, None, None), n) == frozenset(ranks)
    assert console_rank_set(cli.RankList().convert("all", None, None), n) is None


@pytest.mark.parametrize("text", ["²", "0-²", "1" * 19, "3-1", "-1", "a"])
def test_bad_rank_lists_fail_cleanly(text):
    # "²".isdigit() is True but int("²") raises ValueError: a traceback, not a usage error.
    with pytest.raises(click.BadParameter, match="is not a list of ranks"):
        cli.RankList().convert(text, None, None)


@pytest.mark.parametrize("value", ["h:²", "h:" + "9" * 5000, "h:0", "h:65536", "h:", ":80"])
def test_bad_coordinator_fails_cleanly(value):
    with pytest.raises(click.BadParameter, match="is not HOST:PORT"):
        cli.HostPort().convert(value, None, None)


def test_scale_names_the_open_file_limit():
    problem = limits.scale_problem(100_000_000, 2, "local", nofile_hard=20000, pid_max=4194304)
    assert problem == ("-n 100000000: jaxrun needs about 200000027 open files for that many processes "
                       "(2 each, local run), but the open-file limit is 20000 (ulimit -Hn); at most 9986 processes")
    assert "(9 each, scheduler run)" in limits.scale_problem(3000, 9, "scheduler", nofile_hard=20000,
                                                                pid_max=4194304)
    assert limits.scale_problem(9986, 2, "local", nofile_hard=20000, pid_max=4194304) is None
    assert limits.scale_problem(9987, 2, "local", nofile_hard=20000, pid_max=4194304) is not None


def test_scale_names_the_pid_limit_when_files_are_plenty():
    problem = limits.scale_problem(100_000, 2, "local", nofile_hard=1 << 30, pid_max=32768)
    assert problem.startswith("-n 100000: this machine numbers at most 32768 processes and threads (kernel.pid_max)")
    assert problem.endswith("at most 16384 processes")


def test_devices_per_process_is_bounded():
    with pytest.raises(LaunchError, match="--devices-per-process 1000000000: at most 256 devices per process"):
        configure.check_devices_per_process(1_000_000_000, None)
    with pytest.raises(LaunchError, match="--devices-per-process 4: this machine has 2 GPUs"):
        configure.check_devices_per_process(4, 2)
    configure.check_devices_per_process(8, None)
    configure.check_devices_per_process(None, None)


def test_python_must_be_an_executable_file(tmp_path):
    plain = tmp_path / "python"
    plain.write_text("")
    for value, message in [
        ("/nonexistent/python", "--python /nonexistent/python: no such file"),
        ("no-such-python-here", "--python no-such-python-here: not found on PATH"),
        (str(tmp_path), f"--python {tmp_path}: not an executable file"),
        (str(plain), f"--python {plain}: not an executable file"),
    ]:
        with pytest.raises(LaunchError) as e:
            configure.check_python(value)
        assert str(e.value) == message
    configure.check_python(sys.executable)
    configure.check_python("sh")


def test_hosts_file_is_read_to_a_bound(tmp_path):
    with pytest.raises(LaunchError, match="/dev/zero: more than 1 MiB; is it a hosts file"):
        configure.read_hosts_text("/dev/zero")
    bad = tmp_path / "hosts"
    bad.write_bytes(b"\xff\n")
    with pytest.raises(LaunchError, match="cannot read it"):
        configure.read_hosts_text(str(bad))


def test_declared_python_is_one_jaxrun_runs_on():
    # Popen(process_group=...) is new in 3.11 (and jax 0.10 requires 3.11 too;
    # newer jax asks for more, which pip resolves): a ">=3.10" install failed
    # with a TypeError at the first local run.
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    major, minor = re.fullmatch(r">=\s*(\d+)\.(\d+)", declared).groups()
    assert (int(major), int(minor)) >= (3, 11), declared


def test_a_mistyped_option_gets_the_close_match():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "jaxrun", "--cpu-device", "2", "toy.py"], capture_output=True,
                          text=True)
    assert done.returncode == 2
    assert done.stderr == "jaxrun: error: no such option: --cpu-device (did you mean --cpu-devices?)\n"


def test_help_all_comes_in_sections_without_importing_jax():
    program = ("import sys\nfrom jaxrun import cli\ntry:\n    cli.main.main(['--help-all'], prog_name='jaxrun')\n"
               "except SystemExit:\n    pass\nprint('JAX', 'jax' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    titles = [line[:-1] for line in done.stdout.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert titles == ["Commands (jaxrun COMMAND --help)", "Processes", "Output", "Failures", "Restarts",
                      "Across hosts (SSH)", "Engines (Slurm, Open MPI)", "Runtime", "Interactive",
                      "With --launcher ray", "Other"]
    assert done.stdout.rstrip().endswith("JAX False")


# -- --help for a newcomer, --help-all for everything ----------------------------------------

HELP_ENTRY = re.compile(r"^  (-[\w-]+(?:(?:, | / )-[\w-]+)*)", re.M)  # "  -n, --num-processes N   Number..."


def listed_options(text):
    """Every option name a help text starts an entry with."""
    return {name for entry in HELP_ENTRY.findall(text) for name in re.split(r", | / ", entry)}


def declared_options(hidden):
    """Every option name the command declares (its help option too), shown or hidden."""
    ctx = click.Context(cli.main, info_name="jaxrun")
    return {name for param in cli.main.get_params(ctx) if isinstance(param, click.Option) and param.hidden == hidden
            for name in (*param.opts, *param.secondary_opts)}


def help_all_text():
    return CliRunner().invoke(cli.main, ["--help-all"], prog_name="jaxrun").output


@pytest.mark.parametrize("columns", ["100", None], ids=["COLUMNS=100", "click's default width"])
def test_help_fits_one_screen_and_ends_naming_help_all(columns):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
    done = subprocess.run(JAXRUN + ["--help"], capture_output=True, text=True, env=env, timeout=60, check=True)
    lines = done.stdout.rstrip("\n").splitlines()
    assert len(lines) <= 50, done.stdout
    assert "--help-all" in lines[-1] and "--help-all" not in "\n".join(lines[:-1])


def test_help_shows_only_the_short_set_and_help_all_shows_every_option():
    ctx = click.Context(cli.main, info_name="jaxrun")
    short = {name for param in cli.main.get_params(ctx) if cli.helptext.option_name(cli.main, ctx, param) in
             cli.SHORT_HELP for name in (*param.opts, *param.secondary_opts)}
    assert {"-n", "-x", "--max-restarts", "--dry-run", "--help"} <= short
    assert listed_options(cli.main.get_help(ctx)) == short
    every = declared_options(hidden=False)
    assert {"--help-all", "--ssh-config", "--ray-address", "--hosts-command"} <= every  # the registry's too
    assert listed_options(help_all_text()) == every


def test_hidden_options_stay_hidden_in_both_helps():
    hidden = declared_options(hidden=True)
    assert {"--env", "--export", "--kernel-pipe"} <= hidden
    for text in (cli.main.get_help(click.Context(cli.main, info_name="jaxrun")), help_all_text()):
        assert not listed_options(text) & hidden
        assert not re.search(r"--env\b|--export\b|--kernel-pipe", text)


def test_restarts_are_one_section_that_says_how_they_combine():
    text = help_all_text()
    body = text.split("\nRestarts:\n", 1)[1].split("\nAcross hosts (SSH):\n", 1)[0]
    paragraph, options = body.split("\n\n", 1)
    said = cli.helptext.SECTION_TEXTS["Restarts"]
    assert re.sub(r"\s", "", paragraph) == re.sub(r"\s", "", said)  # first, however it wraps
    assert listed_options(options) == {"--max-restarts", "--recoverable", "--no-recoverable", "--min-hosts",
                                       "--hosts-command", "--probe"}
    for words in ("one budget for the whole run", "every restart spends one", "--recoverable forces it",
                  "--no-recoverable refuses it", "--min-hosts or --hosts-command", "elastic",
                  "The same failure twice in a row is never restarted"):
        assert words in said


# -- -x KEY[=VALUE], and the spellings it replaced ------------------------------------------

def test_x_sets_a_value_or_forwards_this_shell_s(script):
    from jaxrun.backends import BACKENDS

    params = cli.main.make_context("jaxrun", ["--dry-run", "-x", "A=1", "-x", "FOO", "-x", "EMPTY=", script]).params
    assert "variables" not in params
    assert (params["env_pairs"], params["exports"]) == ((("A", "1"), ("EMPTY", "")), ("FOO",))
    system = configure.System({"PATH": os.environ["PATH"], "FOO": "from here"})
    config = configure.config_from_args(params, BACKENDS, system)
    assert dict(config.options.extra_env) == {"FOO": "from here", "A": "1", "EMPTY": ""}
    code, out, err = run_cli("-n", "2", "-x", "A=a b", "-x", "FOO", "--dry-run", script, env={"FOO": "here"})
    assert code == 0 and err == ""
    assert out.count("  A='a b'\n") == 2 and out.count("  FOO=here\n") == 2


def test_the_old_spellings_still_work_and_each_says_so_once(script):
    code, out, err = run_cli("--env", "A=1", "--env", "B=2", "--export", "FOO", "--export", "BAR", "-x", "C=3",
                             "--dry-run", script, env={"FOO": "here", "BAR": "there"})
    assert code == 0, err
    assert all(f"  {pair}\n" in out for pair in ("A=1", "B=2", "C=3", "FOO=here", "BAR=there"))
    assert err.splitlines() == ["jaxrun: --env is now -x KEY=VALUE; --env goes away in the next version",
                                "jaxrun: --export is now -x KEY; --export goes away in the next version"]
    params = cli.main.make_context("jaxrun", ["--env", "A=1", "--export", "FOO", "-x", "C=3", "s.py"]).params
    assert (params["env_pairs"], params["exports"]) == ((("A", "1"), ("C", "3")), ("FOO",))


@pytest.mark.parametrize("args, backend", [([], "local"), (["-H", "a:2"], "ssh"), (["--launcher", "slurm"], "slurm"),
                                           (["--launcher", "mpirun"], "mpirun")])
def test_the_command_hands_over_every_value_the_configuration_reads(script, args, backend):
    from jaxrun.backends import BACKENDS

    params = cli.main.make_context("jaxrun", ["--dry-run", *args, script]).params
    config = configure.config_from_args(params, BACKENDS, configure.System({"PATH": os.environ["PATH"]}))
    assert (config.backend, config.dry_run) == (backend, True)
    (launcher,) = [p for p in cli.main.params if p.name == "launcher"]
    assert list(launcher.type.choices) == list(BACKENDS)


def test_recoverable_reaches_a_task_agent_only_when_given(script):
    seen = {}
    for flag in ("--recoverable", "--no-recoverable", None):
        code, out, err = run_cli("-n", "2", "--dry-run", *([flag] if flag else []), script)
        assert code == 0, err
        seen[flag] = re.findall(r"JAXRUN_RECOVERABLE=(\w+)", out)
    assert seen == {"--recoverable": ["on", "on"], "--no-recoverable": ["off", "off"], None: []}
