"""Elastic restarts (``--min-hosts K``): where the next attempt runs.

Before each restart every host is checked again (``Backend.place``, given
``restart_ask``'s ask).  What to do with the answers is decided here, and
nothing here touches the system but ``discover``, which runs
``--hosts-command``, and the backend's ``pool``:

- a host that was lost in the failed attempt (its connection or agent ended
  before its processes' ends came home) is left out, and so is one that
  fails its check now;
- the hosts that are left keep their order, the last attempt's first, so
  that process 0 (and the coordinator) stays where it was while it can;
- the hosts beyond what ``-n`` needs are spares: they take the places of
  the hosts left out, so the process count stays the same;
- with no spare left the job goes on with the slots that remain, as long as
  at least K hosts do; below K the run stops, naming the hosts and why.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from jaxrun import meshspec
from jaxrun.core.backend import Ask, Backend
from jaxrun.core.config import RunConfig
from jaxrun.core.outcome import Outcome, PlacementRecord
from jaxrun.core.spec import Host, LaunchOptions
from jaxrun.launcher.setup import hosts as hostfile
from jaxrun.launcher.setup.discover import discover
from jaxrun.reporting import diagnosis

LAST_WORDS = 60  # characters of a lost host's last output line the reason quotes


class ElasticStop(Exception):
    """Too few hosts are left for the next attempt: the run ends here."""


@dataclasses.dataclass(frozen=True)
class Choice:
    hosts: tuple[Host, ...]  # where the next attempt runs, in rank order
    num_processes: int


def restart_ask(config: RunConfig, backend: Backend, failed: Outcome,
                last: tuple) -> tuple[Ask, dict[str, str]]:
    """An elastic restart's ask, and the hosts lost in the failed attempt
    with why: the backend checks every candidate again, and ``choose`` keeps
    the run's rules (spares fill lost places, never fewer than --min-hosts,
    a fixed --mesh must fit)."""
    listed = discover(config.hosts_command) if config.hosts_command else backend.pool()
    names = {host.name for host in listed}
    lost = {name: why for name, why in lost_hosts(failed).items() if name in names}

    def choose_hosts(good, problems):
        dropped = {**lost, **check_reasons(problems)}
        choice = choose(good, config.options.num_processes, config.min_hosts, dropped)
        check_mesh(config.options, choice.num_processes)
        return choice.hosts, choice.num_processes

    return Ask(tuple(candidates(listed, last, lost)), config.options.num_processes, recheck=True,
               choose=choose_hosts), lost


def candidates(listed: Sequence[Host], last: Sequence[Host], left_out: Mapping[str, str]) -> list[Host]:
    """The hosts to check for the next attempt: the last attempt's, then the
    other listed ones (the spares), each once, without those ``left_out``.
    A host of the last attempt that is no longer listed (``--hosts-command``
    stopped printing it) is left out too; each keeps the listing's slots."""
    by_name = {h.name: h for h in listed}
    names = dict.fromkeys([h.name for h in last if h.name in by_name] + list(by_name))  # ordered, once each
    return [by_name[name] for name in names if name not in left_out]


def choose(good: Sequence[Host], wanted: int, min_hosts: int, dropped: Mapping[str, str]) -> Choice:
    """Where the next attempt runs, from the hosts that passed their check
    (in ``candidates`` order); ``wanted`` is -n.  Raises ElasticStop below
    ``min_hosts``, naming what was dropped."""
    hosts = hostfile.used_hosts(good, wanted)
    if len(hosts) < min_hosts:
        left = ", ".join(h.name for h in hosts) or "none"
        count = f"{len(hosts)} host{'' if len(hosts) == 1 else 's'}"
        raise ElasticStop(f"not restarting: {count} left ({left}), fewer than --min-hosts {min_hosts}"
                          + (f" ({dropped_text(dropped)})" if dropped else ""))
    return Choice(tuple(hosts), min(wanted, hostfile.total_slots(hosts)))


def dropped_text(dropped: Mapping[str, str]) -> str:
    return "; ".join(f"{name} lost: {why}" for name, why in dropped.items())


def restart_line(restart: int, max_restarts: int, placement: PlacementRecord, wanted: int) -> str:
    """``jaxrun: restart 1 of 2 on hostA, hostC (hostB lost: ...)``; the
    process count is said when it is not -n's."""
    notes = []
    if placement.num_processes != wanted:
        notes.append(f"{placement.num_processes} process{'' if placement.num_processes == 1 else 'es'} of {wanted}")
    if placement.dropped:
        notes.append(dropped_text(dict(placement.dropped)))
    line = f"jaxrun: restart {restart} of {max_restarts} on {', '.join(placement.hosts)}"
    return line + (f" ({'; '.join(notes)})" if notes else "")


def check_mesh(options: LaunchOptions, num_processes: int) -> None:
    """A --mesh without an inferred axis may not fit fewer processes: say so
    now, naming the count, instead of in every process.  Only where each
    process's device count is known here (--cpu-devices, --devices-per-process)."""
    per_process = options.cpu_devices or options.devices_per_process
    if not options.mesh or not per_process or num_processes == options.num_processes:
        return
    try:
        meshspec.resolve(meshspec.parse(options.mesh), num_processes * per_process)
    except meshspec.MeshSpecError as e:
        raise ElasticStop(f"not restarting: --mesh {options.mesh} does not fit the {num_processes} "
                          f"process{'' if num_processes == 1 else 'es'} left ({e})") from None


def lost_hosts(outcome: Outcome) -> dict[str, str]:
    """{host: why} for each host whose processes' ends never came home in
    this attempt (its connection, or its agent, ended first)."""
    lost: dict[str, str] = {}
    for rec in outcome.records:
        if rec.lost and rec.spec.host.name not in lost:
            lost[rec.spec.host.name] = f"{_helper_end(rec.lost)}{_last_words(rec.stdout_log)}"
    return lost


def _helper_end(helper: str) -> str:
    if helper.startswith("the connection"):
        return "connection closed"
    return f"{helper} ended"


def _last_words(path: str) -> str:
    """``, after "step 6"``: the last line the process printed, if any."""
    lines = [line.strip() for line in diagnosis.tail(path) if line.strip()]
    if not lines:
        return ""
    last = lines[-1] if len(lines[-1]) <= LAST_WORDS else lines[-1][: LAST_WORDS - 3] + "..."
    return f' after "{last}"'


def check_reasons(problems: Mapping[str, str]) -> dict[str, str]:
    """The check's "hostB: ssh failed: ..." as "ssh failed: ..."."""
    return {name: why.removeprefix(f"{name}: ") for name, why in problems.items()}
