"""Where a run's files live, and how they are created.

Every file a run writes into its log folder is made here, so that the rules
for a folder other users may share live in one place:

- The default logs go under a base folder of the user's own,
  ``$TMPDIR/jaxrun-logs-UID``, mode 0700.  A folder every user shares would be
  created by the first one, and the second could then neither write into it
  nor keep the first from reading their tracebacks.  Where another user made
  that name first, a folder of a random name beside it (``private_base``).
- A run's folder is created new, mode 0700.  An explicit ``--log-dir`` that
  exists already is reused, as users expect, when it is a folder they may
  write (and not a symlink another user planted).
- Files are opened ``O_NOFOLLOW | O_EXCL`` with mode 0600.  A file left by an
  earlier run is unlinked first, so a symlink planted in its place is removed,
  never followed: nothing outside the folder can be clobbered.
- Reports go through a unique temporary name in the target folder and
  ``os.replace``: a reader never sees half a report, and no fixed temporary
  name can be planted in advance.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from typing import BinaryIO

from jaxrun import contract
from jaxrun.core.config import LaunchError

# The probe's verdict in a run's folder (`jaxrun probe`, --probe): its table, which
# `jaxrun logs` shows, and the same as JSON; the probe's own job logs in PROBE_FOLDER.
PROBE_TABLE, PROBE_JSON, PROBE_FOLDER = "probe.txt", "probe.json", "probe"
_ERROR_RECORD = re.compile(r"process-\d+\.error\.json\Z")


def log_paths(log_dir: str, rank: int, life: int = 0) -> tuple[str, str, str]:
    """A process's stdout, stderr and error record; ``life`` > 0: a later life
    of a process started again alone (``process-2.life-1.stdout``)."""
    base = os.path.join(log_dir, f"process-{rank}" + (f".life-{life}" if life else ""))
    return base + ".stdout", base + ".stderr", base + ".error.json"


def life_paths(log_dir: str, rank: int) -> list[tuple[str, str, str]]:
    """``log_paths`` of every life a finished process had in ``log_dir``, oldest first."""
    found = [log_paths(log_dir, rank)]
    while os.path.lexists(log_paths(log_dir, rank, len(found))[0]):
        found.append(log_paths(log_dir, rank, len(found)))
    return found


# -- folders -----------------------------------------------------------------


LOG_BASE = "jaxrun-logs-{uid}"  # in the temporary folder, one per user


def default_base(tmpdir: str | None = None) -> str:
    """The per-user folder that holds every run's default log folder: the
    usual one, or the one of a random name a run made beside it where
    another user had taken that (``private_base``).  Nothing is made."""
    parent = tmpdir or tempfile.gettempdir()
    found = contract.private_folders(parent, LOG_BASE.format(uid=os.geteuid()))
    return found[0] if found else os.path.join(parent, LOG_BASE.format(uid=os.geteuid()))


def private_base(tmpdir: str | None = None) -> tuple[str, str | None]:
    """The per-user base, made 0700 if new, and the one line that says why
    it is not the usual name (None where it is).  Where another user made
    ``$TMPDIR/jaxrun-logs-UID`` first (a folder, a link, a file, a FIFO),
    the logs go to a private folder of a random name beside it: a refusal
    would let any user of the machine stop every run of another's."""
    parent = tmpdir or tempfile.gettempdir()
    name = LOG_BASE.format(uid=os.geteuid())
    try:
        path, problem = contract.private_folder_in(parent, name)
    except OSError as e:
        raise LaunchError(f"cannot create the log folder {os.path.join(parent, name)} ({e.strerror or e}); "
                          "pass --log-dir DIR") from None
    if problem is None:
        return path, None
    return path, (f"jaxrun: the log folder {os.path.join(parent, name)} is not yours alone ({problem}): "
                  f"this run's logs are in {path}, a private folder of a random name")


def check_log_dir(path: str) -> None:
    """Before anything starts: the folder can be used, or created where it is
    asked for.  Nothing is created here."""
    if os.path.lexists(path):
        _check_reusable(path)
        if not os.access(path, os.W_OK | os.X_OK):
            raise LaunchError(f"--log-dir {path}: cannot write there (permission denied)")
        return
    parent = nearest_existing(path)
    if not os.path.isdir(parent):
        raise LaunchError(f"--log-dir {path}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LaunchError(f"--log-dir {path}: cannot create folders in {parent} (permission denied)")


def nearest_existing(path: str) -> str:
    """``path`` itself or the closest of its parents that exists."""
    path = os.path.abspath(path)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def prepare_log_dir(path: str) -> None:
    """The attempt's folder, before any process starts: created 0700, or, when
    a usable folder is there already, reused after removing the error records
    an earlier run left.  (The children write those themselves, and a stale
    one would be taken for this run's, or followed if it were a link.)"""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError as e:
        raise LaunchError(f"cannot create the log folder {path} ({e.strerror or e})") from None
    try:
        os.mkdir(path, 0o700)
        return
    except FileExistsError:
        pass
    except OSError as e:
        raise LaunchError(f"cannot create the log folder {path} ({e.strerror})") from None
    _check_reusable(path)
    for name in os.listdir(path):
        if _ERROR_RECORD.match(name):
            _replaceable(os.path.join(path, name))


def _check_reusable(path: str) -> None:
    """An existing log folder must be a folder.  A symlink to one counts only
    when the user or root made the link: one that another user planted where
    the user asked for logs could lead them anywhere.  (A folder someone else
    owns is fine if the user may write in it, such as a team's: every file
    jaxrun puts there is new, and its own.)"""
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (os.geteuid(), 0):
        raise LaunchError(f"log folder {path} is a symlink that uid {link.st_uid} made; pass a folder of your own")
    if not os.path.isdir(path):
        raise LaunchError(f"log folder {path} is not a folder")


# -- files -------------------------------------------------------------------


def create_private(path: str, flags: int = os.O_WRONLY) -> int:
    """A new file only the user can read, at exactly ``path``
    (``contract.create_file``): a file left there (by an earlier run of an
    explicit --log-dir, or planted) is unlinked first, never opened."""
    try:
        return contract.create_file(path, flags=flags)
    except OSError as e:
        if os.path.lexists(path):
            raise LaunchError(f"cannot replace {path}, left there before this run ({e.strerror})") from None
        raise


def open_pumped_log(path: str) -> BinaryIO:
    """A log file jaxrun writes itself, from a process's pipe (no O_APPEND:
    the kernel moves a pipe into no such file)."""
    return os.fdopen(create_private(path), "wb", buffering=0)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)  # a symlink itself, never what it points at
    except FileNotFoundError:
        pass


def _replaceable(path: str) -> None:
    """Remove what an earlier run left at ``path``; refuse to go on when that
    is impossible (another user's file in a sticky folder such as /tmp),
    since jaxrun's own file could then not take its place."""
    try:
        _unlink(path)
    except OSError as e:
        raise LaunchError(f"cannot replace {path}, left there before this run ({e.strerror})") from None


# -- reports -----------------------------------------------------------------


def check_writable_file(option: str, path: str) -> None:
    """Before anything starts: ``path`` can be written when the run ends."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        what = "does not exist" if not os.path.lexists(folder) else "is not a folder"
        raise LaunchError(f"{option} {path}: the folder {folder} {what}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise LaunchError(f"{option} {path}: cannot write in {folder} (permission denied)")


def write_atomically(path: str, data: bytes) -> None:
    """Replace ``path`` with ``data`` in one step, through a temporary file of
    a unique name in the same folder (mkstemp: O_EXCL, mode 0600)."""
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
