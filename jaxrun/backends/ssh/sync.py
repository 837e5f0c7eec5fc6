"""``--sync``: copy the working directory to the same path on every host.

What Open MPI's ``--preload-files``, Ray's ``working_dir`` and SkyPilot's
``workdir`` do for their users: the script and its sibling modules reach hosts
that do not share the launching machine's filesystem.  Every copy rides the
host's existing ssh master, so it costs no new handshake.

- What is copied: the folder's files without ``.git``; in a git work tree,
  only the files git does not ignore (``git ls-files``), when git is at hand.
- How: ``rsync`` where both ends have it (only changed files travel on a
  second run), else ``tar`` over the session.
- A host that already sees the folder (a shared home, NFS, this machine) is
  left alone: a marker file created here first is looked for there, so a
  folder is never copied onto itself.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Callable, Sequence

from jaxrun.core.backend import RunHooks, wait_until
from jaxrun.core.config import LaunchError
from jaxrun.core.spec import Host

SYNC_TIMEOUT = 600.0  # seconds for all hosts together; a folder that big wants a shared filesystem


def files_to_copy(folder: str) -> list[str] | None:
    """Relative paths git tracks or would track there; None: copy everything
    (not a git work tree, or no git)."""
    if not shutil.which("git") or not os.path.exists(os.path.join(folder, ".git")):
        return None
    done = subprocess.run(["git", "-C", folder, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                          capture_output=True)
    if done.returncode != 0:
        return None
    return [p for p in done.stdout.decode(errors="surrogateescape").split("\0")
            if p and os.path.lexists(os.path.join(folder, p))]


def tar_create(folder: str, files: list[str] | None) -> list[str]:
    if files is None:
        return ["tar", "-C", folder, "--exclude=./.git", "-cf", "-", "."]
    return ["tar", "-C", folder, "--null", "-T", "-", "-cf", "-"]


def remote_tar_extract(folder: str, marker: str) -> str:
    """The remote shell command: leave a folder that is ours already alone,
    else create it and unpack there."""
    q = shlex.quote(folder)
    m = shlex.quote(os.path.join(folder, marker))
    return f"if [ -e {m} ]; then cat >/dev/null; else mkdir -p {q} && tar -C {q} -xf -; fi"


def sync(folder: str, hosts: Sequence[Host], session_args: Callable[[Host], list[str]],
         remote_rsync: Callable[[Host], bool], hooks: RunHooks, console=None) -> list[str]:
    """Copy ``folder`` to every host that does not see it already; returns
    the names of the hosts copied to.  Raises LaunchError naming a host that failed."""
    marker = f".jaxrun-sync-{uuid.uuid4().hex}"
    marker_path = os.path.join(folder, marker)
    files = files_to_copy(folder)
    local_rsync = shutil.which("rsync") is not None
    with open(marker_path, "w"):
        pass
    copies: dict[str, subprocess.Popen] = {}
    try:
        for host in hosts:
            copies[host.name] = _start_copy(folder, host, session_args(host), files, marker,
                                            local_rsync and remote_rsync(host))
        try:
            finished = wait_until(lambda: all(p.poll() is not None for p in copies.values()), hooks, SYNC_TIMEOUT)
        finally:
            for popen in copies.values():
                if popen.poll() is None:
                    popen.kill()
                    popen.wait()
        if not finished:
            raise LaunchError(f"--sync: copying {folder} took longer than {SYNC_TIMEOUT:g} s")
        problems = []
        for name, popen in copies.items():
            if popen.returncode != 0:
                reason = popen.stderr.read().decode(errors="replace").strip().splitlines()
                problems.append(f"{name}: --sync failed: {reason[-1] if reason else f'status {popen.returncode}'}")
        if problems:
            raise LaunchError("; ".join(problems))
    finally:
        for popen in copies.values():
            if popen.stderr:
                popen.stderr.close()
            producer = getattr(popen, "producer", None)
            if producer is not None:
                producer.kill()
                producer.wait()
        os.unlink(marker_path)
    # The marker travelled too; take it off the hosts' copies.
    _remove_remote_markers(folder, marker, hosts, session_args)
    return list(copies)


def _start_copy(folder: str, host: Host, ssh: list[str], files: list[str] | None, marker: str,
                use_rsync: bool) -> subprocess.Popen:
    listing = None if files is None else "\0".join([*files, marker]).encode()
    if use_rsync:
        # rsync opens its own session through the same ssh arguments (the master).
        shell = shlex.join(ssh[:-1])  # without the host: rsync adds it
        # The folder may not exist there yet, parents included: the remote rsync is started by a shell
        # that makes it first.
        argv = ["rsync", "-a", "--exclude=/.git", "-e", shell,
                f"--rsync-path=mkdir -p {shlex.quote(folder)} && rsync"]
        if listing is not None:
            argv += ["--from0", "--files-from=-"]
        argv += [folder.rstrip("/") + "/", f"{ssh[-1]}:{folder.rstrip('/')}/"]
        # rsync cannot tell a shared folder from a copy: ask first, in the same command.
        check = ssh + [f"test -e {shlex.quote(os.path.join(folder, marker))}"]
        if subprocess.run(check, stdin=subprocess.DEVNULL, capture_output=True).returncode == 0:
            return subprocess.Popen(["true"], stderr=subprocess.PIPE)
        return _popen(argv, listing)
    tar = tar_create(folder, files)
    producer = subprocess.Popen(tar, stdin=subprocess.PIPE if listing is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    consumer = subprocess.Popen(ssh + [remote_tar_extract(folder, marker)], stdin=producer.stdout,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    producer.stdout.close()
    if listing is not None:
        producer.stdin.write(listing)
        producer.stdin.close()
    consumer.producer = producer  # reaped with it
    return consumer


def _popen(argv: list[str], stdin_bytes: bytes | None) -> subprocess.Popen:
    popen = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin_bytes is not None else subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    if stdin_bytes is not None:
        popen.stdin.write(stdin_bytes)
        popen.stdin.close()
    return popen


def _remove_remote_markers(folder: str, marker: str, hosts: Sequence[Host],
                           session_args: Callable[[Host], list[str]]) -> None:
    path = shlex.quote(os.path.join(folder, marker))
    cleanups = [subprocess.Popen(session_args(h) + [f"rm -f {path}"], stdin=subprocess.DEVNULL,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for h in hosts]
    for popen in cleanups:
        try:
            popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            popen.kill()
            popen.wait()
