"""Elastic restarts' pure choices (launcher/restarts/elastic.py): which hosts the next
attempt checks and uses, the count, the stop below --min-hosts, the lines."""

from __future__ import annotations

import sys

import pytest

from jaxrun.core.config import LaunchError
from jaxrun.core.outcome import Outcome, PlacementRecord, ProcessRecord, StopReason
from jaxrun.core.spec import Host, LaunchOptions, ProcessSpec, Target
from jaxrun.launcher.restarts import elastic
from jaxrun.launcher.setup.discover import discover
from jaxrun.launcher.setup.hosts import used_hosts

A, B, C, D = Host("hostA"), Host("hostB"), Host("hostC"), Host("hostD", slots=2)


def names(hosts) -> list[str]:
    return [h.name for h in hosts]


def test_spares_are_the_hosts_beyond_what_n_needs():
    assert names(used_hosts([A, B, C], 2)) == ["hostA", "hostB"]
    assert names(used_hosts([D, A, B], 2)) == ["hostD"]
    assert names(used_hosts([A, D, B], 3)) == ["hostA", "hostD"]


def test_candidates_keep_the_last_attempts_order_then_the_spares_without_the_lost():
    listed = [A, B, C, D]
    assert names(elastic.candidates(listed, [C, A], {})) == ["hostC", "hostA", "hostB", "hostD"]
    assert names(elastic.candidates(listed, [A, B], {"hostB": "lost"})) == ["hostA", "hostC", "hostD"]


def test_a_host_no_longer_listed_is_not_a_candidate_and_the_listing_gives_the_slots():
    """--hosts-command may drop a host or change its slots."""
    relisted = [Host("hostA", slots=4), C]
    chosen = elastic.candidates(relisted, [A, B], {})
    assert names(chosen) == ["hostA", "hostC"] and chosen[0].slots == 4


def test_a_spare_takes_the_lost_hosts_place_and_the_count_stays():
    choice = elastic.choose([A, C], wanted=2, min_hosts=2, dropped={"hostB": "lost"})
    assert names(choice.hosts) == ["hostA", "hostC"] and choice.num_processes == 2


def test_with_no_spare_the_count_shrinks_to_the_slots_left():
    choice = elastic.choose([A], wanted=2, min_hosts=1, dropped={"hostB": "lost"})
    assert names(choice.hosts) == ["hostA"] and choice.num_processes == 1
    assert elastic.choose([D], wanted=4, min_hosts=1, dropped={}).num_processes == 2


def test_below_min_hosts_is_a_stop_that_names_the_dropped_hosts():
    with pytest.raises(elastic.ElasticStop) as stop:
        elastic.choose([A], wanted=2, min_hosts=2, dropped={"hostB": "connection closed"})
    assert str(stop.value) == ("not restarting: 1 host left (hostA), fewer than --min-hosts 2 "
                               "(hostB lost: connection closed)")
    with pytest.raises(elastic.ElasticStop, match=r"0 hosts left \(none\)"):
        elastic.choose([], wanted=2, min_hosts=1, dropped={"hostA": "x", "hostB": "y"})


def test_the_restart_line_names_the_hosts_the_count_and_the_dropped():
    same = PlacementRecord(("hostA", "hostB"), 2)
    assert elastic.restart_line(1, 2, same, 2) == "jaxrun: restart 1 of 2 on hostA, hostB"
    spare = PlacementRecord(("hostA", "hostC"), 2, (("hostB", 'connection closed after "step 7"'),))
    assert elastic.restart_line(1, 2, spare, 2) == (
        'jaxrun: restart 1 of 2 on hostA, hostC (hostB lost: connection closed after "step 7")')
    fewer = PlacementRecord(("hostA",), 1, (("hostB", "ssh failed: Connection refused"),))
    assert elastic.restart_line(2, 2, fewer, 2) == (
        "jaxrun: restart 2 of 2 on hostA (1 process of 2; hostB lost: ssh failed: Connection refused)")


def _record(tmp_path, rank: int, host: Host, lost: str | None, printed: bytes) -> ProcessRecord:
    out = tmp_path / f"process-{rank}.stdout"
    out.write_bytes(printed)
    spec = ProcessSpec(rank, 0, host, sys.executable, (), {})
    return ProcessRecord(spec, str(out), str(out), "", returncode=255 if lost else -15, lost=lost)


def test_lost_hosts_are_those_whose_processes_ends_never_came_home(tmp_path):
    records = [_record(tmp_path, 0, A, None, b"step 1\nstep 2\n"),
               _record(tmp_path, 1, B, "the connection to hostB", b"step 1\nstep 7\n\n"),
               _record(tmp_path, 2, C, "the ssh client", b""),
               _record(tmp_path, 3, D, "the connection to hostD", b"x" * 100 + b"\n")]
    lost = elastic.lost_hosts(Outcome(records, 1, StopReason.FAILURE))
    assert lost == {"hostB": 'connection closed after "step 7"', "hostC": "the ssh client ended",
                    "hostD": f'connection closed after "{"x" * 57}..."'}


def test_check_reasons_drop_the_hosts_own_name():
    assert elastic.check_reasons({"hostB": "hostB: ssh failed: refused"}) == {"hostB": "ssh failed: refused"}


def test_a_mesh_that_cannot_fit_the_count_left_is_a_stop_naming_it():
    opts = LaunchOptions(Target("t.py"), 4, "", "r", cpu_devices=2, mesh="i=4,j=2")
    elastic.check_mesh(opts, 4)  # the count it was written for
    with pytest.raises(elastic.ElasticStop, match=r"--mesh i=4,j=2 does not fit the 3 processes left"):
        elastic.check_mesh(opts, 3)
    elastic.check_mesh(LaunchOptions(Target("t.py"), 4, "", "r", cpu_devices=2, mesh="data=-1"), 3)


def test_the_hosts_command_output_is_a_hosts_file():
    hosts = discover("printf 'hostA slots=2\\n# spare\\nhostB\\n'")
    assert [(h.name, h.slots) for h in hosts] == [("hostA", 2), ("hostB", 1)]


@pytest.mark.parametrize("command, error", [
    ("echo nope >&2; exit 3", "--hosts-command exited with status 3: nope"),
    ("echo 'hostA slots=x'", "--hosts-command:1: slots must be a whole number"),
    ("true", "--hosts-command: no hosts listed"),
])
def test_a_hosts_command_that_fails_is_one_line(command, error):
    with pytest.raises(LaunchError) as raised:
        discover(command)
    assert str(raised.value).startswith(error)
