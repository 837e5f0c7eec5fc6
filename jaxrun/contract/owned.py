"""The one rule for every file and folder jaxrun makes or opens where another
user of the machine can write (a shared /tmp, a team's --log-dir): nothing
that another user made first is followed, written through, read or trusted.

- A folder or file of jaxrun's is made new (``mkdir`` 0700, or
  ``O_CREAT|O_EXCL`` 0600, of its name), or it is one that is there already
  and passes the check: not a link (``O_NOFOLLOW``, ``lstat``), this user's,
  and (a folder) open to nobody else, (a file) with no other name (one hard
  link) and no bit for group or others.  What fails is refused, never
  repaired: another user's thing is never chmod'ed, chown'ed or written to.
- Everything is opened relative to a folder descriptor that has passed the
  check (``dir_fd``), one name at a time, with ``O_NOFOLLOW``, and the check
  is made on the descriptor itself (``fstat``): a name swapped after the
  check changes nothing of what was opened.
- A path handed by name to someone who opens it later, for as long as it
  runs (JAX's compile cache), must be a ``trusted_path``: no folder on the
  way can be renamed or replaced by another user.
- Where another user made a predictable name first (``jaxrun-sockets-UID``
  in /tmp), a private folder of a random name beside it takes its place
  (``private_folder_in``): a refusal would let anyone stop every run of
  another's.

Every side imports this: the launcher, the far ends and the child (which
imports it at start-up: nothing here beyond the interpreter's own start).
"""

from __future__ import annotations

import errno
import os
import stat

FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OTHERS = 0o077  # group and others: any of these bits on a private thing is refused


class NotOurs(OSError):
    """A name that is there but fails the check: what is wrong, in words."""


def private_problem(st: os.stat_result, kind: int = stat.S_IFDIR, any_mode: bool = False) -> str | None:
    """What makes a folder (``kind`` S_IFDIR) or a file (S_IFREG), by its
    lstat or fstat, not this user's alone, or None.  A file must have one
    name: a hard link to it is another name that someone else may have made.
    ``any_mode``: only what it is and its owner count (a folder inside a
    private one, or one the user made and named)."""
    if stat.S_IFMT(st.st_mode) != kind:
        return "it is not a folder (a symlink or a file)" if kind == stat.S_IFDIR else "it is not a regular file"
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}"
    if st.st_mode & OTHERS and not any_mode:
        return f"other users have access to it (mode {stat.S_IMODE(st.st_mode):04o})"
    if kind == stat.S_IFREG and st.st_nlink != 1:
        return f"it has {st.st_nlink} names (a hard link)"
    return None


def open_folder(name: str, dir_fd: int | None = None, make: bool = False, inside_private: bool = False) -> int:
    """A descriptor of the private folder ``name`` (relative to ``dir_fd``,
    itself already checked, or a path whose last part is not followed),
    made 0700 first where ``make`` and it is not there.  ``inside_private``:
    ``dir_fd`` is a private folder, which keeps everyone else out of what
    it holds, so this one's mode does not matter (a tar unpacked it 0755);
    its owner still does.  NotOurs: it is there and fails the check;
    OSError: it cannot be made or opened."""
    if make:
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
        except FileExistsError:
            pass
    try:
        fd = os.open(name, FOLDER_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno in (errno.ENOTDIR, errno.ELOOP):  # a file, a link
            raise NotOurs("it is not a folder (a symlink or a file)") from None
        raise
    problem = private_problem(os.fstat(fd), any_mode=inside_private)
    if problem is not None:
        os.close(fd)
        raise NotOurs(problem)
    return fd


def open_path(path: str, make: bool = False) -> int:
    """``open_folder`` of ``path``'s last part, relative to its parent as
    the user named it (the parent's own links are the user's to make)."""
    parent, name = os.path.split(os.path.abspath(path))
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return open_folder(name, fd, make)
    finally:
        os.close(fd)


def open_chain(path: str, depth: int, make: bool = True) -> int:
    """The last ``depth`` parts of ``path`` opened as private folders, each
    relative to the one before (made 0700 where missing and ``make``), from
    the folder above them as the user named it: a descriptor of the last."""
    parts = []
    for _ in range(depth - 1):
        path, name = os.path.split(path)
        parts.insert(0, name)
    fd = open_path(path, make)
    for name in parts:
        try:
            inner = open_folder(name, fd, make)
        finally:
            os.close(fd)
        fd = inner
    return fd


def private_folder(path: str) -> str | None:
    """Create ``path`` 0700, or check that the folder there is this user's
    alone: what is wrong with it ("it belongs to uid 65534"), or None.
    OSError when it cannot be made."""
    try:
        os.close(open_path(path, make=True))
    except NotOurs as e:
        return str(e)
    return None


def create_file(name: str, dir_fd: int | None = None, flags: int = os.O_WRONLY) -> int:
    """A new file only this user can read, called ``name`` in the checked
    folder ``dir_fd``: what was there by that name (a file of an earlier
    run, another user's plant, a link) is unlinked first, never opened;
    OSError where it cannot be (another user's file in a sticky folder)."""
    flags |= os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(name, flags, 0o600, dir_fd=dir_fd)
    except FileExistsError:
        os.unlink(name, dir_fd=dir_fd)  # a link itself, never what it points at
        return os.open(name, flags, 0o600, dir_fd=dir_fd)


def open_own_file(name: str, dir_fd: int | None = None, flags: int = os.O_RDONLY) -> int:
    """``name`` opened (never through a link) where it is this user's alone;
    NotOurs where another user made it, or it is open to others or has a
    second name; OSError where it is not there."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    problem = private_problem(os.fstat(fd), stat.S_IFREG)
    if problem is not None:
        os.close(fd)
        raise NotOurs(problem)
    return fd


def trusted_path(path: str) -> tuple[str, str | None]:
    """``path`` with its links resolved, and what lets another user swap a
    part of it (None: nothing).  A folder on the way is safe when it is this
    user's or root's and nobody else may write in it, or it is sticky (as
    /tmp) and the part in it is this user's or root's: only they can then
    rename or replace that part.  The resolved path is what to hand on."""
    real = os.path.realpath(path)
    me = os.geteuid()
    here = os.sep
    for name in [p for p in real.split(os.sep) if p]:
        st = os.lstat(here)
        try:
            inner = os.lstat(os.path.join(here, name)).st_uid
        except FileNotFoundError:
            inner = None  # made later, by this user
        if st.st_uid not in (me, 0):
            return real, f"{here} belongs to uid {st.st_uid}"
        if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and inner in (me, 0, None)):
            return real, f"other users may rename what is in {here} (mode {stat.S_IMODE(st.st_mode):04o})"
        if inner is None:
            break
        here = os.path.join(here, name)
    return real, None


def private_folder_in(parent: str, name: str) -> tuple[str, str | None]:
    """This user's folder called ``name`` in the shared folder ``parent``,
    and what was wrong with the predictable one (None: it is that one).
    Another user may make PARENT/NAME first (a folder, a link, a file, a
    FIFO): then an earlier folder of ours of a random name, PARENT/NAME-XXXXXXXX,
    or a new one, made 0700 and checked once made.  Never a refusal: anyone
    could block every run of another user's that way.  Two runs that make
    one at once agree on the first by name.  OSError: no folder can be made
    there."""
    path = os.path.join(parent, name)
    try:
        problem = private_folder(path)
    except OSError as e:
        problem = f"it cannot be made ({e.strerror or e})"
    if problem is None:
        return path, None
    found = private_folders(parent, name, random_only=True)
    if not found:
        import tempfile

        made = tempfile.mkdtemp(prefix=name + "-", dir=parent)
        if private_folder(made) is not None:  # ours, a folder, 0700
            raise OSError(f"{made} is not private once made")
        found = private_folders(parent, name, random_only=True)
        if made != found[0]:
            os.rmdir(made)  # another run made one first
    return found[0], problem


def folder_to_use(parent: str, name: str) -> str:
    """Where jaxrun's folder called ``name`` in ``parent`` (a log folder
    that others may write) goes: PARENT/NAME where nothing is there yet
    (made later, 0700) or it is this user's alone; where another user made
    it first, a private folder of a random name beside it, made now (or
    PARENT/NAME where none can be made: its maker's check then refuses it)."""
    path = os.path.join(parent, name)
    if not os.path.lexists(path) or ours_alone(path):
        return path
    try:
        return private_folder_in(parent, name)[0]
    except OSError:
        return path


def private_folders(parent: str, name: str, random_only: bool = False) -> list[str]:
    """This user's folders called ``name`` (or NAME-XXXXXXXX) in ``parent``
    that only this user may enter, checked with lstat (no link, no one
    else's): the predictable one first, then those of a random name by name."""
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    prefix = name + "-"
    found = [] if random_only or name not in names else [name]
    found += sorted(n for n in names if n.startswith(prefix) and len(n) == len(prefix) + 8)
    return [os.path.join(parent, n) for n in found if ours_alone(os.path.join(parent, n))]


def ours_alone(path: str) -> bool:
    """Whether ``path`` (lstat) is a folder of this user's that nobody else may enter."""
    try:
        return private_problem(os.lstat(path)) is None
    except OSError:
        return False
