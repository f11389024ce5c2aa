"""loader/strict/nvrtc_builtins.py's search and loader/strict/unreadable.py's read rules: "everything but the builtins"
as Landlock can say it, one rule per entry of each folder above a copy other than the path down to it; a copy below a
folder where a serving process creates things is left readable and said so. The Landlock side (a child that cannot
compile) is in test_redteam.py."""

from __future__ import annotations

import os

from nojit.loader.strict import nvrtc_builtins, unreadable


def _tree(tmp_path):
    lib = tmp_path / "env" / "nvidia" / "cu13" / "lib"
    lib.mkdir(parents=True)
    for name in ("libnvrtc-builtins.so.13.0", "libnvrtc.so.13", "libcublas.so.13"):
        (lib / name).write_bytes(b"\x7fELF")
    (tmp_path / "env" / "six.py").write_text("")
    (tmp_path / "env" / "torch").mkdir()
    (lib / "link.so").symlink_to(lib / "libnvrtc-builtins.so.13.0")
    return lib / "libnvrtc-builtins.so.13.0"


def test_every_entry_above_the_copy_but_the_path_to_it_gets_a_read_rule(tmp_path, monkeypatch):
    copy = _tree(tmp_path)
    monkeypatch.setattr(unreadable, "busy_folders", lambda: set())
    rules, denied, kept = unreadable.read_rules([str(copy)])
    assert denied == [str(copy)] and kept == []
    lib = copy.parent
    assert {str(lib / "libnvrtc.so.13"), str(lib / "libcublas.so.13"), str(tmp_path / "env" / "six.py"),
            str(tmp_path / "env" / "torch")} <= set(rules)
    above = {str(p) for p in copy.parents}
    assert not above & set(rules) and str(copy) not in rules  # no rule covers the copy
    assert str(lib / "link.so") not in rules  # a link is read where it points
    assert "/usr" in rules or not os.path.isdir("/usr")  # siblings at the root too


def test_a_copy_below_a_folder_where_files_are_created_is_left_readable(tmp_path, monkeypatch):
    copy = _tree(tmp_path)
    monkeypatch.setattr(unreadable, "busy_folders", lambda: {str(tmp_path / "env")})
    rules, denied, kept = unreadable.read_rules([str(copy)])
    assert rules == [] and denied == [] and kept and str(tmp_path / "env") in kept[0]


def test_copies_are_found_in_ld_library_path(tmp_path, monkeypatch):
    copy = _tree(tmp_path)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(copy.parent))
    assert str(copy) in nvrtc_builtins.find()
