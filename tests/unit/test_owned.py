"""The one rule for files and folders where another user can write
(``contract.owned``): a link is never followed, another user's thing or one
open to others is refused, and what was opened stays what was checked when
its name is swapped afterwards.  Another user's ownership is made with
chown, which needs root (as the suite runs here and in CI)."""

import os
import stat

import pytest

from jaxrun import contract

OTHER = 65534  # nobody
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


def held(path) -> int:
    return contract.open_path(str(path))


def test_a_new_folder_is_made_0700_and_a_file_in_it_0600(tmp_path):
    fd = contract.open_path(str(tmp_path / "new"), make=True)
    try:
        assert stat.S_IMODE(os.fstat(fd).st_mode) == 0o700
        os.close(contract.create_file("f", fd))
    finally:
        os.close(fd)
    st = os.lstat(tmp_path / "new" / "f")
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


def test_a_link_to_a_private_folder_is_not_followed(tmp_path):
    (tmp_path / "mine").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "mine")
    with pytest.raises(contract.NotOurs, match="not a folder"):
        held(tmp_path / "link")
    assert contract.private_folder(str(tmp_path / "link")) == "it is not a folder (a symlink or a file)"


@needs_root
def test_another_user_s_folder_is_refused_and_left_as_it_was(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER, OTHER)
    with pytest.raises(contract.NotOurs, match=f"belongs to uid {OTHER}"):
        contract.open_path(str(theirs), make=True)
    st = os.lstat(theirs)
    assert st.st_uid == OTHER and stat.S_IMODE(st.st_mode) == 0o700  # never repaired


def test_a_folder_open_to_others_is_refused(tmp_path):
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o755)
    assert contract.private_folder(str(tmp_path / "open")) == "other users have access to it (mode 0755)"


@needs_root
def test_a_swap_after_the_check_changes_nothing(tmp_path):
    """The folder is renamed aside and another user's put in its place after
    it was opened: what is made through the descriptor lands in the one
    that was checked."""
    fd = contract.open_path(str(tmp_path / "cache"), make=True)
    try:
        os.rename(tmp_path / "cache", tmp_path / "aside")
        (tmp_path / "cache").mkdir(mode=0o777)
        os.chown(tmp_path / "cache", OTHER, OTHER)
        os.close(contract.create_file("entry", fd))
        inner = contract.open_folder("sub", fd, make=True)
        os.close(inner)
    finally:
        os.close(fd)
    assert sorted(os.listdir(tmp_path / "aside")) == ["entry", "sub"]
    assert os.listdir(tmp_path / "cache") == []


def test_a_file_planted_at_a_name_is_removed_never_written_through(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    folder = tmp_path / "logs"
    folder.mkdir(mode=0o700)
    (folder / "run.lock").symlink_to(victim)
    fd = held(folder)
    try:
        new = contract.create_file("run.lock", fd)
        os.write(new, b"mine")
        os.close(new)
    finally:
        os.close(fd)
    assert victim.read_text() == "keep"
    st = os.lstat(folder / "run.lock")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


@needs_root
@pytest.mark.parametrize("kind", ["other owner", "open mode", "hard link", "link"])
def test_a_file_that_is_not_ours_alone_is_not_opened(kind, tmp_path):
    path = tmp_path / "f"
    path.write_text("said")
    os.chmod(path, 0o600)
    if kind == "other owner":
        os.chown(path, OTHER, OTHER)
    elif kind == "open mode":
        os.chmod(path, 0o666)
    elif kind == "hard link":
        os.link(path, tmp_path / "second")
    else:
        path.rename(tmp_path / "target")
        path.symlink_to(tmp_path / "target")
    with pytest.raises(OSError):
        contract.open_own_file(str(path))


def test_an_own_file_of_one_name_is_opened(tmp_path):
    path = tmp_path / "f"
    path.write_text("said")
    os.chmod(path, 0o600)
    fd = contract.open_own_file(str(path))
    assert os.read(fd, 10) == b"said"
    os.close(fd)


@needs_root
def test_a_trusted_path_has_no_folder_another_user_may_change(tmp_path):
    """tmp_path's own parents are root's and 0700 (pytest-of-root)."""
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    assert contract.trusted_path(str(mine / "cache")) == (str(mine / "cache"), None)
    team = tmp_path / "team"
    team.mkdir()
    os.chmod(team, 0o777)
    assert "other users may rename what is in" in contract.trusted_path(str(team / "cache"))[1]
    os.chmod(team, 0o1777)  # sticky, and root's: only root renames root's things in it
    assert contract.trusted_path(str(team / "cache"))[1] is None
    os.chown(team, OTHER, OTHER)  # sticky, but the folder's owner may rename anything in it
    assert contract.trusted_path(str(team / "cache"))[1] == f"{team} belongs to uid {OTHER}"
    (tmp_path / "via").symlink_to(team)  # a link is judged by where it leads
    real, problem = contract.trusted_path(str(tmp_path / "via" / "cache"))
    assert real == str(team / "cache") and problem is not None


@needs_root
def test_a_predictable_name_another_user_took_gives_way_to_a_random_private_one(tmp_path):
    (tmp_path / "jaxrun-cache-0").mkdir(mode=0o700)
    os.chown(tmp_path / "jaxrun-cache-0", OTHER, OTHER)
    folder, problem = contract.private_folder_in(str(tmp_path), "jaxrun-cache-0")
    assert problem == f"it belongs to uid {OTHER}" and folder.startswith(str(tmp_path / "jaxrun-cache-0-"))
    assert contract.ours_alone(folder)
    assert contract.private_folder_in(str(tmp_path), "jaxrun-cache-0") == (folder, problem)  # found again


@needs_root
def test_a_record_another_user_put_in_a_log_folder_is_never_read_back(tmp_path):
    """The guarded reader behind every log, record and marker read after a
    run believes this user's files alone."""
    record = tmp_path / "process-0.error.json"
    record.write_text('{"exc_type": "Planted"}')
    assert contract.read_small(str(record), 1 << 10) is not None
    os.chown(record, OTHER, OTHER)
    assert contract.read_small(str(record), 1 << 10) is None and contract.read_tail(str(record), 10) is None
