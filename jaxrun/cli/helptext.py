"""What ``jaxrun --help`` and ``jaxrun --help-all`` print.

--help is for a newcomer: the options most jobs need, on one screen, and a
last line that points at --help-all.  --help-all lists every option, in
sections.  Both come from the one set of declarations: HELP_SECTIONS places
each option, SHORT_HELP names those --help shows.  (Only the listing:
parsing is click's.)"""

from __future__ import annotations

import click

from jaxrun.backends import BACKENDS
from jaxrun.core.config import declared_flags

# --help-all shows the options in these sections, in this order; an option not
# listed lands in the last one.  A backend's own options name their sections in
# the registry; a section that only they fill comes before "Other".
HELP_SECTIONS = {
    "Processes": ("num_processes", "cpu_devices", "devices_per_process", "coordinator", "variables", "env_pairs",
                  "exports", "python", "preload", "preload_modules"),
    "Output": ("log_dir", "output", "console_ranks", "timestamps", "report_path", "junit_path", "verbose",
               "quiet", "profile"),
    "Failures": ("stall_timeout", "timeout", "grace", "checks", "flight_recorder", "check_divergence",
                 "no_account"),
    "Restarts": ("max_restarts", "recoverable", "min_hosts", "probe", "hosts_command"),
    "Across hosts (SSH)": ("hosts_file", "host_opts"),
    "Engines (Slurm, Open MPI)": ("launcher",),
    "Runtime": ("mesh", "mesh_axis_types"),
    "Interactive": ("interactive", "kernel_pipe"),
    "Other": (),
}

# A paragraph under a section's heading in --help-all, where its options
# only make sense together.
SECTION_TEXTS = {
    "Restarts": (
        "--max-restarts N is one budget for the whole run, and every restart spends one of it. In a "
        "recoverable job (by default when every process enabled jax_enable_recoverability; --recoverable "
        "forces it, --no-recoverable refuses it) a failed process other than 0 starts again alone, on the "
        "local and SSH launchers. Any other failure places and starts the whole job again; with --min-hosts "
        "or --hosts-command that restart is elastic: it may leave out lost hosts and take spares. The same "
        "failure twice in a row is never restarted."
    ),
}

# The options --help shows (by parameter name, as option_name gives it), in
# their sections' order; --help-all shows every one.
SHORT_HELP = frozenset({
    "num_processes", "cpu_devices", "devices_per_process", "variables", "log_dir", "verbose", "quiet", "timeout",
    "max_restarts", "hosts_file", "host_opts", "launcher", "interactive", "dry_run", "version", "help",
})

# The subcommands (`jaxrun NAME ...`, dispatched in jaxrun/cli/__init__.py):
# --help names them, --help-all says what each is for.
COMMANDS = {
    "logs": "show a finished run's logs, or list recent runs",
    "top": "a live table of a running job's processes (--once: one look)",
    "stacks": "print every process's Python stacks now; the job goes on",
    "profile": "trace a running job with jax.profiler, into one XProf session",
    "probe": "measure every host's compute and links, and name the slow ones",
    "k8s": "print a Kubernetes JobSet manifest that runs SCRIPT in N pods",
    "kernel": "install a Jupyter kernel that runs every cell in every process",
}
USAGE = "[OPTIONS] SCRIPT [ARGS]..."

# ctx.meta's key for "list every option": set by --help-all.
EVERY_OPTION = "jaxrun.help_all"


def help_sections() -> dict[str, tuple[str, ...]]:
    """HELP_SECTIONS with each backend flag in the section the registry names;
    a section of backends' flags alone goes before "Other"."""
    sections = {title: list(names) for title, names in HELP_SECTIONS.items() if title != "Other"}
    for name, declared in declared_flags(BACKENDS).items():
        sections.setdefault(declared.section, []).append(name)
    sections["Other"] = list(HELP_SECTIONS["Other"])
    return {title: tuple(names) for title, names in sections.items()}


def show_every_option(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """--help-all: the full help, then exit, as --help does."""
    if not value or ctx.resilient_parsing:
        return
    ctx.meta[EVERY_OPTION] = True
    click.echo(ctx.get_help(), color=ctx.color)
    ctx.exit()


def option_name(command: click.Command, ctx: click.Context, param: click.Parameter) -> str:
    """The name SHORT_HELP and HELP_SECTIONS know a parameter by: its own, or
    "help" for click's help option (whose own name changed in click 8.5, to
    `_click_default_help`; click caches that option, so it is one object)."""
    return "help" if param is command.get_help_option(ctx) else param.name


def format_options(command: click.Command, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """Every option in its section (--help-all), or only SHORT_HELP's in one
    list, in the same order (--help).  Hidden options have no record."""
    sections = help_sections()
    rows: dict[str, list] = {title: [] for title in sections}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            name = option_name(command, ctx, param)
            title = next((t for t, names in sections.items() if name in names), "Other")
            rows[title].append((name, record))
    if not ctx.meta.get(EVERY_OPTION):
        with formatter.section(f"Commands ({ctx.command_path} COMMAND --help)"):
            formatter.write_text(", ".join(COMMANDS))
        with formatter.section("Options"):
            formatter.write_dl([record for records in rows.values() for name, record in records
                                if name in SHORT_HELP])
        return
    with formatter.section(f"Commands ({ctx.command_path} COMMAND --help)"):
        formatter.write_dl(list(COMMANDS.items()))
    for title, records in rows.items():
        if records:
            with formatter.section(title):
                if title in SECTION_TEXTS:
                    formatter.write_text(SECTION_TEXTS[title])
                    formatter.write_paragraph()
                formatter.write_dl([record for _, record in records])


def format_footer(ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """--help's last line: where the other options are."""
    if not ctx.meta.get(EVERY_OPTION):
        formatter.write_paragraph()
        formatter.write_text(f"Every option, in sections: {ctx.command_path} --help-all")
