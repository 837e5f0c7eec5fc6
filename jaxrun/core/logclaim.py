"""One running job per log folder.

A run claims its log folder before anything starts: an advisory lock on
``run.lock`` in it, held to the run's end, and let go by the kernel when
jaxrun ends however it ends (SIGKILL too), so a folder is never left claimed
by a run that is gone.  A second run given that folder while the first runs
is refused in one line that names the first (exit 2, nothing started); it
has touched nothing of the first's.  A finished run's folder is free, and
reused as before (docs/options.md, "Log files", says why a refusal rather
than a folder of its own).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from jaxrun import contract
from jaxrun.core.config import LaunchError

LOCK = "run.lock"
HOLDER_MAX = 4096  # what the lock file says of its holder, at most
SHOWN_ARGV = 160  # characters of the holder's command line in the refusal


class Claim:
    """A log folder held by this run until ``release``."""

    def __init__(self, fd: int, folder: str, made: bool):
        self.fd, self.folder, self.made = fd, folder, made

    def kept(self) -> bool:
        """Whether the folder stays: a folder this run made and left with
        nothing but its lock (a refusal before anything started) goes, as
        if it had never been made."""
        if self.made and os.listdir(self.folder) == [LOCK]:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.folder, LOCK))
                os.rmdir(self.folder)
                return False
        return os.path.isdir(self.folder)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # and with it the lock
            self.fd = -1


def claim(log_dir: str, run_id: str, argv: list[str], note=None) -> Claim:
    """Claim ``log_dir`` (made 0700 if it is not there), or refuse: another
    running job of this user's holds it.  Raises LaunchError in one line.
    The lock is this user's file alone (``contract.owned``): one that
    another user made (a plant, a hard link, a file open to others) is
    removed and made anew, never read, obeyed or quoted; where it cannot be
    removed, the run goes on unclaimed, said in one line to ``note``."""
    made = False
    try:
        os.makedirs(os.path.dirname(log_dir), exist_ok=True)
        try:
            os.mkdir(log_dir, 0o700)
            made = True
        except FileExistsError:
            pass
        folder = os.open(log_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise LaunchError(f"cannot use the log folder {log_dir} ({e.strerror or e})") from None
    try:
        fd = _lock_file(folder)
    except OSError as e:
        if note is not None:
            note(f"jaxrun: {os.path.join(log_dir, LOCK)} is not yours and cannot be replaced ({e.strerror or e}): "
                 "this run does not claim its log folder")
        return Claim(-1, log_dir, made)
    finally:
        os.close(folder)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        holder = os.pread(fd, HOLDER_MAX, 0)
        os.close(fd)
        raise LaunchError(f"--log-dir {log_dir} is in use by a running job: {described(holder)}; give this run "
                          "another --log-dir, or wait for that one to end") from None
    me = {"run_id": run_id, "pid": os.getpid(), "started": time.time(), "argv": argv}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    return Claim(fd, log_dir, made)


def _lock_file(folder: int) -> int:
    """The lock in the log folder ``folder``: a new file (0600, never
    through a link), or an earlier run's of this user's alone, which a
    running one may hold.  Anything else there is removed first."""
    try:
        return os.open(LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                       dir_fd=folder)
    except FileExistsError:
        pass
    with contextlib.suppress(contract.NotOurs, FileNotFoundError):
        return contract.open_own_file(LOCK, folder, os.O_RDWR)
    return contract.create_file(LOCK, folder, os.O_RDWR)


def described(holder: bytes) -> str:
    """The running job, as its lock file says: its run id, its jaxrun's pid,
    when it started and its command line."""
    try:
        data = json.loads(holder)
        when = time.strftime("%H:%M:%S", time.localtime(float(data["started"])))
        command = " ".join(map(str, data["argv"]))
        if len(command) > SHOWN_ARGV:
            command = command[: SHOWN_ARGV - 3] + "..."
        return f"run {data['run_id']} (jaxrun pid {int(data['pid'])}, started {when}: {command})"
    except (ValueError, KeyError, TypeError):
        return "a jaxrun that has not said which yet"
