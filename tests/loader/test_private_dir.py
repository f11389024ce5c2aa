"""loader/private_dir.py on its own, in process (the attacks through install() as a second user:
tests/loader/strict/test_seeded_cache_attacks.py)."""

from __future__ import annotations

import hashlib
import os

import pytest

from nojit.loader import private_dir
from nojit.loader.errors import UnsafePathError


def test_folders_are_made_private_and_files_replaced_atomically(tmp_path):
    with private_dir.open_private(str(tmp_path / "a" / "b")) as d:
        assert oct(os.stat(tmp_path / "a").st_mode & 0o777) == oct(os.stat(tmp_path / "a" / "b").st_mode & 0o777) == "0o700"
        assert d.sha256("f") is None
        assert d.write("f", b"one") == hashlib.sha256(b"one").hexdigest() == d.sha256("f")
        assert d.write("f", b"two") == d.sha256("f") == hashlib.sha256(b"two").hexdigest()
        assert sorted(os.listdir(d.path)) == ["f"]  # no temporary left behind
        assert oct(os.stat(os.path.join(d.path, "f")).st_mode & 0o777) == "0o444"


def test_a_symlink_anywhere_on_the_path_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    with pytest.raises(UnsafePathError, match=f"{tmp_path / 'link'}: is a symlink"):
        private_dir.open_private(str(tmp_path / "link" / "x"))
    assert os.listdir(tmp_path / "real") == []
    with private_dir.open_private(str(tmp_path / "real")) as d:
        os.symlink("/etc/hostname", os.path.join(d.path, "f"))
        with pytest.raises(UnsafePathError, match="is a symlink"):
            d.sha256("f")


def test_a_folder_others_can_write_is_refused_unless_a_sticky_parent(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    with pytest.raises(UnsafePathError, match="mode 777"):
        private_dir.open_private(str(loose))
    with pytest.raises(UnsafePathError, match="writable by other users"):
        private_dir.open_private(str(loose / "below"))
    os.chmod(loose, 0o1777)  # like /tmp: a parent, never the folder itself
    private_dir.open_private(str(loose / "below")).close()
    with pytest.raises(UnsafePathError, match="mode 1777"):
        private_dir.open_private(str(loose))


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_folder_or_file_of_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 4242, 4242)
    with pytest.raises(UnsafePathError, match="owned by user 4242"):
        private_dir.open_private(str(theirs))
    with pytest.raises(UnsafePathError, match="folder of user 4242"):
        private_dir.open_private(str(theirs / "x"))
    log = tmp_path / "log"
    log.write_text("")
    os.chown(log, 4242, 4242)
    with pytest.raises(UnsafePathError, match="owned by user 4242"):
        private_dir.append_line(str(log), b"x\n")


def test_append_refuses_symlinks_fifos_and_hard_links(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    os.symlink(victim, tmp_path / "link")
    with pytest.raises(UnsafePathError, match="is a symlink"):
        private_dir.append_line(str(tmp_path / "link"), b"x\n")
    os.link(victim, tmp_path / "hard")
    with pytest.raises(UnsafePathError, match="2 hard links"):
        private_dir.append_line(str(tmp_path / "hard"), b"x\n")
    assert victim.read_text() == "mine\n"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UnsafePathError, match="not a regular file"):  # and it does not hang
        private_dir.append_line(str(tmp_path / "fifo"), b"x\n")
    private_dir.append_line(str(tmp_path / "new" / "log"), b"x\n")  # created (O_EXCL), folder 0700
    private_dir.append_line(str(tmp_path / "new" / "log"), b"y\n")
    assert (tmp_path / "new" / "log").read_text() == "x\ny\n"


def test_positive_control_without_nofollow_the_symlink_is_followed(tmp_path, monkeypatch):
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    os.symlink(victim, tmp_path / "link")
    monkeypatch.setattr(private_dir, "_NOFOLLOW", 0)
    monkeypatch.setattr(private_dir, "_check_file", lambda *a, **k: None)
    private_dir.append_line(str(tmp_path / "link"), b"x\n")
    assert victim.read_text() == "mine\nx\n"
