"""`nojit package`: the bundle wheel's bytes, metadata and RECORD, and how the loader finds it installed."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import os
import sys
import zipfile

import pytest

from tests.support.common import run_cli
from nojit.loader.bundle import installed as installed_bundles
from nojit.loader.errors import BundleCorruptError, BundleError
from nojit.loader.bundle.installed import file_sha256


@pytest.fixture
def wheel(small_build, tmp_path):
    run_cli("package", small_build["bundle"], "-o", str(tmp_path / "a"))
    run_cli("package", small_build["bundle"], "-o", str(tmp_path / "b"))
    (path,) = [os.path.join(tmp_path / "a", w) for w in os.listdir(tmp_path / "a")]
    return path


def test_wheel_is_deterministic_pinned_and_recorded(wheel, small_build):
    other = wheel.replace(os.sep + "a" + os.sep, os.sep + "b" + os.sep)
    assert open(wheel, "rb").read() == open(other, "rb").read()
    sha = file_sha256(small_build["bundle"])
    assert os.path.basename(wheel).endswith(f"-0.1.0+{sha[:12]}-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = zf.read(next(n for n in names if n.endswith("METADATA"))).decode()
        record = zf.read(next(n for n in names if n.endswith("RECORD"))).decode().splitlines()
        for line in record:
            name, digest, size = line.split(",")
            if name.endswith("RECORD"):
                continue
            data = zf.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        info = json.loads(zf.read(next(n for n in names if n.endswith("/bundle.json"))))
    assert info == {"file": "small.nojit", "sha256": sha}
    for dist in ("nojit", "vllm", "triton"):
        assert f"Requires-Dist: {dist}=={importlib.metadata.version(dist)}\n" in meta


def test_loader_finds_the_installed_wheel_and_checks_its_sha256(wheel, tmp_path, monkeypatch):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)  # what pip does with a pure wheel
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    found = installed_bundles.verified_installed_bundle()
    assert found is not None and found.path.startswith(str(site)) and found.distribution.startswith("nojit-bundle-")
    with open(found.path, "r+b") as f:  # one flipped byte
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(BundleCorruptError, match="sha256") as info:
        installed_bundles.verified_installed_bundle()
    assert "force-reinstall" in info.value.fix
    second = tmp_path / "second"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(second)
    for name in os.listdir(second):  # the same wheel under another distribution name (dist-info folder)
        if name.endswith(".dist-info"):
            os.rename(second / name, second / name.replace("nojit_bundle_", "nojit_bundle_other_", 1))
    monkeypatch.syspath_prepend(str(second))
    importlib.invalidate_caches()
    with pytest.raises(BundleError, match="2 bundle wheels are installed"):
        installed_bundles.default_installed_bundle()
    assert sys.path[0] == str(second)
