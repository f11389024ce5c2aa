"""`nojit doctor` on the CPU box: the GPU facts come from a stand-in driver library (tests/support/fake_gpu.py);
everything else (package versions, folders, the firewall's runtime folder, Landlock, which JITs are
installed) is this machine's own. Each case: the finding, its fix and the exit code.

The bundles hold kernel records only (the doctor reads the index, never an entry), written with the
build's own writer, so no compile is needed.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from tests.support.common import run_cli
from tests.support.fake_gpu import fake_libcuda
from nojit.aot.bundle_writer import write_bundle
from nojit.aot.target import TARGET
from nojit.loader.bundle import driver_floor
from nojit.loader.doctor import FAIL, OK, diagnose
from nojit.loader.bundle.manifest import KernelRecord, Producer
from nojit.loader.unserved import _reachable, jits
from nojit.loader.bundle.versions import installed_version


def _records() -> list[KernelRecord]:
    """One kernel record per runtime whose JIT is installed here, with what its build records (this box's versions)."""
    nvrtc = installed_version("nvidia-cuda-nvrtc") or "13.0"
    info = {
        "triton": {}, "tilelang": {"nvcc_version": "V13.0.88 (cuda_13.0.r13.0/compiler.36424714_0)",
                                   "nvcc_flags": ["-gencode", "arch=compute_90a,code=sm_90a"]},
        "deepgemm": {"nvcc_version": "13.0.88"},
        "cutedsl": {d: installed_version(d) for d in ("nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels")},
        "flashinfer_cute": {d: installed_version(d) for d in ("nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels",
                                                               "flashinfer-python")},
        "flashinfer": {"flashinfer_version": installed_version("flashinfer-python"), "cuda_arch": "sm90a",
                       "nvcc": "Cuda compilation tools, release 13.0, V13.0.88"},
        "humming": {"humming_version": installed_version("humming-kernels"),
                    "nvrtc": "nvrtc+" + ".".join(nvrtc.split(".")[:2])},
    }
    runtimes = [j.runtime for j in jits() if _reachable(j)]
    return [KernelRecord(f"vllm.fake_{rt}:kernel", rt, "0" * 64, (), {k: v for k, v in info[rt].items() if v})
            for rt in runtimes]


def _bundle(path, records=None, **producer) -> str:
    p = Producer(nojit="0.0.test", vllm=installed_version("vllm"), triton=installed_version("triton"),
                 tilelang=installed_version("tilelang"), ptxas="12.9.86", nvcc="13.0.88", python="3.11",
                 torch=installed_version("torch"),
                 toolchain={"nvcc": {"--version": {"stdout": "Cuda compilation tools, release 13.0, V13.0.88\n",
                                                   "stderr": ""}}})
    write_bundle(str(path), replace(p, **producer), TARGET, {"name": "doctor-test"}, records or _records(), [], {})
    return str(path)


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """A private runtime folder and seed folders of this user; a healthy H200 on a CUDA 13.0 driver."""
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    for var in ("NOJIT_DEEPGEMM_DIR", "NOJIT_FLASHINFER_DIR", "NOJIT_HUMMING_DIR"):
        monkeypatch.setenv(var, str(run / var.lower()))
    for var in ("NOJIT_BUNDLE", "NOJIT_BUNDLE_SHA256"):
        monkeypatch.delenv(var, raising=False)

    def gpu(**facts):
        monkeypatch.setattr(driver_floor, "LIBCUDA", fake_libcuda(tmp_path, **facts))

    gpu()
    return gpu


def _failing(report):
    return [f for f in report.findings if f.status == FAIL]


def test_healthy_machine_serves(tmp_path, machine):
    report = diagnose(_bundle(tmp_path / "b.nojit"))
    assert _failing(report) == [] and report.exit_code == 0, report.table()
    areas = {f.area for f in report.findings if f.status == OK}
    assert {"bundle", "architecture", "driver", "versions", "firewall", "JIT"} <= areas
    assert "NVIDIA H200, compute capability 9.0 = the bundle's sm_90a" in report.table()
    assert report.table().endswith("serving will work here")


def test_old_driver(tmp_path, machine):
    machine(driver=12080)  # a 570 driver: CUDA 12.8
    report = diagnose(_bundle(tmp_path / "b.nojit"))
    driver = [f for f in _failing(report) if f.area == "driver"]
    assert driver and all("this driver supports CUDA 12.8" in f.what for f in driver)
    assert {f.what.split(":")[0] for f in driver} >= {"deepgemm"}  # nvcc 13.0 cubins
    assert all("upgrade the NVIDIA driver to >= 580.65.06" in f.fix for f in driver)
    assert not [f for f in report.findings if f.area == "driver" and f.what.startswith("triton") and f.status == FAIL]
    assert report.exit_code == 1


def test_wrong_architecture(tmp_path, machine):
    machine(capability=(10, 0), name="NVIDIA B200")
    report = diagnose(_bundle(tmp_path / "b.nojit"))
    (arch,) = [f for f in _failing(report) if f.area == "architecture"]
    assert "holds sm_90a cubins; this GPU is compute capability 10.0" in arch.what
    assert "build a bundle for this GPU" in arch.fix and report.exit_code == 1


def test_a_runtime_recorded_for_another_arch(tmp_path, machine):
    records = [KernelRecord("vllm.fake:fi", "flashinfer", "0" * 64, (), {"cuda_arch": "sm90"})]
    report = diagnose(_bundle(tmp_path / "b.nojit", records))
    (arch,) = [f for f in _failing(report) if f.area == "architecture"]
    assert "flashinfer recorded sm_90, not the bundle's target sm_90a" in arch.what


def test_non_private_seed_folder(tmp_path, machine, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone could put a kernel there
    monkeypatch.setenv("NOJIT_FLASHINFER_DIR", str(shared))
    records = [KernelRecord("vllm.fake:fi", "flashinfer", "0" * 64, (),
                            {"flashinfer_version": installed_version("flashinfer-python") or "0", "cuda_arch": "sm90a"})]
    report = diagnose(_bundle(tmp_path / "b.nojit", records))
    (seed,) = [f for f in _failing(report) if f.area == "seed: flashinfer"]
    assert "writable by others (mode 777)" in seed.what and "set NOJIT_FLASHINFER_DIR" in seed.fix
    assert report.exit_code == 1
    shared.chmod(0o700)  # control: the same folder made private passes
    assert not [f for f in _failing(diagnose(_bundle(tmp_path / "b.nojit", records))) if f.area.startswith("seed")]


def test_version_mismatch(tmp_path, machine):
    report = diagnose(_bundle(tmp_path / "b.nojit", vllm="0.32.0", triton="3.5.1"))
    failing = {f.what.split(":")[0]: f for f in _failing(report) if f.area == "versions"}
    assert "bundle built from 0.32.0" in failing["vllm"].what and "install vllm==0.32.0" in failing["vllm"].fix
    assert "install triton==3.5.1" in failing["triton"].fix
    assert report.exit_code == 1


def test_no_gpu_says_so_and_checks_the_rest(tmp_path, machine, monkeypatch):
    monkeypatch.setattr(driver_floor, "LIBCUDA", str(tmp_path / "no-libcuda.so"))
    report = diagnose(_bundle(tmp_path / "b.nojit", vllm="0.32.0"))
    (gpu,) = [f for f in report.findings if f.area == "GPU"]
    assert gpu.status == FAIL and "no NVIDIA driver" in gpu.what and "serving machine" in gpu.fix
    assert any(f.area == "driver" and f.status == "skip" for f in report.findings)
    assert any(f.area == "versions" and f.status == FAIL for f in report.findings)  # the rest is still checked


def test_cli_json_on_this_box(tmp_path, machine):
    """The command itself, in its own process (this box's real driver facts: none)."""
    p = run_cli("doctor", _bundle(tmp_path / "b.nojit"), "--json", check=False,
                env={"XDG_RUNTIME_DIR": os.environ["XDG_RUNTIME_DIR"]})
    data = json.loads(p.stdout)
    assert p.returncode == data["exit_code"] and data["bundle"].endswith("b.nojit")
    gpu = [f for f in data["findings"] if f["area"] in ("GPU", "architecture")]
    assert gpu and all(f["fix"] or f["status"] == OK for f in data["findings"] if f["status"] == FAIL)


def test_each_runtimes_recorded_packages_and_libraries_are_compared(tmp_path, machine):
    """Every package a runtime's provenance names (loader/bundle/provenance.py), recorded at another version, is a
    FAIL naming the runtime and the package; so is Humming's NVRTC and DeepGEMM's vLLM (session 9's review: with
    only vLLM and Triton tested, emptying a runtime's provenance passed the suite). Control: test_healthy_machine."""
    from nojit.loader.bundle.manifest import RUNTIMES

    records = []
    for r in _records():
        packages = RUNTIMES[r.runtime].provenance.packages
        info = {**r.info, **{field: "0.0.1" for field, _dist in packages}}
        if RUNTIMES[r.runtime].provenance.library:
            info[RUNTIMES[r.runtime].provenance.library[0]] = "nvrtc+11.1"
        records.append(replace(r, info=info))
    report = diagnose(_bundle(tmp_path / "b.nojit", records, vllm="0.32.0"))
    failing = [f.what for f in _failing(report)]
    for r in records:
        p = RUNTIMES[r.runtime].provenance
        for _field, dist in p.packages:
            assert any(w.startswith(f"{r.runtime}: bundle built with {dist} 0.0.1") for w in failing), (r.runtime, dist)
        if p.library:
            assert any(w.startswith(f"{r.runtime}'s kernels were built with nvrtc+11.1") for w in failing), failing
        if p.vendored_in:
            assert any(w.startswith(f"{r.runtime}: vendored in vllm 0.32.0") for w in failing), failing
    assert {r.runtime for r in records if RUNTIMES[r.runtime].provenance.packages} >= {"cutedsl", "flashinfer", "humming"}
