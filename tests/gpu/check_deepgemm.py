"""H200 check: DeepGEMM cubins built on the GPU-less box, served through DeepGEMM's own cache lookup.

Run from the repository root with .device/deepgemm/ made by tools/prepare_deepgemm_device.py:
    python3 tests/gpu/check_deepgemm.py --dir .device/deepgemm --json $OUT/check_deepgemm.json
For each bundled shape and M, fp8_gemm_nt (DeepGEMM's own entry point, vLLM's vendored 2.8.1) runs
on an output poisoned with NaN and is compared with a float32 torch reference of the same FP8
block-scaled product (1x128 activation scales, 128x128 weight scales), within DeepGEMM's own test
tolerance for FP8 x FP8 (calc_diff < 0.001: tests/generators.py QuantConfig.max_diff; calc_diff is
DeepGEMM's testing.numeric). The nvcc probe is answered in process and any compile command refused:
the check fails if DeepGEMM asked to compile anything or staged a compile. Device time is measured
with CUDA events against torch._scaled_mm on the same shapes (blockwise scales when this torch has
them, else tensorwise, said in the output).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import os
import sys

TOLERANCE = 0.001


def _import_loader(name: str):
    """The tree's module (the code under test; the wheel in .whl may be older), the wheel's if absent."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "loader", f"{name}.py")
    if not os.path.exists(path):
        return __import__(f"nojit.loader.{name}", fromlist=["*"])
    spec = importlib.util.spec_from_file_location(f"nojit.loader.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=".device/deepgemm")
    ap.add_argument("--json", default="")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    result: dict = {"ok": False, "cases": []}

    def finish(code: int) -> int:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)
        print("DEEPGEMM:", "PASS" if result["ok"] else "FAIL")
        return code

    with open(os.path.join(args.dir, "section.json")) as f:
        section = json.load(f)
    cache = _import_loader("deepgemm_cache")
    popen = _import_loader("deepgemm_popen")

    def read_blob(sha: str) -> bytes:
        with open(os.path.join(args.dir, "cubins", sha + ".cubin"), "rb") as f:
            return f.read()

    root = cache.seed(section, read_blob, args.dir, base=os.path.join("/tmp", "nojit-deepgemm-check"))
    stub = os.path.join(root, "bin", "nvcc")
    os.environ["DG_JIT_CACHE_DIR"] = root
    os.environ["DG_JIT_NVCC_COMPILER"] = stub
    if not os.path.isdir(os.environ.get("CUDA_HOME", "")):
        os.environ["CUDA_HOME"] = root

    import torch

    result["torch"] = torch.__version__
    result["torch_cuda"] = torch.version.cuda
    cudart = os.path.join(args.dir, "lib", "libcudart.so.13")
    if os.path.exists(cudart):
        ctypes.CDLL(cudart, mode=ctypes.RTLD_GLOBAL)  # the extension's NEEDED libcudart.so.13
    sys.path.insert(0, args.dir)
    try:
        import deep_gemm as dg
    except Exception as exc:  # noqa: BLE001 - the reason is the finding
        result["load_error"] = f"{type(exc).__name__}: {exc}"[:2000]
        print(f"DeepGEMM's extension does not load with torch {torch.__version__} (cuda {torch.version.cuda}):\n"
              f"  {result['load_error']}\n  -> this device needs the nojit-launcher route (TMA descriptors via "
              "cuTensorMapEncodeTiled) or vLLM's torch")
        return finish(1)
    try:  # DeepGEMM's key hashes its deep_gemm/ headers: without them every call fails inside deep_jit
        cache.check_headers(os.path.dirname(dg.__file__), args.dir)
    except cache.BundleMismatchError as exc:
        result["load_error"] = str(exc)
        print(f"{exc}\n  -> rerun tools/prepare_deepgemm_device.py --package-only (it copies include/deep_gemm)")
        return finish(1)
    from deep_gemm.testing.numeric import calc_diff
    from deep_gemm.utils.math import per_block_cast_to_fp8, per_token_cast_to_fp8

    so = [n for n in os.listdir(os.path.dirname(dg.__file__)) if n.startswith("_C_extension")][0]
    firewall = popen.PopenFirewall(nvcc=stub, version_text=section["nvcc_version"])
    firewall.install(os.path.join(os.path.dirname(dg.__file__), so))
    if not torch.cuda.is_available():
        print("no CUDA device: this check runs on the H200 (tests/gpu/device_run.sh deepgemm)")
        return finish(1)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if sms != section["sm_count"]:
        print(f"bundle built for {section['sm_count']} SMs, this GPU has {sms}")
        return finish(1)
    dg.set_pdl(bool(section.get("pdl", True)))
    dg.set_num_sms(section["sm_count"])
    use_ue8m0 = bool(section.get("use_ue8m0", True))

    shapes = sorted({(r[1], r[2], r[3]) for r in section["keys"] if r[1] in section.get("check_shapes", [r[1]])})
    ms = section.get("check_ms", [1, 31, 32, 64, 513, 4096, 8192])
    torch.manual_seed(0)
    ok = True
    os.access("/nojit-deepgemm-calls-begin", os.F_OK)  # markers for device_run.sh's exec trace
    for name, n, k in shapes:
        b_bf16 = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        b, sfb = per_block_cast_to_fp8(b_bf16, use_ue8m0=use_ue8m0)
        b_ref = (b.float().view(n // 128, 128, k // 128, 128) * sfb.view(n // 128, 1, k // 128, 1)).view(n, k)
        for m in ms:
            expected = cache.find_key(section, "fp8_gemm_nt", n, k, m)
            a_bf16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            a, sfa_rows = per_token_cast_to_fp8(a_bf16, use_ue8m0=use_ue8m0)
            aligned = (m + 3) // 4 * 4  # the MN-major TMA-aligned layout the build enumerated with
            sfa = torch.empty_strided((m, k // 128), (1, aligned), dtype=torch.float32, device="cuda")
            sfa.copy_(sfa_rows)
            a_ref = (a.float().view(m, k // 128, 128) * sfa_rows.view(m, k // 128, 1)).view(m, k)
            ref = a_ref @ b_ref.T
            d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            refused_before = len(firewall.refused)
            case = {"shape": name, "n": n, "k": k, "m": m, "entry": expected}
            try:
                dg.fp8_gemm_nt((a, sfa), (b, sfb), d, disable_ue8m0_cast=not use_ue8m0)
                torch.cuda.synchronize()
                diff = float(calc_diff(d, ref))
                case.update(diff=diff, nan=bool(torch.isnan(d).any()))
                case["ok"] = diff < TOLERANCE and not case["nan"] and len(firewall.refused) == refused_before
                case.update(_timing(dg, torch, a, sfa, b, sfb, d, use_ue8m0, args.iters))
            except RuntimeError as exc:
                case.update(ok=False, error=str(exc).splitlines()[0][:300])
            ok &= case["ok"]
            result["cases"].append(case)
            print(json.dumps(case))
    os.access("/nojit-deepgemm-calls-end", os.F_OK)
    staged = os.listdir(os.path.join(root, "tmp"))
    result.update(probe_answered=firewall.answered, refused=firewall.refused, staged_compiles=staged)
    result["ok"] = ok and not firewall.refused and not staged and firewall.answered <= 1
    print(f"probe answered {firewall.answered}x, compile commands refused {len(firewall.refused)}, "
          f"staged compiles {len(staged)}")
    return finish(0 if result["ok"] else 1)


def _timing(dg, torch, a, sfa, b, sfb, d, use_ue8m0: bool, iters: int) -> dict:
    def device_ms(fn) -> float:
        fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / iters

    out = {"deepgemm_ms": device_ms(lambda: dg.fp8_gemm_nt((a, sfa), (b, sfb), d, disable_ue8m0_cast=not use_ue8m0))}
    m, k = a.shape
    try:  # blockwise 1x128 x 128x128 scales, as the product above (torch >= 2.9 on sm_90)
        sa = sfa.contiguous().t().contiguous().t()
        sb = sfb.contiguous()
        fn = lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb.t(), out_dtype=torch.bfloat16)  # noqa: E731
        out["scaled_mm_ms"] = device_ms(fn)
        out["baseline"] = "torch._scaled_mm blockwise"
    except (RuntimeError, TypeError) as exc:
        one = torch.ones((), device="cuda")
        pad = (-m) % 16
        a16 = torch.nn.functional.pad(a.view(torch.uint8), (0, 0, 0, pad)).view(a.dtype) if pad else a
        fn = lambda: torch._scaled_mm(a16, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        out["scaled_mm_ms"] = device_ms(fn)
        out["baseline"] = f"torch._scaled_mm tensorwise (blockwise refused: {str(exc).splitlines()[0][:120]})"
    return out


if __name__ == "__main__":
    sys.exit(main())
