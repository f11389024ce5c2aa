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


def test_a_working_folder_of_slash_leaves_nothing_readable(tmp_path, monkeypatch):
    """A service started in "/" (systemd's default): every file is below it, so counting it as a folder where files
    are created left every copy (and compiler) readable. Control: the working folder above the copy is counted."""
    copy = _tree(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(unreadable.tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    monkeypatch.chdir("/")
    assert "/" not in unreadable.busy_folders()
    rules, denied, kept = unreadable.read_rules([str(copy)])
    assert denied == [str(copy)] and kept == [] and rules
    monkeypatch.chdir(tmp_path / "env")
    assert unreadable.read_rules([str(copy)])[1] == []  # control: a working folder above the copy keeps it readable


def test_the_driver_jit_library_is_found_in_ld_library_path_and_made_unreadable_on_request(tmp_path, monkeypatch):
    """loader/strict/driver_jit.py finds libnvidia-ptxjitcompiler where the driver's libraries live; its read rules are
    the builtins' (the Landlock side needs the driver: tests/gpu/test_inprocess_gpu.py)."""
    from nojit.loader.strict import driver_jit

    lib = tmp_path / "driver"
    lib.mkdir()
    (lib / "libnvidia-ptxjitcompiler.so.580.159.04").write_bytes(b"\x7fELF")
    (lib / "libnvidia-ptxjitcompiler.so.1").symlink_to("libnvidia-ptxjitcompiler.so.580.159.04")
    (lib / "libcuda.so.1").write_bytes(b"\x7fELF")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(lib))
    found = driver_jit.find()
    assert str(lib / "libnvidia-ptxjitcompiler.so.580.159.04") in found and len([f for f in found
                                                                                if f.startswith(str(lib))]) == 1
    monkeypatch.setattr(unreadable, "busy_folders", lambda: set())
    rules, denied, _ = unreadable.read_rules(found)
    assert str(lib / "libnvidia-ptxjitcompiler.so.580.159.04") in denied and str(lib / "libcuda.so.1") in rules
