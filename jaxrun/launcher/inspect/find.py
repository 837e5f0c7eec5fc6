"""Finding a running job's control channel, and asking it one thing.

Without a run id, the newest running job of this user's: every channel in
the private socket folder is asked who it is (``Describe``), and the one
started last answers.  A socket whose jaxrun is gone (SIGKILLed: it had no
chance to remove it) refuses the connection, and is removed here, with the
coordination services' sockets that dead runs left (``core.stale``).
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import stat
import sys

import click

from jaxrun import portable
from jaxrun.core import stale
from jaxrun.launcher import channel
from jaxrun.wire import encoding, inspect as words

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ASK_TIMEOUT = 5.0  # for a quick answer (who are you, the table)


class NoJob(Exception):
    """No running job answers: one line, exit 1."""


class NotMine(NoJob):
    """The listener on a channel's socket is another user's process: it is asked nothing."""


def run_option(f):
    return click.option("--run", "run_id", metavar="RUN_ID",
                        help="The running job to look into (default: the newest one you started).")(f)


def ask(path: str, request: encoding.Message, timeout: float = ASK_TIMEOUT) -> encoding.Message:
    """Send ``request`` to the channel at ``path``, and its answer.
    OSError: nobody listens there; NoJob: the job answered no message;
    NotMine: another user's process listens there (``SO_PEERCRED``), and
    is sent nothing."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        uid = portable.peer_uid(conn)
        if uid not in (None, os.getuid()):
            raise NotMine(f"skipped {path}: its listener is another user's (uid {uid})")
        conn.sendall(request.line())
        try:
            line = channel.read_line(conn, words.MAX_LINE)
            return encoding.decode(line)
        except (EOFError, encoding.WireError) as e:
            raise NoJob(f"the job at {path} gave no answer ({e})") from None


def listed(folder: str) -> list[str]:
    """The channels' sockets in ``folder``: those that are sockets, by name."""
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        path = os.path.join(folder, name)
        if name.startswith(channel.PREFIX) and name.endswith(channel.SUFFIX):
            with contextlib.suppress(OSError):
                st = os.lstat(path)
                if stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid():
                    found.append(path)
                elif stat.S_ISSOCK(st.st_mode):
                    print(f"jaxrun: skipped {path}: another user's socket (uid {st.st_uid})", file=sys.stderr,
                          flush=True)
    return found


def describe(path: str) -> words.JobInfo | None:
    """Who listens at ``path``; None, with the socket removed, where nobody does."""
    try:
        info = ask(path, words.Describe())
    except ConnectionRefusedError:  # its jaxrun is gone
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    except NotMine as e:
        print(f"jaxrun: {e}", file=sys.stderr, flush=True)
        return None
    except (OSError, NoJob):
        return None
    return info if isinstance(info, words.JobInfo) else None


def find_job(run_id: str | None, folder: str | None = None) -> tuple[str, words.JobInfo]:
    """(the channel's path, who it is): run ``run_id``'s, or the newest job's,
    in any of this user's socket folders (one of a random name where another
    user took the usual one: each is checked to be this user's alone)."""
    folders = [folder] if folder else portable.sockets.socket_folders()
    for place in folders:  # a SIGKILLed run's coordination service left its socket file too
        stale.remove_stale(place)
    if run_id is not None:
        if not RUN_ID.fullmatch(run_id):
            raise click.BadParameter(f"{run_id!r} is not a run id (like 20261204-013000-1a2b3c)",
                                     param_hint="'--run'")
        for place in folders:
            path = channel.address(run_id, place)
            info = describe(path) if path and os.path.exists(path) else None
            if info is not None:
                return path, info
        raise NoJob(f"no running job {run_id} (it has ended, or was started by another user)")
    jobs = [(info.started, path, info) for place in folders for path in listed(place)
            if (info := describe(path)) is not None]
    if not jobs:
        raise NoJob("no running job of yours (jaxrun logs lists the finished ones)")
    _, path, info = max(jobs, key=lambda job: (job[0], job[1]))
    return path, info


def asked(run_id: str | None, request: encoding.Message, timeout: float = ASK_TIMEOUT
          ) -> tuple[str, words.JobInfo, encoding.Message]:
    """Find the job and ask it; a job that ends meanwhile, or refuses, is
    one line and exit 1."""
    try:
        path, info = find_job(run_id)
        answer = ask(path, request, timeout)
    except NoJob as e:
        fail(str(e))
    except OSError as e:
        fail(f"the job ended, or cannot be reached: {e.strerror or e}")
    if isinstance(answer, words.Refused):
        fail(f"run {info.run_id} refused: {answer.why}")
    return path, info, answer


def fail(line: str):
    print(f"jaxrun: {line}", file=sys.stderr, flush=True)
    sys.exit(1)
