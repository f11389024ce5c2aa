"""Strict mode's compiler scan of site-packages (loader/strict/compilers.py `_site_folders`): one walk finds the same
folders as the five glob patterns it replaced (_SITE_GLOBS, read with glob here as the reference), on a tree built
to hold every case (hidden folders, links, nvvm, _native, depth 5) and on this environment's own site-packages, and
lists each folder once."""

from __future__ import annotations

import glob
import os
import site

from nojit.loader.strict import compilers


def _by_glob(root: str) -> set[str]:
    return {p for pattern in compilers._SITE_GLOBS for p in glob.glob(os.path.join(root, pattern)) if os.path.isdir(p)}


def _tree(root) -> None:
    for d in ("a/bin", "a/b/bin", "a/b/c/bin", "a/b/nvvm/bin", "a/b/c/nvvm/bin", "a/_native/x", "a/_native/.h",
              ".hidden/bin", "a/.h/bin", "a/b/.h/bin", "a/b/c/d/bin", "p/q/r/s/t/bin", "n/_native/k/bin",
              "nvidia/cu13/bin", "nvidia/cuda_nvcc/nvvm/bin", "triton/backends/nvidia/bin"):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    open(os.path.join(root, "a", "_native", "file"), "w").close()
    open(os.path.join(root, "a", "b", "bin2"), "w").close()
    os.makedirs(os.path.join(root, "elsewhere", "bin"))
    os.symlink(os.path.join(root, "elsewhere"), os.path.join(root, "a", "linked"))  # a link to a folder: followed
    os.symlink(os.path.join(root, "nowhere"), os.path.join(root, "a", "dangling"))


def test_same_folders_as_the_globs_on_a_built_tree(tmp_path):
    _tree(tmp_path)
    found = compilers._site_folders(str(tmp_path))
    assert len(found) == len(set(found))
    assert set(found) == _by_glob(str(tmp_path))
    assert os.path.join(str(tmp_path), "a", "linked", "bin") in found  # the reference does follow the link


def test_same_folders_as_the_globs_on_this_environment():
    for s in {*compilers.site_packages(), *site.getsitepackages()}:
        if os.path.isdir(s):
            assert set(compilers._site_folders(s)) == _by_glob(s), s


def test_each_folder_listed_once(tmp_path, monkeypatch):
    _tree(tmp_path)
    listed: list[str] = []
    real = os.scandir

    def counting(path="."):
        listed.append(os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", counting)
    compilers._site_folders(str(tmp_path))
    assert len(listed) == len(set(listed))
    glob_listed: list[str] = []
    monkeypatch.setattr(os, "scandir", lambda path=".": (glob_listed.append(os.fspath(path)), real(path))[1])
    _by_glob(str(tmp_path))
    assert len(glob_listed) > 2 * len(listed)  # the positive control: the globs listed the tree several times
