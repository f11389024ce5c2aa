"""FlashInfer's CuTeDSL GDN prefill on the CPU box: its cached_compile keys planned with vLLM's and FlashInfer's own
code, compiled for sm_90a and exported, then found again by FlashInfer's own lookups in a strict-mode process that
compiles nothing (only the GPU launch is mocked: tests/probes/probe_fi_cute_loader.py). A key the bundle lacks is
refused with the key and the fix; with strict mode off, the same key goes to cute.compile (the positive control)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have, run_cli

pytestmark = pytest.mark.skipif(not (have("vllm") and have("cutlass") and have("flashinfer")),
                                reason="needs vLLM, FlashInfer and nvidia-cutlass-dsl")
QWEN = os.path.join(ROOT, "aot", "data", "qwen3.5-35b-a3b-fp8-h200.toml")
FULLY_FUSED = "_FullyFusedDeltaRuleSm90"  # the non-CP kernel (3+ sequences on the H200); its two keys keep the build short
LAYER = {"h": 16, "hv": 32, "k": 128, "v": 128, "dtype": "bfloat16", "state_dtype": "float32"}
NON_CP = [{**LAYER, "tokens": 255, "seqs": 3, "checkpoint_every": 0},
          {**LAYER, "tokens": 8192, "seqs": 16, "checkpoint_every": 1088}]
CP = {**LAYER, "tokens": 1024, "seqs": 1, "checkpoint_every": 0}  # 1 sequence x 32 heads: FlashInfer's CP route


@pytest.fixture(scope="module")
def gdn_build(tmp_path_factory):
    d = tmp_path_factory.mktemp("gdn")
    bundle, plan = str(d / "gdn.nojit"), str(d / "gdn.plan.json")
    run_cli("build", "--deployment", QWEN, "--runtime", "flashinfer_cute", "--kernels", FULLY_FUSED, "-o", bundle,
            "--emit-plan", plan, "--cache-dir", str(d / "cache"), "-j", "2", "--quiet")
    return {"bundle": bundle, "plan": plan}


def _probe(bundle: str, mode: str, calls: list[dict]) -> dict:
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "probes", "probe_fi_cute_loader.py"), bundle, mode,
                        json.dumps(calls)], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "NOJIT_QUIET": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_bundle_entries(gdn_build):
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.bundle.manifest import CuteLaunch

    b = Bundle.open(gdn_build["bundle"])
    try:
        entries = [e for e in b.manifest.entries if b.manifest.kernels[e.kernel].runtime == "flashinfer_cute"]
        assert len(entries) == 2  # with and without checkpoints
        assert sorted(dict(e.key[2])["needs_checkpointing"][1] for e in entries) == [False, True]
        for e in entries:
            assert e.kernel.endswith(":" + FULLY_FUSED) and e.key[1][0] == e.kernel
            assert isinstance(e.launch, CuteLaunch) and e.launch.options == "--enable-tvm-ffi"
            obj = b.read_blob(e.blob)
            assert obj[:4] == b"\x7fELF" and b"sm_90a" in obj
            # compiled for tensors on the GPU: the object's TVM-FFI argument check names the device type it takes
            # (built from CPU example tensors it took only CPU tensors; the H200 refused every call)
            assert b"expected device_type=cuda" in obj and b"expected device_type=cpu" not in obj
        info = b.manifest.kernels[entries[0].kernel].info
        assert info["flashinfer-python"] and info["nvidia-cutlass-dsl"] and info["sources"][0].endswith("delta_rule_sm90")
    finally:
        b.close()


def test_strict_serves_flashinfers_lookups_from_the_bundle_and_refuses_a_missing_key(gdn_build):
    out = _probe(gdn_build["bundle"], "strict", [*NON_CP, CP])
    served, refused = out["results"][:2], out["results"][2]
    for r in served:  # FlashInfer's own wrapper looked the key up, got the bundled function, and called it
        assert "raised" not in r, r
        assert [x["kernel"] for x in r["launched"]] == [FULLY_FUSED] and r["launched"][0]["args"] == 23, r
    assert out["loaded_types"] == ["tvm_ffi.core.Function"] * 2  # cute.runtime.load_module of each object, once
    assert out["cache_is_nojit"] and out["compiles"] == [] and out["compile_attempts"] == []
    # The CP route's first kernel is not in this bundle: refused with the key and the fix, nothing compiled
    assert refused["raised"] == "KernelNotInBundleError", refused
    assert "CPDeltaRuleTPrecomputeSm90(dtype=BFloat16" in refused["message"]
    assert "--runtime flashinfer_cute" in refused["fix"] and "--gdn-prefill-backend triton" in refused["fix"]
    assert out["counts"]["CPDeltaRuleTPrecomputeSm90/miss"] == 1


def test_permissive_lets_flashinfer_compile_the_missing_key(gdn_build):
    """The positive control: with strict mode off, the key the strict run refused goes to cute.compile (stopped by
    the probe's counter), while the bundled one is still served."""
    out = _probe(gdn_build["bundle"], "permissive", [NON_CP[0], CP])
    assert out["preloaded"] == 2 and len(out["loaded_types"]) == 2  # preload loaded both objects, the lookup reused one
    assert [x["kernel"] for x in out["results"][0]["launched"]] == [FULLY_FUSED]
    assert out["results"][1]["raised"] == "WouldCompile" and out["compiles"] == ["CPDeltaRuleTPrecomputeSm90"]


def test_strict_guard_refuses_cute_compile_with_options():
    """FlashInfer calls `cute.compile[options](...)`: with the bundle's runtime absent, strict mode's CuTeDSL guard
    must refuse that form with CompileForbiddenError (before: the guard was a function, and subscripting it raised
    TypeError)."""
    code = (
        "import cutlass.cute as cute\n"
        "from nojit.loader.strict import guards\n"
        "from nojit.loader.errors import CompileForbiddenError\n"
        "guards.install_strict_guards()\n"
        "try:\n    cute.compile[(cute.GPUArch('sm_90a'),)](lambda: None)\n"
        "except CompileForbiddenError as e:\n    print('REFUSED', e.message)\n"
        "guards.deactivate()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert "REFUSED strict mode: CuTeDSL (cutlass.cute.compile)" in p.stdout, p.stderr[-2000:]


def test_install_refuses_a_record_made_with_other_tools_other_sources_or_a_list_without_its_own_module(gdn_build,
                                                                                                    monkeypatch):
    """The record's checks before anything of it is served (session 9's review: removing them passed every test).
    Each tampered record is refused with BundleMismatchError naming what differs; the record as built installs
    (control). FlashInfer's cache module is a stand-in here: only the checks are under test."""
    import dataclasses
    import types
    from types import SimpleNamespace

    from nojit.loader.bundle.file import Bundle
    from nojit.loader.errors import BundleMismatchError
    from nojit.loader.policy import ServingPolicy
    from nojit.loader.runtimes.flashinfer_cute import serving
    from nojit.loader.settings import Mode

    stand_in = types.ModuleType("nojit_test_fi_cache")
    stand_in._in_mem_compile_cache = {}
    monkeypatch.setitem(sys.modules, stand_in.__name__, stand_in)
    monkeypatch.setattr(serving, "CACHE_MODULE", stand_in.__name__)
    b = Bundle.open(gdn_build["bundle"])
    kid = next(k for k, r in b.index.kernels.items() if r.runtime == "flashinfer_cute")
    record = b.index.kernels[kid]
    sources = record.info["sources"]

    def install_with(rec):
        fake = SimpleNamespace(path=b.path, index=SimpleNamespace(kernels={kid: rec}), entries=lambda k: ())
        return serving.install(fake, [kid], ServingPolicy(Mode.STRICT, b.path), frozenset())

    tampered = {
        "flashinfer-python 0.0.1": dataclasses.replace(record, info={**record.info, "flashinfer-python": "0.0.1"}),
        "nvidia-cutlass-dsl 0.0.1": dataclasses.replace(record, info={**record.info, "nvidia-cutlass-dsl": "0.0.1"}),
        "source changed": dataclasses.replace(record, source_hash="0" * 64),
        "not the kernel's own module": dataclasses.replace(record, info={**record.info,
                                                                        "sources": [*sources[1:], sources[0]]}),
    }
    for words, rec in tampered.items():
        with pytest.raises(BundleMismatchError) as e:
            install_with(rec)
        assert words in e.value.message, (words, e.value.message)
    cache = install_with(record)  # control: the record as built passes every check
    assert stand_in._in_mem_compile_cache is cache
    serving.uninstall(cache)
    assert stand_in._in_mem_compile_cache == {}
    b.close()
