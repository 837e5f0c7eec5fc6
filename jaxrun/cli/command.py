"""The ``jaxrun`` command: its options, the ``jaxrun kernel`` group, and the
click option of each backend's own flag.  ``jaxrun.launcher.setup.configure``
turns the parsed values into a ``RunConfig``, and ``jaxrun.launcher.run.run``
does the work with the backend that config names.  The backends' registry
gives ``--launcher`` its choices; no backend module is imported here."""

from __future__ import annotations

import sys
import time

import click

from jaxrun import __version__, contract, meshspec, portable
from jaxrun.backends import BACKENDS, head_start
from jaxrun.cli import helptext
from jaxrun.cli.params import (
    HostPort,
    KeyValue,
    MeshSpecType,
    OptionalCount,
    OptionalWord,
    ProfileWindow,
    RankList,
    Seconds,
    Variable,
    deprecated,
    sort_variables,
)
from jaxrun.core.config import PROBE_REPORT, PROBE_STRICT, Flag, LaunchError, Value, declared_flags
from jaxrun.launcher.setup.configure import config_from_args

CONTEXT = {
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
    "help_option_names": ["-h", "--help"],
}


class JaxrunCommand(click.Command):
    """The one command: its help in helptext's sections, -x's variables
    sorted as the configuration reads them, and its long options for the
    close match a mistyped one gets (since unknown options pass through to
    the script, click never sees one)."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, helptext.USAGE)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        helptext.format_options(self, ctx, formatter)

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        helptext.format_footer(ctx, formatter)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        sort_variables(ctx.params)
        return rest

    def option_names(self) -> list[str]:
        return [name for param in self.params if isinstance(param, click.Option) and not param.hidden
                for name in (*param.opts, *param.secondary_opts) if name.startswith("--")]


@click.command(cls=JaxrunCommand, context_settings=CONTEXT)
@click.option("-n", "--num-processes", type=click.IntRange(min=1), metavar="N",
              help="Number of controllers (default: 1, or every host slot).")
@click.option("--cpu-devices", type=click.IntRange(min=1), metavar="D",
              help="Simulate D CPU devices per process (JAX_PLATFORMS=cpu).")
@click.option("--devices-per-process", type=click.IntRange(min=1), metavar="K",
              help="GPU/TPU hosts: each local process owns K devices (default: split each host's devices evenly).")
@click.option("--coordinator", type=HostPort(),
              help="Coordinator address, open to whoever can reach it (default: a private Unix socket; "
                   "over SSH, a free port on the first host).")
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
@click.option("--checks", type=click.Choice(contract.CHECKS_MODES), default=contract.CHECKS_ON, show_default=True,
              help="The guide's silent mistakes, caught by default: programs that span processes agree at their "
                   "first use, and replicas built from per-process data agree, sampled. strict: check every call; "
                   "off: patch nothing (docs/divergence.md).")
@click.option("--no-account", "no_account", is_flag=True,
              help="Do not account each process's time (its own work, its programs, its waits for the others) "
                   "nor name the straggler the others wait for (docs/time.md).")
@click.option("--check-divergence", is_flag=True,
              help="Debug mode: before each program that spans processes, the processes agree on it; the first "
                   "that differs stops the job and names the call (one key-value round trip per execution).")
@click.option("--profile", type=ProfileWindow(), metavar="START:SECONDS",
              help="Trace every process with jax.profiler for SECONDS, from START seconds after every process "
                   "joined, into one XProf session in the log folder (docs/inspect.md).")
@click.option("--grace", type=Seconds(min=0), default=30.0, show_default=True, metavar="SECONDS",
              help="After forwarding SIGINT/SIGTERM/SIGHUP, wait this long before SIGKILL.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="At most N restarts in the whole run: every restart, of one process alone (a recoverable "
                   "job) or of the whole job, spends one.")
@click.option("--recoverable/--no-recoverable", default=None,
              help="Make the job recoverable (a failed process other than 0 leaves the others running and "
                   "restarts alone), or never (default: when every process enabled jax_enable_recoverability).")
@click.option("--min-hosts", type=click.IntRange(min=1), metavar="K",
              help="Elastic whole-job restarts: leave out lost hosts, take spare hosts (those beyond -n) in "
                   "their places, and go on with fewer processes while at least K hosts remain.")
@click.option("--probe", "probe", cls=OptionalWord, type=click.Choice([PROBE_REPORT, PROBE_STRICT]), is_flag=False,
              flag_value=PROBE_REPORT, default=None, metavar="[strict]",
              help="Probe every host's compute and links first (`jaxrun probe`): with spares (--min-hosts, "
                   "--hosts-command) leave the slow hosts out; without, say so and go on (strict: stop).")
@click.option("--hosts-command", metavar="CMD",
              help="Run CMD (a shell command) before each attempt; what it prints is the hosts file, which "
                   "elastic restarts pick from.")
@click.option("--timestamps", is_flag=True,
              help="Start each console line with the wall-clock time it arrived (the logs stay byte-exact).")
@click.option("--report", "report_path", type=click.Path(dir_okay=False), metavar="FILE.json",
              help="Write a JSON run report.")
@click.option("--junit-xml", "junit_path", type=click.Path(dir_okay=False), metavar="FILE.xml",
              help="Write a JUnit XML report: one testcase per process.")
@click.option("--mesh", type=MeshSpecType(), help="Build a global mesh in every process, e.g. i=4,j=2 or data=-1.")
@click.option("--mesh-axis-types", type=click.Choice(meshspec.AXIS_TYPES), help="Axis type of every mesh axis.")
@click.option("-x", "variables", type=Variable(), multiple=True,
              help="Set KEY=VALUE in every process, or forward this shell's value of KEY (repeatable).")
# The spellings -x replaced; each says so once per run.
@click.option("--env", "env_pairs", type=KeyValue(), multiple=True, hidden=True, callback=deprecated)
@click.option("--export", "exports", multiple=True, hidden=True, callback=deprecated)
@click.option("--preload/--no-preload", "preload", default=None,
              help="Fork local controllers from one process that already imported jax "
                   f"(default on; {contract.NO_PRELOAD}=1 turns it off).")
@click.option("--preload-module", "preload_modules", multiple=True, metavar="MOD",
              help="Also import MOD in the preloading process (repeatable).")
# Hosts are no backend's own option: they choose the backend, and the plan
# places the processes on them.
@click.option("--hosts", "hosts_file", type=click.Path(exists=True, dir_okay=False), metavar="FILE",
              help="Run over SSH on the hosts in FILE: one '[user@]host[:sshport] [slots=N]' per line.")
@click.option("-H", "--host", "host_opts", multiple=True, metavar="HOST[:SLOTS]",
              help="Run over SSH on HOST (repeatable or comma-separated).")
@click.option("--python", "python", metavar="PATH",
              help="Python interpreter for every process, here or on the hosts (default: this one's path).")
@click.option("--launcher", type=click.Choice(list(BACKENDS)), metavar="NAME",
              help=f"How to start the controllers: {', '.join(BACKENDS)} (default: local, or ssh when hosts "
                   "are given).")
@click.option("--dry-run", is_flag=True, help="Print each process's command and environment.")
@click.option("-v", "--verbose", is_flag=True, help="Show JAX's noise lines and the preflight table.")
@click.option("-q", "--quiet", is_flag=True, help="End with only the failure and the log folder.")
@click.option("-i", "--interactive", is_flag=True,
              help="No SCRIPT: a console whose every statement runs in every process, as python -i, or a "
                   "Jupyter kernel (docs/interactive.md).")
@click.option("--kernel-pipe", is_flag=True, hidden=True)  # -i for the Jupyter kernel: JSON lines on stdin/stdout
@click.version_option(__version__, "--version", prog_name="jaxrun")
@click.option("--help-all", is_flag=True, expose_value=False, is_eager=True, callback=helptext.show_every_option,
              help="Show every option, in sections, and exit.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def main(**values):
    """Start N JAX controllers that join one distributed job.

    \b
      jaxrun -n 4 --cpu-devices 2 toy.py          4 local controllers
      jaxrun -n 2 -m mypkg.train --lr 3e-4        a module, like python -m
      jaxrun -n 4 --cpu-devices 2 -i              a console over 4 controllers
      jaxrun --hosts hosts.txt train.py           over SSH, one process per slot

    Everything after SCRIPT (or -m MODULE) is passed to it untouched.  The
    placeholders {process_id}, {num_processes}, {local_process_id} and
    {coordinator} in those arguments are replaced in each process.
    """
    config = config_from_args(values, BACKENDS, option_names=main.option_names())
    # The command line is good: a local run's preloading server starts its
    # import of jax now, while the launcher loads and plans.
    early = head_start(config)
    try:
        from jaxrun.launcher.run import run  # here: --help, and a bad option's error, need none of the launcher

        code = run(config, early=early, began=process_began())
    finally:
        if early is not None:  # unused (bad input found later), or the run's backend ended it already
            early.close()
    sys.exit(code)


def process_began() -> float | None:
    """When this jaxrun started (the run's goodput counts from here), or None where the system cannot say."""
    age = portable.own_age()
    return None if age is None else time.time() - age


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
