"""Where the scheduler step's task channel listens: the address the tasks
will reach, never a loopback one that only this node can (the 127.0.1.1
many Debian hosts map their own name to), unless there is nothing else."""

from __future__ import annotations

from jaxrun import contract
from jaxrun.backends.scheduler.channel import channel_address, route_source


def test_a_name_that_resolves_to_loopback_gives_the_address_traffic_leaves_from():
    assert channel_address({}, "127.0.1.1", routed=lambda: "10.1.2.3") == "10.1.2.3"
    assert channel_address({}, "localhost", routed=lambda: "10.1.2.3") == "10.1.2.3"


def test_loopback_only_where_this_host_has_nothing_else():
    assert channel_address({}, "127.0.1.1", routed=lambda: None) == "127.0.1.1"
    assert channel_address({}, "127.0.1.1", routed=lambda: "127.0.0.1") == "127.0.1.1"
    assert channel_address({}, "no-such-host.invalid", routed=lambda: None) == "127.0.0.1"


def test_a_routable_name_and_the_users_choice_are_kept():
    assert channel_address({}, "10.9.8.7", routed=lambda: "10.1.2.3") == "10.9.8.7"
    # JAXRUN_TASK_CHANNEL_HOST is the user's word, loopback included (a one-node job).
    assert channel_address({contract.TASK_CHANNEL_HOST: "127.0.0.7"}, routed=lambda: "10.1.2.3") == "127.0.0.7"


def test_the_route_source_sends_nothing_and_is_an_address_or_none():
    source = route_source()
    assert source is None or channel_address({}, source, routed=lambda: None) == source
