"""Reading back what a process left, and leaving it: the one guarded reader
(``open_regular``, ``read_tail``, ``read_small``), private files written
whole (``write_private``), the joined file's word, and the activity file's
line (``Spinning``).  The rule for private folders is ``contract.owned``.

Every controller writes through this module at start-up, so it imports
nothing beyond the interpreter's own start: no dataclasses, json or re."""

from __future__ import annotations

import io
import os
import stat

from jaxrun.contract.names import BUSY, FINISHED, IDLE, PARKED, RECOVERABLE, SPIN

# -- reading back what a process left ---------------------------------------------------
# Every log and record is read after a run through these three: only a regular
# file of this user's, never through a symlink, and never more than a bound, so that a FIFO or
# a device put in a log's place cannot block the launcher, a link cannot lead
# it elsewhere, and a log of many gigabytes costs neither memory nor time.

def open_regular(path: str) -> io.BufferedReader | None:
    """``path`` opened for reading if it is a regular file (not a symlink)
    of this user's; None otherwise, or if it cannot be opened.  Every file
    read back was written by this user's jaxrun or processes: one of
    another user's in its place (a team's log folder) is never believed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            return os.fdopen(fd, "rb")
    except OSError:
        pass
    os.close(fd)
    return None


def read_tail(path: str, size: int) -> bytes | None:
    """The last ``size`` bytes of a file (all of a shorter one); None if it
    is not a regular file or cannot be read."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return f.read(size)
        except OSError:
            return None


def read_small(path: str, limit: int) -> bytes | None:
    """A whole file of at most ``limit`` bytes; None if it is larger, is not a
    regular file, or cannot be read."""
    f = open_regular(path)
    if f is None:
        return None
    with f:
        try:
            data = f.read(limit + 1)
        except OSError:
            return None
    return None if len(data) > limit else data


def write_private(path: str, data: bytes) -> None:
    """``data`` as the whole of ``path``, at once for a reader: a new file
    (0600, never through a symlink) renamed over the old one."""
    new = f"{path}.{os.getpid()}.new"
    try:
        os.unlink(new)
    except FileNotFoundError:
        pass
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(new, path)


def remove_private(*paths: str) -> None:
    """Remove what ``write_private`` wrote at each of ``paths``, and the new
    copy a writer that ended before its rename left beside it
    (``PATH.PID.new``).  Each folder is listed once, however many paths it
    holds: a run's end removes every process's file from one log folder."""
    folders: dict[str, set[str]] = {}
    for path in paths:
        folder, name = os.path.split(path)
        folders.setdefault(folder or os.curdir, set()).add(name)
    for folder, names in folders.items():
        try:
            listed = os.listdir(folder)
        except OSError:
            listed = []
        stale = [n for n in listed if n.endswith(".new") and n[:-4].rpartition(".")[0] in names
                 and n[:-4].rpartition(".")[2].isdigit()]
        for name in [*names, *stale]:
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def joined_recoverable(path: str) -> bool:
    """Whether the joined file at ``path`` says its process enabled recoverability."""
    data = read_small(path, 64)
    return data is not None and data.strip() == RECOVERABLE.encode()


class Spinning:
    """What a SPIN line says: how many of the process's own threads burnt CPU
    while its Python did not move, and their CPU in cores.  A value, compared
    and hashed by its two fields and never changed (a plain class: this module
    is imported at every controller's start, and a dataclass costs that start
    the import of ``dataclasses``)."""

    __slots__ = ("threads", "cores")
    threads: int
    cores: float

    def __init__(self, threads: int, cores: float) -> None:
        object.__setattr__(self, "threads", threads)
        object.__setattr__(self, "cores", cores)

    def __setattr__(self, name: str, value) -> None:
        raise AttributeError(f"a Spinning is never changed: cannot set {name!r}")

    def __eq__(self, other) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return (self.threads, self.cores) == (other.threads, other.cores)

    def __hash__(self) -> int:
        return hash((self.threads, self.cores))

    def __repr__(self) -> str:
        return f"Spinning(threads={self.threads!r}, cores={self.cores!r})"

    def __reduce__(self):  # copy, deepcopy and pickle make it anew, never set its fields
        return Spinning, (self.threads, self.cores)

    def line(self) -> str:
        """The activity line that says it: ``spin 2 1.97``."""
        return f"{SPIN} {self.threads} {self.cores:.2f}"

    @classmethod
    def of(cls, said: str) -> Spinning | None:
        """The spinning a SPIN line says; None for any other line."""
        word, *rest = said.split() or [""]
        if word != SPIN or len(rest) != 2:
            return None
        try:
            threads, cores = int(rest[0]), float(rest[1])
        except ValueError:
            return None
        return cls(threads, cores) if 0 < threads < 100000 and 0 <= cores < 100000 else None


ACTIVITY_LINE_MAX = 40  # bytes: the longest line a sampler writes (a SPIN line)


def activity_word(said: str) -> str | None:
    """The state an activity line says (BUSY, IDLE, PARKED, SPIN or
    FINISHED), or None for a line that is none of them."""
    if said in (BUSY, IDLE, PARKED, FINISHED):
        return said
    return SPIN if Spinning.of(said) is not None else None
