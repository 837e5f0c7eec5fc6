"""Pure parsing of where processes run: a hosts file, or ``-H`` entries.

A hosts file has one host per line::

    # comments and blank lines are fine
    [user@]host[:sshport] [slots=N] [python=PATH]

``-H``/``--host`` takes ``[user@]host[:slots]``, repeatable or comma-separated
(the colon means slots there, as in ``mpirun -H``; an ssh port goes in
``--ssh-option Port=N`` or a hosts file).  An IPv6 address is written in
brackets, ``[fe80::1]:2222``; one without them is refused with a hint.
``python=PATH`` gives a host its own interpreter (an absolute path).

Nothing here reads a file or touches the network: the CLI reads the file and
hands its text in.  Names are checked strictly because each one becomes a word
on an ``ssh`` command line, and a name starting with ``-`` would be an option.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from jaxrun.core.spec import Host


class HostsError(ValueError):
    """A host entry is malformed; the message names where and why."""


_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_IPV6 = re.compile(r"[0-9A-Fa-f:.%A-Za-z]+\Z")
_PYTHON = re.compile(r"/[^\s]*\Z")  # an absolute path: it is one word of the remote command, quoted
# ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
_DIGITS = re.compile(r"[0-9]+\Z")
# The most processes one host may be given: jaxrun holds a few file
# descriptors and a thread for each, and no machine runs more controllers.
MAX_SLOTS = 4096


def _number(text: str, what: str, low: int, high: int) -> int:
    if not _DIGITS.match(text):
        raise HostsError(f"{what} must be a whole number, got {text!r}")
    value = int(text) if len(text) <= len(str(high)) else high + 1  # no 5000-digit int() (ValueError)
    if not low <= value <= high:
        raise HostsError(f"{what} must be between {low} and {high}, got {text}")
    return value


def split_address(text: str) -> tuple[str | None, str, str | None]:
    """``[user@]host[:suffix]`` -> (user, host, suffix); brackets allow IPv6."""
    user = None
    if "@" in text:
        user, _, text = text.rpartition("@")
        if not _USER.match(user):
            raise HostsError(f"bad user name {user!r}")
    if text.startswith("["):
        close = text.find("]")
        if close < 0:
            raise HostsError(f"unclosed '[' in {text!r}")
        name, rest = text[1:close], text[close + 1 :]
        if not name or not _IPV6.match(name):
            raise HostsError(f"bad IPv6 address {name!r}")
        if rest and not rest.startswith(":"):
            raise HostsError(f"unexpected {rest!r} after ']'")
        return user, name, rest[1:] if rest else None
    if text.count(":") > 1:
        raise HostsError(f"an IPv6 address goes in brackets: [{text}] (a port or slots after it: [ADDRESS]:N)")
    name, sep, suffix = text.partition(":")
    if not name:
        raise HostsError("missing host name")
    if not _NAME.match(name):
        raise HostsError(f"bad host name {name!r}")
    return user, name, suffix if sep else None


def parse_line(line: str) -> Host | None:
    """One hosts-file line; None for a blank or comment-only line."""
    words = line.split("#", 1)[0].split()
    if not words:
        return None
    user, name, port_text = split_address(words[0])
    port = None if port_text is None else _number(port_text, "ssh port", 1, 65535)
    fields: dict[str, str] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if key not in ("slots", "python") or not sep:
            raise HostsError(f"unknown field {word!r} (expected slots=N or python=PATH)")
        if key in fields:
            raise HostsError(f"{key}= given twice")
        fields[key] = value
    slots = _number(fields["slots"], "slots", 1, MAX_SLOTS) if "slots" in fields else 1
    python = fields.get("python")
    if python is not None and not _PYTHON.match(python):
        raise HostsError(f"python={python}: give the interpreter's absolute path")
    return Host(name, slots=slots, user=user, port=port, python=python)


def parse_hosts_file(text: str, filename: str) -> list[Host]:
    """Every host in a hosts file; errors read ``FILE:LINE: reason``."""
    hosts: list[Host] = []
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            host = parse_line(line)
        except HostsError as e:
            raise HostsError(f"{filename}:{number}: {e}") from None
        if host is None:
            continue
        key = _identity(host)
        if key in first_line:
            raise HostsError(f"{filename}:{number}: {host.name} is already listed on line {first_line[key]}")
        first_line[key] = number
        hosts.append(host)
    if not hosts:
        raise HostsError(f"{filename}: no hosts listed")
    return hosts


def parse_host_option(value: str) -> list[Host]:
    """One ``-H`` value: ``[user@]host[:slots]``, comma-separated."""
    hosts = []
    for item in value.split(","):
        item = item.strip()
        if not item:
            raise HostsError(f"empty host in {value!r}")
        try:
            user, name, slots_text = split_address(item)
            slots = 1 if slots_text is None else _number(slots_text, "slots", 1, MAX_SLOTS)
        except HostsError as e:
            raise HostsError(f"-H {item}: {e}") from None
        hosts.append(Host(name, slots=slots, user=user))
    return hosts


def merge_host_options(values: Iterable[str]) -> list[Host]:
    """All ``-H`` values in order; a host named twice is an error."""
    hosts: list[Host] = []
    seen: set[str] = set()
    for value in values:
        for host in parse_host_option(value):
            if _identity(host) in seen:
                raise HostsError(f"-H {host.name}: host given twice")
            seen.add(_identity(host))
            hosts.append(host)
    return hosts


def total_slots(hosts: Sequence[Host]) -> int:
    return sum(h.slots for h in hosts)


def _identity(host: Host) -> str:
    # The plan counts local ranks by name, so one name means one machine.
    return host.name


def used_hosts(hosts: Sequence[Host], num_processes: int) -> list[Host]:
    """The first hosts whose slots hold ``num_processes``; the rest are spares."""
    used, slots = [], 0
    for host in hosts:
        if slots >= num_processes:
            break
        used.append(host)
        slots += host.slots
    return used
