"""``jaxrun probe``: the launch's own host and backend options (``--hosts``,
``-H``, ``--launcher``, ``-n``, ``--cpu-devices``, ...), taken from the
``jaxrun`` command itself, and ``--json``; one short job that measures every
host's compute and links (docs/probe.md).  Exit status 0 when every host is
fine, 1 when one (or a link) is named."""

from __future__ import annotations

import sys

import click

from jaxrun import contract
from jaxrun.backends import BACKENDS
from jaxrun.cli.command import main
from jaxrun.core.config import PROBE_JSON, PROBE_TABLE
from jaxrun.launcher.setup.configure import config_from_args
from jaxrun.wire.probe import Sizes

# What a probe has no use for: its job is its own, runs once, and reports itself.
NOT_TAKEN = {"args", "interactive", "kernel_pipe", "probe", "max_restarts", "recoverable", "min_hosts", "profile",
             "junit_path", "mesh", "mesh_axis_types", "flight_recorder", "check_divergence", "console_ranks",
             "output", "help_all"}


def probe(**values) -> None:
    """Measure every host's compute and its links to the others with one
    short JAX job, and name the slow ones.

    \b
      jaxrun probe --hosts hosts.txt             one process a host: a table, exit 1 if one is slow
      jaxrun probe -n 4 --cpu-devices 1 --json   four local processes; the verdict as JSON
    """
    defaults = main.make_context("jaxrun", ["SCRIPT"]).params  # what `jaxrun SCRIPT` gives those not taken here
    values = {**{name: value for name, value in defaults.items() if name in NOT_TAKEN}, **values}
    values["probe"] = PROBE_JSON if values.pop("json") else PROBE_TABLE
    values["args"] = ("-m", contract.PROBE_MODULE, *Sizes().args())  # the run's backend starts the probe's job
    config = config_from_args(values, BACKENDS, option_names=command.option_names())
    from jaxrun.launcher.run import run  # as `jaxrun`: --help needs none of the launcher

    sys.exit(run(config))


class ProbeCommand(click.Command):
    def option_names(self) -> list[str]:
        return [name for param in self.params if isinstance(param, click.Option)
                for name in param.opts if name.startswith("--")]


command = ProbeCommand(
    "probe", callback=probe, help=probe.__doc__, context_settings={"help_option_names": ["-h", "--help"]},
    params=[param for param in main.params if param.name not in NOT_TAKEN and param.name != "version"]
    + [click.Option(["--json"], is_flag=True, help="Print the verdict as JSON (the table's figures, the rule).")])
