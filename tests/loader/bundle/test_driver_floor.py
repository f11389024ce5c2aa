"""The driver floor: derived from what the bundle records, checked at install against cuDriverGetVersion.

The driver is a stand-in library (tests/support/fake_gpu.py) reporting a chosen version; the check itself is the
real one. Expected floors come from NVIDIA's CUDA Compatibility guide ("CUDA 13.x >= 580, CUDA 12.x >= 525"),
not from the module's table.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from tests.support.fake_gpu import fake_libcuda
from nojit.loader.bundle import driver_floor
from nojit.loader.bundle.driver_floor import DriverTooOldError, bundle_floors, check_driver, parse_toolkit


@pytest.mark.parametrize("text,expected", [
    ("12.9.86", (12, 9)), ("V13.0.88 (cuda_13.0.r13.0/compiler.36424714_0)", (13, 0)), ("nvrtc+13.0", (13, 0)),
    ("Cuda compilation tools, release 13.0, V13.0.88", (13, 0)), ("13.0.88", (13, 0)), ("", None), (None, None),
    ("unknown", None), ("3.8.0", None),
])
def test_recorded_toolkit_versions_parse(text, expected):
    assert parse_toolkit(text) == expected


def _index(ptxas="12.9.86", humming="nvrtc+13.0"):
    kernels = {
        "t": SimpleNamespace(runtime="triton", info={}),
        "h": SimpleNamespace(runtime="humming", info={"nvrtc": humming}),
        "d": SimpleNamespace(runtime="deepgemm", info={"nvcc_version": "13.0.88"}),
        "c": SimpleNamespace(runtime="cutedsl", info={}),
    }
    return SimpleNamespace(kernels=kernels, producer=SimpleNamespace(ptxas=ptxas, nvcc="13.0.88"))


def test_floors_follow_minor_version_compatibility():
    floors = {f.runtime: f for f in bundle_floors(_index())}
    assert floors["triton"].cuda == 12000 and floors["triton"].driver.startswith("525.")
    assert floors["humming"].cuda == 13000 and floors["humming"].driver.startswith("580.")
    assert floors["deepgemm"].cuda == 13000
    assert floors["cutedsl"].toolkit is None and floors["cutedsl"].cuda == 0  # not recorded: reported, not guessed


def test_old_driver_refused_in_strict_mode_warned_in_permissive(tmp_path, monkeypatch):
    monkeypatch.setattr(driver_floor, "LIBCUDA", fake_libcuda(tmp_path, driver=12080))  # a 570 driver: CUDA 12.8
    with pytest.raises(DriverTooOldError) as err:
        check_driver(_index(), "b.nojit", strict=True, warn=lambda _: None)
    text = str(err.value)
    assert "CUDA 12.8" in text and "CUDA 13.0" in text and "humming" in text and "deepgemm" in text
    assert "triton" not in err.value.message  # ptxas 12.9 cubins load on a 12.8 driver (same major)
    assert "upgrade the NVIDIA driver to >= 580." in err.value.fix and "rebuild the bundle" in err.value.fix
    warned: list[str] = []
    assert check_driver(_index(), "b.nojit", strict=False, warn=warned.append) == 12080
    assert len(warned) == 2 and all("fail at first load" in w for w in warned)
    # positive control: the same bundle on a CUDA 13.0 driver passes
    monkeypatch.setattr(driver_floor, "LIBCUDA", fake_libcuda(tmp_path, driver=13000))
    assert check_driver(_index(), "b.nojit", strict=True, warn=warned.append) == 13000 and len(warned) == 2


def test_no_driver_is_one_line_and_no_refusal(tmp_path, monkeypatch):
    monkeypatch.setattr(driver_floor, "LIBCUDA", str(tmp_path / "absent.so"))
    notes: list[str] = []
    assert check_driver(_index(), "b.nojit", strict=True, warn=pytest.fail, note=notes.append) is None
    assert len(notes) == 1 and "not checked" in notes[0]


def test_install_refuses_a_bundle_the_driver_cannot_load(small_build, tmp_path, monkeypatch, caplog):
    """install() itself: a Triton bundle (ptxas 12.x cubins) on a CUDA 11.8 driver."""
    from nojit.loader.install import install

    monkeypatch.setattr(driver_floor, "LIBCUDA", fake_libcuda(tmp_path, driver=11080))
    with pytest.raises(DriverTooOldError, match=r"CUDA 11\.8"):
        install(small_build["bundle"], mode="strict")
    with caplog.at_level(logging.WARNING, logger="nojit"):
        inst = install(small_build["bundle"], mode="permissive")
    try:
        assert any("triton: cubins from Triton's ptxas" in r.getMessage() for r in caplog.records)
    finally:
        inst.uninstall()
    monkeypatch.setattr(driver_floor, "LIBCUDA", fake_libcuda(tmp_path, driver=12020))  # control: a 535 driver
    install(small_build["bundle"], mode="strict").uninstall()


def test_first_launch_wants_exactly_the_bundles_arch():
    """install()'s device check: the capability, then every arch a runtime recorded."""
    from nojit.loader.errors import BundleMismatchError
    from nojit.loader.install import check_exact_arch

    def index(flashinfer_arch):
        kernels = {"f": SimpleNamespace(runtime="flashinfer", info={"cuda_arch": flashinfer_arch})}
        return SimpleNamespace(kernels=kernels, target=SimpleNamespace(arch="sm_90a", capability=90))

    check_exact_arch(index("sm90a"), "b.nojit", (9, 0), frozenset())  # control: all sm_90a on a 9.0 GPU
    with pytest.raises(BundleMismatchError, match="compute capability 10.0"):
        check_exact_arch(index("sm90a"), "b.nojit", (10, 0), frozenset())
    with pytest.raises(BundleMismatchError, match="flashinfer recorded sm_90, not the bundle's target sm_90a"):
        check_exact_arch(index("sm90"), "b.nojit", (9, 0), frozenset())
    check_exact_arch(index("sm90"), "b.nojit", (9, 0), frozenset({"arch"}))  # NOJIT_ALLOW_MISMATCH=arch
