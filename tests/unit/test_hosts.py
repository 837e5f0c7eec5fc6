"""Hosts-file and -H parsing: pure, so every case is checked here."""

from __future__ import annotations

import pytest

from jaxrun.core.spec import Host, PlanError
from jaxrun.launcher.setup.hosts import (
    HostsError,
    merge_host_options,
    parse_host_option,
    parse_hosts_file,
    parse_line,
    total_slots,
)
from jaxrun.launcher.setup.plan import assign_hosts


@pytest.mark.parametrize(
    "line, host",
    [
        ("node1", Host("node1")),
        ("node1 slots=4", Host("node1", slots=4)),
        ("alice@node1", Host("node1", user="alice")),
        ("alice@node1:2222 slots=2", Host("node1", slots=2, user="alice", port=2222)),
        ("node-1.example.com:22", Host("node-1.example.com", port=22)),
        ("10.0.0.7 slots=8", Host("10.0.0.7", slots=8)),
        ("[fe80::1]:2200 slots=3", Host("fe80::1", slots=3, port=2200)),
        ("[::1]", Host("::1")),
        ("u@[::1]:22", Host("::1", user="u", port=22)),
        ("  node1   slots=2   # trailing comment", Host("node1", slots=2)),
        ("\tnode1\t", Host("node1")),
        ("my_host", Host("my_host")),
    ],
)
def test_good_lines(line, host):
    assert parse_line(line) == host


@pytest.mark.parametrize("line", ["", "   ", "# only a comment", "   # indented comment"])
def test_blank_and_comment_lines(line):
    assert parse_line(line) is None


@pytest.mark.parametrize(
    "line, reason",
    [
        ("node1 slots=0", "slots must be between 1 and 4096, got 0"),
        ("node1 slots=100000000", "slots must be between 1 and 4096, got 100000000"),
        ("node1 slots=" + "9" * 5000, "slots must be between 1 and 4096"),  # int() refuses 5000 digits
        ("node1 slots=²", "slots must be a whole number, got '²'"),  # isdigit() says yes, int() no
        ("node1:²", "ssh port must be a whole number"),
        ("node1 slots=-1", "slots must be a whole number"),
        ("node1 slots=two", "slots must be a whole number"),
        ("node1 slots=", "slots must be a whole number"),
        ("node1 slots=2 slots=3", "slots= given twice"),
        ("node1 cpus=2", "unknown field 'cpus=2'"),
        ("node1 node2", "unknown field 'node2'"),
        ("node1:0", "ssh port must be between 1 and 65535, got 0"),
        ("node1:70000", "ssh port must be between 1 and 65535"),
        ("node1:ssh", "ssh port must be a whole number"),
        ("node1:", "ssh port must be a whole number"),
        ("-oProxyCommand=x", "bad host name"),
        ("@node1", "bad user name ''"),
        ("-l@node1", "bad user name '-l'"),
        ("node1$", "bad host name 'node1$'"),
        ("nodé", "bad host name"),
        (":22", "missing host name"),
        ("[fe80::1", "unclosed '['"),
        ("[]:22", "bad IPv6 address ''"),
        ("[::1]x", "unexpected 'x' after ']'"),
        ("a;b", "bad host name"),
    ],
)
def test_bad_lines(line, reason):
    with pytest.raises(HostsError, match="^" + _escape(reason)):
        parse_line(line)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_file_in_order_with_comments():
    text = "# cluster\n\nnodeA slots=2\n  # spare\nbob@nodeB:2222 slots=3\nnodeC\n"
    assert parse_hosts_file(text, "hosts.txt") == [
        Host("nodeA", slots=2),
        Host("nodeB", slots=3, user="bob", port=2222),
        Host("nodeC"),
    ]


def test_file_error_names_file_and_line():
    text = "nodeA slots=2\n\n# fine\nnodeB slots=zero\n"
    with pytest.raises(HostsError) as e:
        parse_hosts_file(text, "conf/hosts.txt")
    assert str(e.value) == "conf/hosts.txt:4: slots must be a whole number, got 'zero'"


def test_file_error_names_the_line_with_too_many_slots():
    with pytest.raises(HostsError) as e:
        parse_hosts_file("nodeA\nnodeB slots=100000000\n", "hosts.txt")
    assert str(e.value) == "hosts.txt:2: slots must be between 1 and 4096, got 100000000"


def test_file_duplicate_host():
    with pytest.raises(HostsError, match=r"^h:3: nodeA is already listed on line 1$"):
        parse_hosts_file("nodeA\nnodeB\nbob@nodeA:22\n", "h")


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing\n  \n"])
def test_file_without_hosts(text):
    with pytest.raises(HostsError, match=r"^f: no hosts listed$"):
        parse_hosts_file(text, "f")


def test_crlf_file():
    assert parse_hosts_file("nodeA slots=2\r\nnodeB\r\n", "f") == [Host("nodeA", slots=2), Host("nodeB")]


@pytest.mark.parametrize(
    "value, hosts",
    [
        ("nodeA", [Host("nodeA")]),
        ("nodeA:4", [Host("nodeA", slots=4)]),
        ("nodeA:2,nodeB", [Host("nodeA", slots=2), Host("nodeB")]),
        ("bob@nodeA:2, nodeB:3", [Host("nodeA", slots=2, user="bob"), Host("nodeB", slots=3)]),
        ("[::1]:2", [Host("::1", slots=2)]),
    ],
)
def test_host_option(value, hosts):
    assert parse_host_option(value) == hosts


@pytest.mark.parametrize(
    "value, reason",
    [
        ("nodeA:0", "-H nodeA:0: slots must be between 1 and 4096"),
        ("nodeA:100000000", "-H nodeA:100000000: slots must be between 1 and 4096, got 100000000"),
        ("nodeA:²", "-H nodeA:²: slots must be a whole number"),
        ("nodeA:x", "-H nodeA:x: slots must be a whole number"),
        ("nodeA,,nodeB", "empty host in"),
        ("nodeA,", "empty host in"),
        ("-x", "-H -x: bad host name"),
    ],
)
def test_bad_host_option(value, reason):
    with pytest.raises(HostsError, match="^" + _escape(reason)):
        parse_host_option(value)


def test_repeated_host_options_merge_in_order():
    assert merge_host_options(["a:2", "b,c:3"]) == [Host("a", slots=2), Host("b"), Host("c", slots=3)]


def test_repeated_host_option_duplicate():
    with pytest.raises(HostsError, match="^-H a: host given twice$"):
        merge_host_options(["a:2", "b,a"])


def test_slots_fill_in_host_order():
    hosts = parse_hosts_file("a slots=2\nb slots=2\n", "f")
    assert total_slots(hosts) == 4
    placement = assign_hosts(hosts, 3)
    assert [(h.name, local) for h, local in placement] == [("a", 0), ("a", 1), ("b", 0)]


def test_more_processes_than_slots_names_both_numbers():
    hosts = parse_hosts_file("a slots=2\nb slots=1\n", "f")
    with pytest.raises(PlanError, match="5 processes requested but the hosts have only 3 slots"):
        assign_hosts(hosts, 5)


def test_a_host_may_name_its_own_interpreter():
    (host,) = parse_hosts_file("gpu1 slots=2 python=/opt/conda/envs/jax/bin/python\n", "h")
    assert (host.slots, host.python) == (2, "/opt/conda/envs/jax/bin/python")
    with pytest.raises(HostsError, match=r"^h:1: python=python3: give the interpreter's absolute path$"):
        parse_hosts_file("gpu1 python=python3\n", "h")


@pytest.mark.parametrize("parse, text", [(parse_line, "fe80::1"), (parse_host_option, "fe80::1")])
def test_an_unbracketed_ipv6_address_is_told_to_use_brackets(parse, text):
    with pytest.raises(HostsError, match=r"an IPv6 address goes in brackets: \[fe80::1\] "):
        parse(text)
