"""The ``jaxrun`` command line: the command, its options and their help.
``jaxrun.launcher.setup.configure`` turns the parsed values into a ``RunConfig``,
and ``jaxrun.launcher.run.run`` does the work with the backend that config
names.  The backends' registry gives ``--launcher`` its choices; no backend
module is imported here."""

from __future__ import annotations

import math
import os
import sys

import click

from jaxrun import __version__, contract, meshspec
from jaxrun.backends import BACKENDS
from jaxrun.core.config import Flag, LaunchError, Value, declared_flags
from jaxrun.core.ranks import DIGITS, parse_ranks
from jaxrun.core.spec import PlanError
from jaxrun.launcher.run import run
from jaxrun.launcher.setup.configure import config_from_args

# The longest wait any option may ask for (about 31 years).  Beyond it the
# event loop's waits overflow (threading.TIMEOUT_MAX is about 292 years).
MAX_SECONDS = 1e9


class Seconds(click.FloatRange):
    """A finite number of seconds.  FloatRange takes "nan" and "inf": every
    comparison with nan is false, so a nan deadline never fires and the loop
    spins, and an infinite one overflows the first wait."""

    name = "SECONDS"

    def convert(self, value, param, ctx):
        seconds = super().convert(value, param, ctx)
        if not math.isfinite(seconds) or seconds > MAX_SECONDS:
            self.fail(f"{value!r} is not a finite number of seconds up to {MAX_SECONDS:.0f}", param, ctx)
        return seconds


class OptionalCount(click.Option):
    """An option whose count may be left out: ``--flight-recorder`` or
    ``--flight-recorder 128``.  Click would take the script that follows a
    bare option for its count; this one takes the next word only when it is
    a whole number, and otherwise gives it back to the command line."""

    def add_to_parser(self, parser, ctx) -> None:
        super().add_to_parser(parser, ctx)
        for name in self.opts:
            parsed = getattr(parser, "_long_opt", {}).get(name)
            if parsed is not None:
                parsed.process = self._giving_back(parsed.process)

    def _giving_back(self, process):
        def process_count(value, state):
            if isinstance(value, str) and not DIGITS.match(value):
                state.rargs.insert(0, value)
                value = str(self.flag_value)
            process(value, state)

        return process_count


class RankList(click.ParamType):
    """--console-ranks and ``jaxrun logs --ranks``: see ``core.ranks.parse_ranks``."""

    name = "RANKS"

    def convert(self, value, param, ctx):
        try:
            return parse_ranks(value)
        except ValueError:
            self.fail(f"{value!r} is not a list of ranks like 0 or 0,2-3 (or all, or none)", param, ctx)


class HostPort(click.ParamType):
    name = "HOST:PORT"

    def convert(self, value, param, ctx):
        host, sep, port = str(value).rpartition(":")
        if not sep or not host or not DIGITS.match(port) or not 0 < int(port) < 65536:
            self.fail(f"{value!r} is not HOST:PORT with a port between 1 and 65535", param, ctx)
        return f"{host}:{int(port)}"


class KeyValue(click.ParamType):
    name = "KEY=VALUE"

    def convert(self, value, param, ctx):
        try:
            return contract.parse_env_pair(str(value))
        except ValueError as e:
            self.fail(str(e), param, ctx)


class MeshSpecType(click.ParamType):
    """Checks --mesh syntax at parse time; the device count is checked in the children."""

    name = "SPEC"

    def convert(self, value, param, ctx):
        try:
            spec = meshspec.parse(str(value))
        except meshspec.MeshSpecError as e:
            self.fail(str(e), param, ctx)
        # Children parse the text again; pass it on normalized.
        return str(spec)


CONTEXT = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
}


# --help shows the options in these sections, in this order; an option not
# listed lands in the last one.  (Only the listing: parsing is click's.)  A
# backend's own options name their sections in the registry; a section that
# only they fill comes before "Other".
HELP_SECTIONS = {
    "Processes": ("num_processes", "cpu_devices", "devices_per_process", "coordinator", "env_pairs", "exports",
                  "python", "preload", "preload_modules"),
    "Output": ("log_dir", "output", "console_ranks", "timestamps", "report_path", "junit_path", "verbose"),
    "Failures": ("stall_timeout", "timeout", "grace", "max_restarts", "min_hosts", "recoverable",
                 "flight_recorder", "check_divergence"),
    "Across hosts (SSH)": ("hosts_file", "host_opts", "hosts_command"),
    "Engines (Slurm, Open MPI)": ("launcher",),
    "Runtime": ("mesh", "mesh_axis_types"),
    "Interactive": ("interactive", "kernel_pipe"),
    "Other": (),
}


class SectionedCommand(click.Command):
    """The one command, with --help in sections and close matches suggested
    for a mistyped option (which, since unknown options pass through to the
    script, click never sees)."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections = help_sections()
        rows: dict[str, list] = {title: [] for title in sections}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            title = next((t for t, names in sections.items() if param.name in names), "Other")
            rows[title].append(record)
        for title, records in rows.items():
            if records:
                with formatter.section(title):
                    formatter.write_dl(records)

    def option_names(self) -> list[str]:
        return [name for param in self.params if isinstance(param, click.Option)
                for name in (*param.opts, *param.secondary_opts) if name.startswith("--")]


@click.command(cls=SectionedCommand, context_settings=CONTEXT)
@click.option("-n", "--num-processes", type=click.IntRange(min=1),
              help="Number of controllers (default: 1, or every host slot).")
@click.option("--cpu-devices", type=click.IntRange(min=1), metavar="D",
              help="Simulate D CPU devices per process (JAX_PLATFORMS=cpu).")
@click.option("--devices-per-process", type=click.IntRange(min=1), metavar="K",
              help="GPU/TPU hosts: each local process owns K devices (default: split each host's devices evenly).")
@click.option("--coordinator", type=HostPort(),
              help="Coordinator address (default: a free loopback port; over SSH, a free port on the first host).")
@click.option("--log-dir", type=click.Path(file_okay=False),
              help="Folder for per-process logs (default: $TMPDIR/jaxrun-logs-UID/RUN_ID).")
@click.option("--output", type=click.Choice(["stream", "grouped"]),
              help="Live, rank-prefixed lines, or one block per process at the end "
                   "(default: stream; grouped on GitHub Actions).")
@click.option("--console-ranks", type=RankList(), metavar="RANKS",
              help="Show only these processes' output on the console, e.g. 0 or 0,2-3, or none "
                   "(default: all; the logs always hold everything).")
@click.option("--stall-timeout", type=Seconds(min=0), default=600.0, show_default=True, metavar="SECONDS",
              help="A job in which no process has made progress (CPU, I/O, a new line) for this long, and whose "
                   f"processes wait at different places, has stalled: dump every stack, name the process that "
                   f"stands out, stop it (exit {contract.STALL_EXIT}; restarted with --max-restarts). 0: off.")
@click.option("--timeout", type=Seconds(min=0, min_open=True), metavar="SECONDS",
              help="Dump every stack and stop the job after this long (exit 124).")
@click.option("--flight-recorder", "flight_recorder", cls=OptionalCount,
              type=click.IntRange(1, contract.FLIGHT_RECORDER_MAX), is_flag=False,
              flag_value=contract.FLIGHT_RECORDER_DEFAULT, default=None, metavar="[K]",
              help=f"Each process keeps its last K program executions (default {contract.FLIGHT_RECORDER_DEFAULT}) "
                   "and writes them to its log with every stack dump; the summary lines them up.")
@click.option("--check-divergence", is_flag=True,
              help="Debug mode: before each program that spans processes, the processes agree on it; the first "
                   "that differs stops the job and names the call (one key-value round trip per execution).")
@click.option("--grace", type=Seconds(min=0), default=30.0, show_default=True, metavar="SECONDS",
              help="After forwarding SIGINT/SIGTERM/SIGHUP, wait this long before SIGKILL.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="Restart the whole job this many times after a failure (in a recoverable job: each failed "
                   "process other than 0, alone).")
@click.option("--recoverable/--no-recoverable", default=None,
              help="A fault-tolerant JAX job (every process enabled jax_enable_recoverability, or "
                   "--recoverable): a failed process other than 0 leaves the others running, and "
                   "--max-restarts starts it again alone. --no-recoverable: fail fast whatever the processes say.")
@click.option("--min-hosts", type=click.IntRange(min=1), metavar="K",
              help="Elastic restarts: a restart leaves out lost hosts, fills their places from spare hosts "
                   "(those beyond -n), and goes on with fewer processes while at least K hosts remain.")
@click.option("--timestamps", is_flag=True,
              help="Start each console line with the wall-clock time it arrived (the logs stay byte-exact).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="Write a JSON run report.")
@click.option("--junit-xml", "junit_path", type=click.Path(dir_okay=False), metavar="FILE.xml",
              help="Write a JUnit XML report: one testcase per process.")
@click.option("--mesh", type=MeshSpecType(), help="Build a global mesh in every process, e.g. i=4,j=2 or data=-1.")
@click.option("--mesh-axis-types", type=click.Choice(meshspec.AXIS_TYPES), help="Axis type of every mesh axis.")
@click.option("--env", "env_pairs", type=KeyValue(), multiple=True,
              help="Set KEY=VALUE in every process (repeatable).")
@click.option("--preload/--no-preload", "preload", default=None,
              help="Fork local controllers from one process that already imported jax "
                   f"(default on; {contract.NO_PRELOAD}=1 turns it off).")
@click.option("--preload-module", "preload_modules", multiple=True, metavar="MOD",
              help="Also import MOD in the preloading process (repeatable).")
@click.option("-x", "--export", "exports", multiple=True, metavar="KEY",
              help="Forward this variable's local value to every process (repeatable).")
# Hosts are no backend's own option: they choose the backend, and the plan
# places the processes on them.
@click.option("--hosts", "hosts_file", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Run over SSH on the hosts in FILE: one '[user@]host[:sshport] [slots=N]' per line.")
@click.option("--hosts-command", metavar="CMD",
              help="Run CMD (a shell command) before each attempt; it prints the hosts file to use "
                   "(elastic: restarts pick from it, see --min-hosts).")
@click.option("-H", "--host", "host_opts", multiple=True, metavar="HOST[:SLOTS]",
              help="Run over SSH on HOST (repeatable or comma-separated).")
@click.option("--python", "python", metavar="PATH",
              help="Python interpreter for every process, here or on the hosts (default: this one's path).")
@click.option("--launcher", type=click.Choice(list(BACKENDS)),
              help="How to start the controllers (default: local, or ssh when hosts are given).")
@click.option("--dry-run", is_flag=True, help="Print each process's command and environment, then exit.")
@click.option("-v", "--verbose", is_flag=True, help="Show JAX's noise lines and the startup preflight table.")
@click.option("-i", "--interactive", is_flag=True,
              help="No SCRIPT: a console whose every statement runs in every process, as python -i "
                   "(see docs/interactive.md; `jaxrun kernel install` makes the launch a Jupyter kernel).")
@click.option("--kernel-pipe", is_flag=True, hidden=True)  # -i for the Jupyter kernel: JSON lines on stdin/stdout
@click.version_option(__version__, "--version", prog_name="jaxrun")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(**values):
    """Start N JAX controllers that join one distributed job.

    \b
      jaxrun -n 4 --cpu-devices 2 toy.py          4 local controllers
      jaxrun -n 2 -m mypkg.train --lr 3e-4        a module, like python -m
      jaxrun -n 4 --cpu-devices 2 -i              a console over 4 controllers
      jaxrun --hosts hosts.txt train.py           over SSH, one process per slot
      jaxrun k8s --image IMG -n 4 train.py        print a Kubernetes JobSet manifest instead

    Everything after SCRIPT (or -m MODULE) is passed to it untouched.  The
    placeholders {process_id}, {num_processes}, {local_process_id} and
    {coordinator} in those arguments are replaced in each process.
    """
    sys.exit(run(config_from_args(values, BACKENDS, option_names=main.option_names())))


def help_sections() -> dict[str, tuple[str, ...]]:
    """HELP_SECTIONS with each backend flag in the section the registry names;
    a section of backends' flags alone goes before "Other"."""
    sections = {title: list(names) for title, names in HELP_SECTIONS.items() if title != "Other"}
    for name, declared in declared_flags(BACKENDS).items():
        sections.setdefault(declared.section, []).append(name)
    sections["Other"] = list(HELP_SECTIONS["Other"])
    return {title: tuple(names) for title, names in sections.items()}


def backend_option(flag: Flag) -> click.Option:
    """The click option of a backend's flag, which has no click of its own."""
    if flag.value is Value.SWITCH:
        return click.Option([*flag.opts, flag.name], is_flag=True, help=flag.help)
    kinds = {
        Value.TEXT: click.Choice(flag.choices) if flag.choices else None,
        Value.COUNT: click.IntRange(min=flag.minimum),
        Value.SECONDS: Seconds(min=flag.minimum),
        Value.FILE: click.Path(exists=True, dir_okay=False),
    }
    return click.Option([*flag.opts, flag.name], type=kinds[flag.value], multiple=flag.multiple,
                        default=flag.default, show_default=flag.default is not None, metavar=flag.metavar,
                        help=flag.help)


# The backends' flags (each once, however many entries list it), before SCRIPT.
main.params[-1:-1] = [backend_option(d.flag) for d in declared_flags(BACKENDS).values()]


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.pass_context
def kernel(ctx):
    """Jupyter kernels that run every cell in every process of a jaxrun launch."""
    from jaxrun.launcher.interactive import kernelspec

    kernelspec.require_ipykernel()  # one line on how to get it, before anything else
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@kernel.command("install", context_settings={"ignore_unknown_options": True})
@click.option("--name", required=True, help="The kernel's name (what `jupyter console --kernel NAME` takes).")
@click.option("--display-name", metavar="TEXT", help="What a notebook's kernel menu shows.")
@click.option("--user", "user", is_flag=True, help="Install for this user (the default).")
@click.option("--prefix", type=click.Path(file_okay=False), metavar="DIR",
              help="Install under DIR/share/jupyter/kernels (a venv's: its sys.prefix).")
@click.argument("launch", nargs=-1, type=click.UNPROCESSED)
def kernel_install(name, display_name, user, prefix, launch):
    """Write a kernelspec whose kernel starts the processes of LAUNCH OPTIONS.

    \b
      jaxrun kernel install --name jax4 -- -n 4 --cpu-devices 2
    """
    from jaxrun.launcher.interactive import kernelspec

    if user and prefix:
        raise LaunchError("--user and --prefix cannot be used together")
    launch = list(launch)
    if "-i" in launch or "--interactive" in launch:
        raise LaunchError("the launch options take no -i: the kernel adds it")
    try:  # bad options fail now, not in a notebook
        ctx = main.make_context("jaxrun", [*launch, "-i", "--dry-run"])
    except click.ClickException as e:
        raise LaunchError(f"launch options: {e.format_message()}") from None
    config_from_args(ctx.params, BACKENDS, option_names=main.option_names())
    folder = kernelspec.install(name, launch, display_name, prefix)
    print(f"jaxrun: installed the kernelspec {name} in {folder}")


def entry_point(argv: list[str] | None = None) -> None:
    """Console-script entry: click's errors become one line and exit 2."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command, prog = main, "jaxrun"
    if argv[:1] == ["k8s"]:  # a subcommand without making `jaxrun SCRIPT` a click group
        from jaxrun import k8s

        command, prog, argv = k8s.command, "jaxrun k8s", argv[1:]
    elif argv[:1] == ["logs"] and not os.path.isfile("logs"):  # a script named "logs" still runs
        from jaxrun.launcher.output import logs

        command, prog, argv = logs.command, "jaxrun logs", argv[1:]
    elif argv[:1] == ["kernel"] and not os.path.isfile("kernel"):
        command, prog, argv = kernel, "jaxrun kernel", argv[1:]
    try:
        command.main(args=argv, prog_name=prog, standalone_mode=False)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.ClickException as e:
        print(f"jaxrun: error: {e.format_message()}", file=sys.stderr)
        sys.exit(2)
    except (LaunchError, PlanError) as e:
        print(f"jaxrun: error: {e}", file=sys.stderr)
        sys.exit(2)
    except click.Abort:
        sys.exit(130)
