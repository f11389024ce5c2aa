"""Seeded caches under attack (tests/loader/strict/test_seeded_cache_attacks.py), in their own process.

`make OUT`: small real bundles, one per runtime that nojit seeds a cache for, written with the build's
own writer: FlashInfer (one JIT module .so and one TensorRT-LLM DeepGEMM cubin), Humming (one kernel
under this Humming's headers and NVRTC), DeepGEMM (one cache entry under this vLLM's DeepGEMM).

`run BUNDLE OUT.json`: what a serving process does: `install()` in strict mode (the loader's own install
path of the runtime), then, where it succeeded, each library's load by path: FlashInfer's module .so is
dlopen-ed from `<provider dir>/<m>/<m>.so` (what FlashInfer's get_aot_artifacts + tvm_ffi do), the
TensorRT-LLM and DeepGEMM cubins are read from where those libraries read them, and Humming's own
`make_humming_module` imports from its `tmp/module` folder. Between the two, NOJIT_TEST_ATTACK_AFTER
(a shell script) runs as the attacker (NOJIT_TEST_ATTACKER_UID): the swap after nojit's check.
NOJIT_TEST_DEFENCE_OFF=1 turns private_dir's checks into no-ops and lets its walks follow symlinks (the
positive control).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import subprocess
import sys

FI_MODULE = "sampling"
TRT_CUBIN = "gemm_swapAB_384_4096_nojit_test"
DG_ENTRY = "sm90_fp8_gemm_1d2d.0123456789abcdef"
HUMMING_KERNEL = "humming.nojit_test:SeedKernel"
MODULE_FUNC, MODULE_RESULT = "nojit_probe", 41  # what make_humming_module is asked for


def humming_module_name() -> str:
    """The file name Humming's make_humming_module writes and imports for (MODULE_FUNC, MODULE_RESULT)."""
    content = f"def {MODULE_FUNC}():\n    return {MODULE_RESULT}\n"
    return "humming_module_" + hashlib.md5(content.encode()).hexdigest()


def make(out: str, good_so: str) -> None:
    from nojit.aot.bundle_writer import write_bundle
    from nojit.loader.bundle.records.flashinfer import FlashInferLaunch
    from nojit.loader.bundle.records.humming import HummingLaunch
    from nojit.loader.bundle.manifest import DeepGemmLaunch, Entry, KernelRecord, Producer, Target
    from nojit.loader.bundle.versions import RuntimeVersions

    here = RuntimeVersions.of_this_process()
    producer = Producer("0.0.0", here.vllm, here.triton, here.tilelang, None, None, "3.11", None)
    target = Target("cuda", 90, "sm_90a", 32)
    so = open(good_so, "rb").read()
    cubin = b"\x7fELF nojit test cubin from the bundle"
    blobs = {hashlib.sha256(b).hexdigest(): b for b in (so, cubin)}
    so_sha, cubin_sha = hashlib.sha256(so).hexdigest(), hashlib.sha256(cubin).hexdigest()

    import importlib.metadata

    fi_info = {"flashinfer_version": importlib.metadata.version("flashinfer-python"), "cuda_arch": "sm90a"}
    kernels = [KernelRecord("flashinfer.jit.sampling:gen_sampling_module", "flashinfer", "0" * 64, (), fi_info),
               KernelRecord("flashinfer.gemm.gemm_base:fp8_blockscale_gemm_sm90", "flashinfer", "0" * 64, (), fi_info)]
    entries = [Entry(kernels[0].id, FI_MODULE, "exact", so_sha, FlashInferLaunch(FI_MODULE)),
               Entry(kernels[1].id, {"n": 384, "k": 4096}, "exact", cubin_sha,
                     FlashInferLaunch(TRT_CUBIN, "trtllm_deepgemm"))]
    write_bundle(os.path.join(out, "flashinfer.nojit"), producer, target, {}, kernels, entries, blobs)
    # the block-FP8 GEMM module without TensorRT-LLM cubins: TRTLLM_DG_CACHE_DIR stays the operator's (or nojit's
    # default beside the provider folder), where TensorRT-LLM's Compiler then looks for cubins
    gemm = KernelRecord("flashinfer.jit.gemm.fp8_blockscale:gen_fp8_blockscale_gemm_sm90_module", "flashinfer",
                        "0" * 64, (), fi_info)
    write_bundle(os.path.join(out, "flashinfer-gemm.nojit"), producer, target, {}, [gemm],
                 [Entry(gemm.id, "fp8_blockscale_gemm_90", "exact", so_sha, FlashInferLaunch("fp8_blockscale_gemm_90"))],
                 blobs)

    from humming.jit.compiler import NVRTCCompiler

    from nojit.loader.runtimes.humming import cache as humming_cache

    h_info = {"humming_version": importlib.metadata.version("humming-kernels"),
              "headers_digest": humming_cache.headers_digest(), "nvrtc": humming_cache.nvrtc_version(NVRTCCompiler)}
    record = KernelRecord(HUMMING_KERNEL, "humming", "0" * 64, (), h_info)
    launch = HummingLaunch("NVRTCCompiler", "90a", None, "// nojit test kernel\n", False, False, "seed_kernel")
    entry = Entry(HUMMING_KERNEL, {"class": HUMMING_KERNEL, "args": {"n": 1}}, "exact", cubin_sha, launch)
    write_bundle(os.path.join(out, "humming.nojit"), producer, target, {}, [record], [entry], blobs)

    import vllm.third_party.deep_gemm as dg

    from nojit.loader.runtimes.deepgemm.cache import headers_digest

    d_info = {"deep_gemm_version": dg.__version__, "nvcc_version": "Cuda compilation tools, release 13.0, V13.0.48",
              "sm_count": 132, "pdl": False, "use_ue8m0": False}
    record = KernelRecord("vllm.utils.deep_gemm:fp8_gemm_nt", "deepgemm", headers_digest(os.path.dirname(dg.__file__)),
                          (), d_info)
    entry = Entry(record.id, DG_ENTRY, "exact", cubin_sha, DeepGemmLaunch(DG_ENTRY, "// kernel.cu", ()))
    write_bundle(os.path.join(out, "deepgemm.nojit"), producer, target, {}, [record], [entry], blobs)
    print(json.dumps({"cubin_sha256": cubin_sha, "so_sha256": so_sha}))


def _defence_off() -> None:
    from nojit.loader import private_dir

    private_dir._NOFOLLOW = 0
    for name in ("_check_parent", "_check_own", "_check_file"):
        setattr(private_dir, name, lambda *a, **k: None)


def _attack_after() -> dict:
    script = os.environ.get("NOJIT_TEST_ATTACK_AFTER")
    if not script:
        return {}
    uid, gid = int(os.environ["NOJIT_TEST_ATTACKER_UID"]), int(os.environ["NOJIT_TEST_ATTACKER_GID"])
    p = subprocess.run(["/bin/sh", script], user=uid, group=gid, extra_groups=[], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", **{k: v for k, v in os.environ.items() if k.startswith("SEEDED_")}})
    return {"rc": p.returncode, "stderr": p.stderr[-2000:]}


def _read(path: str | None) -> str | None:
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as exc:
        return f"error: {exc.strerror}"


def run(bundle: str, out: str) -> None:
    if os.environ.get("NOJIT_TEST_DEFENCE_OFF") == "1":
        _defence_off()
    from nojit.loader.errors import NoJitError
    from nojit.loader.install import install

    result: dict = {}
    if os.path.basename(bundle).startswith("humming"):  # no GPU here: a stand-in H200 answers Humming's device facts
        from nojit.aot.runtimes.humming import standin

        standin.install("NVIDIA H200", (9, 0), 132)
    try:
        inst = install(bundle, mode=os.environ.get("NOJIT_TEST_MODE", "strict"))
    except NoJitError as exc:
        result.update(error=type(exc).__name__, message=str(exc))
        json.dump(result, open(out, "w"))
        return
    if inst.state("humming") is not None:
        import humming.jit.runtime  # noqa: F401 - seeds Humming's cache (humming_serving.activate)
    seeded = {}
    if inst.state("flashinfer") is not None:
        module = next(iter(inst.state("flashinfer").modules))
        seeded["SEEDED_FI_SO"] = os.path.join(inst.state("flashinfer").root, module, f"{module}.so")
        seeded["SEEDED_TRT_CUBIN"] = os.path.join(os.environ["TRTLLM_DG_CACHE_DIR"], "cache", TRT_CUBIN,
                                                  "nvcc_kernel.cubin")
    if inst.state("humming") is not None:
        seeded["SEEDED_HUMMING_CUBIN"] = inst.state("humming").seeded[0]
        seeded["SEEDED_HUMMING_MODULE_DIR"] = os.path.join(os.environ["HUMMING_TMP_DIR"], "module")
    if inst.state("deepgemm") is not None:
        seeded["SEEDED_DG_CUBIN"] = os.path.join(os.environ["DG_JIT_CACHE_DIR"], "cache", DG_ENTRY, "kernel.cubin")
    os.environ.update(seeded)
    result["seeded"] = seeded
    result["env"] = {k: os.environ.get(k) for k in ("TRTLLM_DG_CACHE_DIR", "HUMMING_CACHE_DIR", "HUMMING_TMP_DIR",
                                                    "DG_JIT_CACHE_DIR", "NOJIT_FLASHINFER_DIR")}
    result["attack"] = _attack_after()
    # the libraries' loads, by path, after the attacker had its chance
    if "SEEDED_FI_SO" in seeded:
        try:
            ctypes.CDLL(seeded["SEEDED_FI_SO"])
            result["fi_loaded"] = True
        except OSError as exc:
            result["fi_loaded"] = f"error: {exc}"
    result["trt_cubin"] = _read(seeded.get("SEEDED_TRT_CUBIN"))
    result["dg_cubin"] = _read(seeded.get("SEEDED_DG_CUBIN"))
    result["humming_cubin"] = _read(seeded.get("SEEDED_HUMMING_CUBIN"))
    if inst.state("humming") is not None:
        from humming.utils.jit import make_humming_module

        module = make_humming_module(MODULE_FUNC, MODULE_RESULT)
        result["humming_module"] = {"file": module.__file__, "value": getattr(module, MODULE_FUNC)()}
    if inst.policy.recorder is not None:  # the record file, written as record mode writes it
        inst.policy.recorder.record("probe:kernel", "probe", "key", "miss", "")
    from nojit.loader.strict import firewall

    firewall.log_event({"event": "probe"})  # the event log, written as strict mode writes it
    json.dump(result, open(out, "w"))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3])
    else:
        run(sys.argv[2], sys.argv[3])
