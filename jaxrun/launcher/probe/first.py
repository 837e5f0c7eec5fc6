"""The probe before a launch, as the run loop asks it: the probe's own run
configuration and hosts, its result read from process 0's log, the verdict
kept in the run's folder, and where the job then starts.

With spares (``--min-hosts``, or ``--hosts-command``), the named hosts are
left out and the job starts on the rest as an elastic restart would place it
(``restarts.elastic.choose``: the order kept, spares in the places of those
left out, never fewer than --min-hosts).  Without spares the probe reports
and the job goes on, unless ``--probe=strict``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence

from jaxrun import contract
from jaxrun.core.backend import Ask
from jaxrun.core.config import PROBE_STRICT, RunConfig
from jaxrun.core.logfiles import PROBE_FOLDER, PROBE_JSON, PROBE_TABLE, write_atomically
from jaxrun.core.outcome import Outcome
from jaxrun.core.spec import LOCAL_HOST, Host, Target
from jaxrun.launcher.probe import table
from jaxrun.launcher.probe.verdict import ProbeVerdict, judge
from jaxrun.launcher.restarts import elastic
from jaxrun.wire import encoding
from jaxrun.wire.probe import ProbeResult, Sizes

SIZES = Sizes()  # what the probe measures with


class ProbeStop(Exception):
    """--probe=strict named a host, or too few good hosts are left: no job."""


def probe_config(config: RunConfig, sizes: Sizes = SIZES) -> RunConfig:
    """The launch's configuration for the probe's job: its own target, one
    process per host where jaxrun places them (spares included), quiet on
    the console (its figures come back as the table), no reports."""
    options = config.options
    hosts = probed_hosts(config)
    changes = {} if hosts is None else {"hosts": hosts, "num_processes": len(hosts)}
    options = dataclasses.replace(options, target=Target(contract.PROBE_MODULE, sizes.args(), is_module=True),
                                  mesh=None, recoverable=False, checks=contract.CHECKS_OFF, **changes)
    return dataclasses.replace(config, options=options, console_ranks=frozenset(), max_restarts=0, report_path=None,
                               junit_path=None, profile=None, log_dir=os.path.join(config.log_dir, PROBE_FOLDER))


def probed_hosts(config: RunConfig) -> tuple[Host, ...] | None:
    """Every listed host, one process each, where jaxrun places the
    processes on hosts; None where it does not (local, a scheduler)."""
    listed = config.options.hosts
    if config.options.scheduled or listed == (LOCAL_HOST,):
        return None
    return tuple(dataclasses.replace(host, slots=1) for host in listed)


def probe_ask(config: RunConfig) -> Ask:
    return Ask(config.options.hosts, config.options.num_processes)


def verdict_of(outcome: Outcome) -> ProbeVerdict | None:
    """The verdict from process 0's result line; None if the job gave none."""
    records = sorted(outcome.records, key=lambda rec: rec.spec.rank)
    if not records:
        return None
    result = None
    log = contract.open_regular(records[0].stdout_log)
    if log is None:
        return None
    try:
        with log:
            for line in log:
                if line.startswith(f"{ProbeResult.WORD} ".encode()):
                    result = encoding.decode(line)
    except (OSError, encoding.WireError):
        return None
    if not isinstance(result, ProbeResult) or len(result.hostnames) != len(records):
        return None
    hosts = [rec.spec.host.name if rec.spec.host.name != LOCAL_HOST.name else name
             for rec, name in zip(records, result.hostnames, strict=True)]
    if len(set(hosts)) < len(hosts):  # several processes a host: each its own row
        hosts = [f"{host}/{rec.spec.rank}" for host, rec in zip(hosts, records, strict=True)]
    return judge(result, hosts)


def keep(log_dir: str, verdict: ProbeVerdict) -> None:
    """The table and its JSON in the run's folder (``jaxrun logs`` shows the table)."""
    write_atomically(os.path.join(log_dir, PROBE_TABLE), ("\n".join(table.table_lines(verdict)) + "\n").encode())
    write_atomically(os.path.join(log_dir, PROBE_JSON), json.dumps(table.as_dict(verdict), indent=1).encode())


def report_part(log_dir: str) -> dict:
    """``{"probe": ...}`` for the JSON run report, where the run had a probe."""
    data = contract.read_small(os.path.join(log_dir, PROBE_JSON), 1 << 22)
    try:
        return {"probe": json.loads(data)} if data else {}
    except ValueError:
        return {}


def placement_after(config: RunConfig, verdict: ProbeVerdict | None, hosts: Sequence[Host]) -> tuple[Ask, dict, str]:
    """The first attempt's ask after the probe, the hosts it leaves out
    with why, and the line that says so.  Raises ProbeStop."""
    if verdict is None and config.probe == PROBE_STRICT:
        raise ProbeStop("--probe=strict: not starting: the probe gave no verdict (its job failed, above)")
    named = verdict.named() if verdict is not None else {}
    ask = Ask(tuple(hosts), config.options.num_processes)
    if not named:
        return ask, {}, ""
    said = "; ".join(f"{host}: {why}" for host, why in named.items())
    spares = bool(config.min_hosts or config.hosts_command) and probed_hosts(config) is not None
    if not spares:
        if config.probe == PROBE_STRICT:
            raise ProbeStop(f"--probe=strict: not starting ({said})")
        return ask, {}, f"jaxrun: probe: going on with every host ({said}); --min-hosts K would leave them out"
    listed = [host for host in config.options.hosts if host.name not in named]
    try:
        choice = elastic.choose(listed, config.options.num_processes, config.min_hosts or 1, named)
    except elastic.ElasticStop as stop:
        raise ProbeStop(f"probe: {stop}") from None
    elastic.check_mesh(config.options, choice.num_processes)
    left_out = {host: f"probe: {why}" for host, why in named.items()}
    line = (f"jaxrun: probe: leaving out {', '.join(named)} ({said}); starting {choice.num_processes} "
            f"process{'' if choice.num_processes == 1 else 'es'} on {', '.join(h.name for h in choice.hosts)}")
    return Ask(choice.hosts, choice.num_processes), left_out, line


def probe_hosts_of(config: RunConfig) -> list[str]:
    """The names the --dry-run plan gives the probe's processes."""
    hosts = probed_hosts(config)
    if hosts is not None:
        return [host.name for host in hosts]
    return [f"process {rank}" for rank in range(config.options.num_processes)]
