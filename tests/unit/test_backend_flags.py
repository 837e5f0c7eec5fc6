"""A backend's own command-line options: declared once in the registry as a
``Flag``, listed by every entry that takes it, turned into one click option
by the command line, shown in the section the registry names, and refused
with a launcher that does not list it."""

from __future__ import annotations

import re
import subprocess
import sys

import click
import pytest

from jaxrun import cli
from jaxrun.backends import BACKENDS
from jaxrun.core.config import BackendEntry, Flag, LaunchError, Value, declared_flags

# Every backend-only option, and the launchers that list it.
BACKEND_ONLY = {
    "ssh_config": ("ssh",), "ssh_options": ("ssh",), "connect_timeout": ("ssh",), "chdir": ("ssh", "ray"),
    "sync": ("ssh",), "no_forward": ("ssh",), "setup": ("ssh",), "nodes": ("slurm", "mpirun"),
    "tasks_per_node": ("slurm", "mpirun"),
    "scheduler_args": ("slurm", "mpirun"), "channel_port": ("slurm", "mpirun"), "ray_address": ("ray",),
    "placement": ("ray",),
}
# The command's options that are everyone's, beyond HELP_SECTIONS' (the "Other" section).
EVERYONES_OTHERS = {"dry_run", "version", "help_all", "args"}


def parsed(*args):
    return cli.main.make_context("jaxrun", [*args, "s.py"]).params


def command_of(flag: Flag) -> click.Command:
    return click.Command("c", params=[cli.backend_option(flag)])


def test_every_backend_only_option_comes_from_a_registry_entry():
    declared = declared_flags(BACKENDS)
    assert {name: d.launchers for name, d in declared.items()} == BACKEND_ONLY
    everyones = {name for names in cli.HELP_SECTIONS.values() for name in names} | EVERYONES_OTHERS
    assert not everyones & set(declared)
    by_name = {}
    for param in cli.main.params:
        assert param.name not in by_name, f"{param.name} added twice"
        by_name[param.name] = param
    assert set(by_name) - everyones == set(declared)
    for name, d in declared.items():
        assert by_name[name].opts == list(d.flag.opts) and by_name[name].help == d.flag.help


def test_a_shared_flag_is_declared_once_and_added_once():
    (tasks,) = {flag for entry in BACKENDS.values() for flag in entry.flags if flag.name == "tasks_per_node"}
    assert [e.name for e in BACKENDS.values() if tasks in e.flags] == ["slurm", "mpirun"]
    assert [p.name for p in cli.main.params].count("tasks_per_node") == 1
    assert parsed("--launcher", "mpirun", "--ntasks-per-node", "2")["tasks_per_node"] == 2


def test_two_different_flags_of_one_name_are_a_registry_bug():
    start = lambda config, console: None
    entries = {n: BackendEntry(n, n, kind=n, fds_per_process=1, start=start, flags=(Flag("x", (f"--{n}",), ""),))
               for n in ("a", "b")}
    with pytest.raises(ValueError, match="two different flags are named x"):
        declared_flags(entries)


def test_the_scheduler_flags_are_refused_elsewhere_naming_both_launchers(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("")
    for option in (["--ntasks-per-node", "2"], ["--scheduler-arg=-x"], ["--nodes", "1"]):
        with pytest.raises(LaunchError) as e:
            cli.main.main([*option, "--dry-run", str(script)], standalone_mode=False)
        assert str(e.value) == "--nodes, --ntasks-per-node and --scheduler-arg need --launcher slurm or mpirun"


# -- each kind of value parses as it did when each option was written by hand ----------------

def test_a_count_takes_whole_numbers_from_its_minimum():
    assert parsed("--nodes", "3")["nodes"] == 3
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(click.BadParameter):
            parsed("--nodes", bad)
    assert command_of(Flag("k", ("--k",), "", value=Value.COUNT, minimum=0)).make_context("c", ["--k", "0"]).params \
        == {"k": 0}


@pytest.mark.parametrize("bad", ["nan", "inf", "0.5", "1e300", "soon"])
def test_seconds_are_finite_and_from_their_minimum(bad):
    with pytest.raises(click.BadParameter):
        parsed("--connect-timeout", bad)


def test_seconds_keep_their_shown_default():
    assert parsed()["connect_timeout"] == 10.0
    assert parsed("--connect-timeout", "2.5")["connect_timeout"] == 2.5
    text = help_text()
    assert "[default: 10.0;" in text and "x>=1]" in text


def test_a_file_must_exist_and_be_a_file(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("")
    assert parsed("--ssh-config", str(config))["ssh_config"] == str(config)
    for bad in (tmp_path / "missing", tmp_path):
        with pytest.raises(click.BadParameter):
            parsed("--ssh-config", str(bad))


def test_a_switch_a_repeatable_text_and_a_choice():
    values = parsed()
    assert (values["sync"], values["ssh_options"], values["chdir"], values["placement"]) == (False, (), None, None)
    values = parsed("--sync", "--ssh-option", "A=1", "--ssh-option", "B=2", "--chdir", "/w", "--placement", "pack")
    assert (values["sync"], values["ssh_options"], values["chdir"], values["placement"]) == (
        True, ("A=1", "B=2"), "/w", "pack")
    with pytest.raises(click.BadParameter):
        parsed("--placement", "everywhere")


def test_given_means_other_than_not_given():
    assert not Flag("t", ("--t",), "", value=Value.SECONDS, default=10.0).given({"t": 10.0})
    assert Flag("t", ("--t",), "", value=Value.SECONDS, default=10.0).given({"t": 3.0})
    assert not Flag("s", ("--s",), "", value=Value.SWITCH).given({"s": False})
    assert not Flag("m", ("--m",), "", multiple=True).given({"m": ()})
    assert Flag("n", ("--n",), "", value=Value.COUNT, minimum=0).given({"n": 0})
    assert not Flag("x", ("--x",), "").given({})


# -- --help-all ----------------------------------------------------------------------------

def help_text():
    program = "from jaxrun import cli\ncli.entry_point(['--help-all'])\n"
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    return done.stdout


def section(text, title):
    """A section's options in order; its paragraph, if any, comes first."""
    body = re.split(r"\n(?=\S)", text.split(f"\n{title}:\n", 1)[1], maxsplit=1)[0]
    options = body.rstrip("\n").split("\n\n")[-1]
    return [line.split()[0].rstrip(",") for line in options.splitlines() if line.startswith("  -")]


def test_help_keeps_each_section_s_options_in_their_order():
    text = help_text()
    assert section(text, "Across hosts (SSH)") == ["--hosts", "-H", "--ssh-config", "--ssh-option",
                                                   "--connect-timeout", "--chdir", "--sync", "--no-forward",
                                                   "--setup"]
    assert section(text, "Engines (Slurm, Open MPI)") == ["--launcher", "--nodes", "--ntasks-per-node",
                                                          "--scheduler-arg", "--channel-port"]
    assert section(text, "With --launcher ray") == ["--ray-address", "--placement"]
    assert section(text, "Restarts") == ["--max-restarts", "--recoverable", "--min-hosts", "--probe", "--hosts-command"]
    assert section(text, "Other") == ["--dry-run", "--version", "--help-all", "-h"]


def test_an_entry_without_a_section_of_its_own_gets_one_before_other():
    assert BACKENDS["ray"].help_section == "With --launcher ray"
    assert BACKENDS["ssh"].help_section == "Across hosts (SSH)"
    sections = cli.help_sections()
    assert sections["Across hosts (SSH)"][2:] == ("ssh_config", "ssh_options", "connect_timeout", "chdir", "sync",
                                                   "no_forward", "setup")
    assert sections["Engines (Slurm, Open MPI)"] == ("launcher", "nodes", "tasks_per_node", "scheduler_args",
                                                    "channel_port")
