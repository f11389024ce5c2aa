"""H200 check: DeepGEMM cubins built on the GPU-less box, served through DeepGEMM's own cache lookup.

Run from the repository root with .device/deepgemm/ made by tools/prepare_deepgemm_device.py:
    python3 tests/gpu/checks/check_deepgemm.py --dir .device/deepgemm --json $OUT/check_deepgemm.json
For each checked shape and M (section["check_rows"]), DeepGEMM's own entry point (vLLM's vendored
2.8.1) runs on an output poisoned with NaN: fp8_gemm_nt and fp8_einsum (o_proj's "bhr,hdr->bhd") are
compared with a float32 torch reference of the same FP8 block-scaled product (1x128 activation scales,
128x128 weight scales) within DeepGEMM's own test tolerance for FP8 x FP8 (calc_diff < 0.001:
tests/generators.py QuantConfig.max_diff, tests/test_einsum.py), tf32_hc_prenorm_gemm (mHC, vLLM's split
count for that M) with torch's TF32 product within DeepGEMM's tests/test_hyperconnection.py bound
(calc_diff < 1e-8; the diff against a strict float32 product is reported too). The sparse-attention
indexer's ops run as vLLM calls them on sm90: fp8_fp4_mqa_logits (prefill: two requests in one chunk, compressed
logits) and fp8_fp4_paged_mqa_logits at next_n 1 and 2 on a schedule made by the bundled
get_paged_mqa_logits_metadata (K cache in a block-outermost pool, shuffled block table), compared with DeepGEMM's
tests/test_attention.py formula in float32 on the same FP8 inputs (calc_diff < 5e-6, its ref_diff_tol), their
outputs allocated on memory just filled with NaN. calc_diff is DeepGEMM's testing.numeric. The nvcc probe is
answered in process and any compile command refused: the check fails if DeepGEMM asked to compile anything or staged a compile. Device time is measured
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

TOLERANCE = 0.001  # FP8 x FP8: DeepGEMM's tests/generators.py max_diff and tests/test_einsum.py
HC_TOLERANCE = 1e-8  # DeepGEMM's tests/test_hyperconnection.py, against a TF32 torch product
# DeepGEMM's tests/test_attention.py for FP8 MQA logits (FP32 weights and logits): calc_diff < 5e-6 (ref_diff_tol)
# against the float32 logits of the same (dequantized) FP8 inputs: the case's pass criterion. The test's other
# bound, < 1e-3 against the unquantized inputs, measures the FP8 cast more than the kernel (an exact product of
# the cast operands lands at 5e-4 .. 1.1e-3 on a few rows), so that diff is reported, not required.
LOGITS_SIM_TOLERANCE = 5e-6
LOGITS_TOLERANCE = 1e-3
# calc_diff is global (one wrong logit among thousands moves it by ~1e-8), so each valid logit is held too: its
# error against the same float32 reference within this share of the largest logit (nojit's bound, not DeepGEMM's)
LOGITS_MAX_ERR = 5e-3
MS = [1, 31, 32, 64, 513, 4096, 8192]


def _import_loader(name: str):
    """The tree's module (the code under test; the wheel in .whl may be older), the wheel's if absent."""
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "loader", *name.split(".")[:-1], f"{name.split('.')[-1]}.py")
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
    cache = _import_loader("runtimes.deepgemm.cache")
    popen = _import_loader("runtimes.deepgemm.popen")

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

    rows = section.get("check_rows") or [  # older sections: fp8_gemm_nt shapes only
        {"op": "fp8_gemm_nt", "name": name, "n": n, "k": k, "groups": 1, "ms": section.get("check_ms", MS)}
        for name, n, k in sorted({(r[1], r[2], r[3]) for r in section["keys"] if r[0] == "fp8_gemm_nt"
                                  and r[1] in section.get("check_shapes", [r[1]])})]
    torch.manual_seed(0)
    ok = True
    ops = {"fp8_gemm_nt": _gemm_case, "fp8_einsum": _einsum_case, "tf32_hc_prenorm_gemm": _hc_case,
           "fp8_fp4_mqa_logits": _mqa_logits_case, "fp8_fp4_paged_mqa_logits": _paged_mqa_logits_case,
           "get_paged_mqa_logits_metadata": _paged_mqa_logits_case}
    os.access("/nojit-deepgemm-calls-begin", os.F_OK)  # markers for device_run.sh's exec trace
    guard_before = _guard_processes()
    for row in rows:
        for i, m in enumerate(row["ms"]):
            expected = cache.find_key(section, row["op"], row["n"], row["k"], m, row["name"])
            refused_before = len(firewall.refused)
            case = {"op": row["op"], "shape": row["name"], "n": row["n"], "k": row["k"], "m": m, "entry": expected}
            try:
                case.update(ops[row["op"]](dg, torch, row, m, i, use_ue8m0, args.iters))
                case["ok"] = case["ok"] and len(firewall.refused) == refused_before and expected is not None
            except Exception as exc:  # noqa: BLE001 - a refused or failing case is reported, the others still run
                case.update(ok=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
            ok &= case["ok"]
            result["cases"].append(case)
            print(json.dumps(case))
    os.access("/nojit-deepgemm-calls-end", os.F_OK)
    processes = None if guard_before is None else _guard_processes() - guard_before
    staged = os.listdir(os.path.join(root, "tmp"))
    result.update(probe_answered=firewall.answered, refused=firewall.refused, staged_compiles=staged,
                  guard_processes=processes)
    guard_missing = processes is None and os.environ.get("NOJIT_REQUIRE_GUARD") == "1"  # else 0 would be vacuous
    result["ok"] = (ok and not firewall.refused and not staged and firewall.answered <= 1 and not processes
                    and not guard_missing)
    if processes is not None:
        print(f"processes started while DeepGEMM ran (the preloaded C guard, between the check's markers): {processes}")
    elif guard_missing:
        print("the process guard is not loaded (NOJIT_REQUIRE_GUARD=1: LD_PRELOAD=libnojit_exec_guard.so expected)")
    print(f"probe answered {firewall.answered}x, compile commands refused {len(firewall.refused)}, "
          f"staged compiles {len(staged)}")
    return finish(0 if result["ok"] else 1)


def _guard_processes() -> int | None:
    """Processes started from C so far (fork, exec, spawn, popen, system), counted by tests/gpu/checks/exec_guard.c when
    it is preloaded (device_run.sh, where the device has no strace); None without it."""
    lib = ctypes.CDLL(None)
    try:
        lib.nojit_guard_processes.restype = ctypes.c_long
    except AttributeError:
        return None
    return int(lib.nojit_guard_processes())


def _device_ms(torch, fn, iters: int) -> float:
    fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters


def _gemm_case(dg, torch, row: dict, m: int, i: int, use_ue8m0: bool, iters: int) -> dict:
    """fp8_gemm_nt as vLLM calls it: 1x128 activation scales (MN-major, TMA-aligned), 128x128 weight scales."""
    from deep_gemm.testing.numeric import calc_diff
    from deep_gemm.utils.math import per_block_cast_to_fp8, per_token_cast_to_fp8

    n, k = row["n"], row["k"]
    b, sfb = per_block_cast_to_fp8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), use_ue8m0=use_ue8m0)
    b_ref = (b.float().view(n // 128, 128, k // 128, 128) * sfb.view(n // 128, 1, k // 128, 1)).view(n, k)
    a, sfa_rows = per_token_cast_to_fp8(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), use_ue8m0=use_ue8m0)
    aligned = (m + 3) // 4 * 4  # the MN-major TMA-aligned layout the build enumerated with
    sfa = torch.empty_strided((m, k // 128), (1, aligned), dtype=torch.float32, device="cuda")
    sfa.copy_(sfa_rows)
    a_ref = (a.float().view(m, k // 128, 128) * sfa_rows.view(m, k // 128, 1)).view(m, k)
    ref = a_ref @ b_ref.T
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    dg.fp8_gemm_nt((a, sfa), (b, sfb), d, disable_ue8m0_cast=not use_ue8m0)
    torch.cuda.synchronize()
    out = {"diff": float(calc_diff(d, ref)), "nan": bool(torch.isnan(d).any())}
    out["ok"] = out["diff"] < TOLERANCE and not out["nan"]
    out.update(_timing(dg, torch, a, sfa, b, sfb, d, use_ue8m0, iters))
    return out


def _einsum_case(dg, torch, row: dict, m: int, i: int, use_ue8m0: bool, iters: int) -> dict:
    """o_proj's fp8_einsum("bhr,hdr->bhd") with the layouts fused_inv_rope_fp8_quant writes on sm90 (x [G, T, r]
    transposed, its FP32 scales MN-major TMA-aligned), recipe (1, 128, 128); reference: float32 per group."""
    from deep_gemm.testing.numeric import calc_diff
    from deep_gemm.utils.math import per_block_cast_to_fp8, per_token_cast_to_fp8

    g, d_out, r = row["groups"], row["n"], row["k"]
    inner, aligned = r // 128, (m + 3) // 4 * 4
    x_rows, sx_rows = per_token_cast_to_fp8(torch.randn(g * m, r, device="cuda", dtype=torch.bfloat16),
                                            use_ue8m0=use_ue8m0)  # rows = (group, token)
    x = x_rows.view(g, m, r).transpose(0, 1)
    sx = torch.empty(g * inner * aligned, dtype=torch.float32, device="cuda").as_strided(
        (g, m, inner), (inner * aligned, 1, aligned))
    sx.copy_(sx_rows.view(g, m, inner))
    sx = sx.transpose(0, 1)
    w = torch.empty(g, d_out, r, dtype=torch.float8_e4m3fn, device="cuda")
    sw = torch.empty(g, d_out // 128, inner, dtype=torch.float32, device="cuda")
    for h in range(g):
        w[h], sw[h] = per_block_cast_to_fp8(torch.randn(d_out, r, device="cuda", dtype=torch.bfloat16),
                                            use_ue8m0=use_ue8m0)
    x_ref = (x_rows.float().view(g, m, inner, 128) * sx_rows.view(g, m, inner, 1)).view(g, m, r)
    w_ref = (w.float().view(g, d_out // 128, 128, inner, 128) * sw.view(g, d_out // 128, 1, inner, 1)).view(g, d_out, r)
    ref = torch.bmm(x_ref, w_ref.transpose(1, 2)).transpose(0, 1)  # [T, G, d]
    z = torch.full((m, g, d_out), float("nan"), device="cuda", dtype=torch.bfloat16)
    dg.fp8_einsum("bhr,hdr->bhd", (x, sx), (w, sw), z, recipe=(1, 128, 128))
    torch.cuda.synchronize()
    out = {"diff": float(calc_diff(z, ref)), "nan": bool(torch.isnan(z).any()), "groups": g}
    out["ok"] = out["diff"] < TOLERANCE and not out["nan"]
    out["deepgemm_ms"] = _device_ms(torch, lambda: dg.fp8_einsum("bhr,hdr->bhd", (x, sx), (w, sw), z,
                                                                 recipe=(1, 128, 128)), iters)
    xb, wb = x_ref.to(torch.bfloat16), w_ref.to(torch.bfloat16)
    out["baseline_ms"] = _device_ms(torch, lambda: torch.bmm(xb, wb.transpose(1, 2)), iters)
    out["baseline"] = "cuBLAS bf16 bmm (torch.bmm) of the dequantized operands"
    return out


def _hc_case(dg, torch, row: dict, m: int, i: int, use_ue8m0: bool, iters: int) -> dict:
    """mHC's tf32_hc_prenorm_gemm with vLLM's split count for this M: out.sum(0) = x.float() @ fn.T and
    sqrsum.sum(0) = sum(x.float()^2), against torch's TF32 product as DeepGEMM's own test does."""
    from deep_gemm.testing.numeric import calc_diff

    n, k, splits = row["n"], row["k"], row["splits"][i]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    fn = torch.randn(n, k, device="cuda", dtype=torch.float32)
    d = torch.full((splits, m, n), float("nan"), device="cuda", dtype=torch.float32)
    s = torch.full((splits, m), float("nan"), device="cuda", dtype=torch.float32)
    dg.tf32_hc_prenorm_gemm(x, fn, d, s, num_splits=splits)
    torch.cuda.synchronize()
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        # cuBLAS answers a product of very few rows with a GEMV that does not use TF32 (run 2 of session 4: M = 1
        # matched the float32 product, not the TF32 one): the reference is taken on at least 64 rows, the first
        # m of which are x (rows of a product are independent), so it is always cuBLAS's TF32 GEMM
        pad = torch.randn(max(0, 64 - m), k, device="cuda", dtype=torch.bfloat16)
        ref_d = (torch.cat([x, pad]).float() @ fn.T)[:m]
        ref_s = x.float().square().sum(-1)
        diff = max(float(calc_diff(d.sum(0), ref_d)), float(calc_diff(s.sum(0), ref_s)))
        out = {"diff": diff, "splits": splits, "nan": bool(torch.isnan(d).any() or torch.isnan(s).any())}
        torch.backends.cuda.matmul.allow_tf32 = False
        out["diff_fp32_reference"] = float(calc_diff(d.sum(0), x.float() @ fn.T))  # informational
        torch.backends.cuda.matmul.allow_tf32 = True
        out["ok"] = diff < HC_TOLERANCE and not out["nan"]
        out["deepgemm_ms"] = _device_ms(torch, lambda: dg.tf32_hc_prenorm_gemm(x, fn, d, s, num_splits=splits), iters)
        xf = x.float()
        out["baseline_ms"] = _device_ms(torch, lambda: xf @ fn.T, iters)
        out["baseline"] = "cuBLAS TF32 matmul (x.float() @ fn.T, without the square-sum)"
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return out


def _poisoned(torch, fn):
    """Run fn (an op that allocates its own output) on memory that was just filled with NaN: a same-sized block
    of the caching allocator is filled and freed first, so the op's torch::empty gets it back. Returns (output,
    whether it landed on the poisoned block)."""
    probe = fn()
    nbytes = probe.untyped_storage().nbytes()
    del probe
    torch.cuda.synchronize()
    poison = torch.full((nbytes // 4,), float("nan"), device="cuda", dtype=torch.float32)
    where = poison.data_ptr()
    del poison
    out = fn()
    torch.cuda.synchronize()
    return out, out.untyped_storage().data_ptr() == where


def _fp8_rows(torch, x):
    """Per-row FP8 with one FP32 scale per row (the indexer K cache's layout: 128 values + a 4-byte scale per token),
    cast as DeepGEMM's tests/test_attention.py casts K (amax / 448, per_custom_dims_cast_to_fp8 and
    kv_cache_cast_to_fp8), so its 1e-3 bound against the unquantized product applies as it was set."""
    sf = x.abs().float().amax(-1, keepdim=True).clamp(1e-4) / 448.0
    return (x.float() / sf).to(torch.float8_e4m3fn), sf.squeeze(-1).contiguous()


def _logits_ref(torch, q, k, w):
    """DeepGEMM's tests/test_attention.py formula: logits[m, n] = sum_h relu(q[m, h] . k[n]) * w[m, h], in float32,
    chunked over n; q [M, H, D], k [N, D], w [M, H]."""
    m, h, _ = q.shape
    out = torch.empty(m, k.shape[0], device="cuda", dtype=torch.float32)
    chunk = max(1, (256 << 20) // max(1, m * h * 4))
    for n0 in range(0, k.shape[0], chunk):
        score = torch.einsum("mhd,nd->hmn", q, k[n0:n0 + chunk])
        out[:, n0:n0 + chunk] = torch.einsum("hmn,mh->mn", score.relu(), w)
    return out


def _max_err_rel(torch, got, ref) -> float:
    """The largest error of one logit, as a share of the largest logit (both already zero off the valid range)."""
    return float((got - ref).abs().max() / ref.abs().max().clamp(min=1e-30))


def _mqa_logits_case(dg, torch, row: dict, m: int, i: int, use_ue8m0: bool, iters: int) -> dict:
    """sparse_attn_indexer.py's prefill call on sm90: Q [M, H, D] FP8 without scales (vLLM folds them into the
    weights), the chunk's gathered K [N, D] FP8 with FP32 scales [N], weights [M, H] FP32, and per row its K range
    [ks, ke): two requests in one chunk (rows of the second start at the first's K length, causal ends), compressed
    logits (max_seqlen_k = the longest range). Checked: every row's valid columns."""
    from deep_gemm.testing.numeric import calc_diff

    h, dim = row["n"], row["k"]
    first = m // 2  # rows of request A; the rest are request B's
    prefix_a, prefix_b = 300, 777
    len_a = prefix_a + first
    kv_len = len_a + prefix_b + (m - first)
    rows = torch.arange(m, device="cuda", dtype=torch.int32)
    in_b = rows >= first
    ks = torch.where(in_b, len_a, 0).to(torch.int32)
    ke = torch.where(in_b, len_a + prefix_b + (rows - first) + 1, prefix_a + rows + 1).to(torch.int32)
    max_k = int((ke - ks).max())
    q_bf = torch.randn(m, h, dim, device="cuda", dtype=torch.bfloat16)
    kv_bf = torch.randn(kv_len, dim, device="cuda", dtype=torch.bfloat16)
    weights = torch.randn(m, h, device="cuda", dtype=torch.float32)
    q = q_bf.to(torch.float8_e4m3fn)
    kv, kv_sf = _fp8_rows(torch, kv_bf)
    call = lambda: dg.fp8_fp4_mqa_logits((q, None), (kv, kv_sf), weights, ks, ke, max_k)  # noqa: E731
    logits, poisoned = _poisoned(torch, call)
    cols = torch.arange(max_k, device="cuda")
    valid = cols[None, :] < (ke - ks)[:, None]
    index = (ks[:, None] + cols[None, :]).clamp(max=kv_len - 1).long()
    sim = _logits_ref(torch, q.float(), kv.float() * kv_sf[:, None], weights).gather(1, index)
    ref = _logits_ref(torch, q_bf.float(), kv_bf.float(), weights).gather(1, index)
    got = logits.float().masked_fill(~valid, 0)
    out = {"diff": float(calc_diff(got, ref.masked_fill(~valid, 0))),
           "sim_diff": float(calc_diff(got, sim.masked_fill(~valid, 0))),
           "nan": bool(torch.isnan(logits.float()[valid]).any()), "poisoned": poisoned, "kv_len": kv_len,
           "shape": list(logits.shape)}
    out["max_err_rel"] = _max_err_rel(torch, got, sim.masked_fill(~valid, 0))
    out["ok"] = (out["sim_diff"] < LOGITS_SIM_TOLERANCE and out["max_err_rel"] < LOGITS_MAX_ERR and not out["nan"]
                 and list(logits.shape) == [m, max_k])
    out["diff_within_1e-3"] = out["diff"] < LOGITS_TOLERANCE
    out["deepgemm_ms"] = _device_ms(torch, call, iters)
    if m * h * kv_len * 2 <= 8 << 30:
        qb, kb = q_bf.view(m * h, dim), kv_bf
        out["baseline_ms"] = _device_ms(torch, lambda: qb @ kb.T, iters)
        out["baseline"] = "cuBLAS bf16 GEMM of the same product (Q [M*H, D] @ K.T), without ReLU and head sum"
    return out


def _paged_mqa_logits_case(dg, torch, row: dict, m: int, i: int, use_ue8m0: bool, iters: int) -> dict:
    """A decode step of batch M as sparse_attn_indexer.py:880 runs it on sm90, the schedule made by
    get_paged_mqa_logits_metadata first (indexer.py:1747, vLLM's slot count): Q [M, next_n, H, D] FP8, the K cache
    [blocks, block_kv, 1, D + 4] uint8 viewed from a block-outermost pool (stride(0) larger than one block),
    context_lens [M, next_n] = L - next_n + j + 1, a shuffled block table, logits [M * next_n, max_model_len]."""
    from deep_gemm.testing.numeric import calc_diff

    next_n, block_kv = row["next_n"], row["block_kv"]
    paged = row["op"] == "fp8_fp4_paged_mqa_logits"  # else the schedule metadata's row: N = next_n, K = block_kv
    h, dim = (row["n"], row["k"]) if paged else (row["heads"], row["head_dim"])
    max_context = row["max_context_len"] if paged else 8192
    lens = torch.randint(next_n, 4096, (m,), device="cuda", dtype=torch.int32)
    lens[0] = min(max_context, 20000)
    blocks = (lens + block_kv - 1) // block_kv
    total = int(blocks.sum())
    width = block_kv * (dim + 4)
    pool = torch.zeros(total + 3, width + 512, device="cuda", dtype=torch.uint8)  # other layers' bytes between blocks
    values_bf = torch.randn(total, block_kv, dim, device="cuda", dtype=torch.bfloat16)
    values, scales = _fp8_rows(torch, values_bf.view(-1, dim))
    pool[:total, :block_kv * dim] = values.view(total, block_kv * dim).view(torch.uint8)
    pool[:total, block_kv * dim:width] = scales.view(total, block_kv).view(torch.uint8)
    kv_cache = pool.as_strided((total, block_kv, 1, dim + 4), (width + 512, dim + 4, dim + 4, 1))
    order = torch.randperm(total, device="cuda", dtype=torch.int32)
    max_blocks = int(blocks.max())
    table = torch.zeros(m, max_blocks, device="cuda", dtype=torch.int32)
    starts = [0] + torch.cumsum(blocks, 0).tolist()
    for b in range(m):
        table[b, :int(blocks[b])] = order[starts[b]:starts[b + 1]]
    j = torch.arange(next_n, device="cuda", dtype=torch.int32)
    context = (lens[:, None] - next_n + 1 + j[None, :]).clamp(min=0).to(torch.int32).contiguous()
    q_bf = torch.randn(m, next_n, h, dim, device="cuda", dtype=torch.bfloat16)
    q = q_bf.to(torch.float8_e4m3fn)
    weights = torch.randn(m * next_n, h, device="cuda", dtype=torch.float32)
    schedule = dg.get_paged_mqa_logits_metadata(context, block_kv, row["num_slots"])
    call = lambda: dg.fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context, table, schedule,  # noqa: E731
                                               max_context)
    logits, poisoned = _poisoned(torch, call)
    k_deq = values.float().view(total, block_kv, dim) * scales.view(total, block_kv, 1)
    k_raw = values_bf.float()
    ref = torch.zeros(m * next_n, int(lens.max()), device="cuda")
    sim = torch.zeros_like(ref)
    for b in range(m):  # each request's K in token order through its block table
        n = int(lens[b])
        ids = table[b, :int(blocks[b])].long()
        rows_b = slice(b * next_n, (b + 1) * next_n)
        for out_ref, qq, kk in ((sim, q.float(), k_deq), (ref, q_bf.float(), k_raw)):
            out_ref[rows_b, :n] = _logits_ref(torch, qq[b], kk[ids].reshape(-1, dim)[:n], weights[rows_b])
    cols = torch.arange(ref.shape[1], device="cuda")
    valid = cols[None, :] < context.view(-1)[:, None]
    got = logits[:, :ref.shape[1]].float().masked_fill(~valid, 0)
    out = {"diff": float(calc_diff(got, ref.masked_fill(~valid, 0))),
           "sim_diff": float(calc_diff(got, sim.masked_fill(~valid, 0))),
           "nan": bool(torch.isnan(logits[:, :ref.shape[1]].float()[valid]).any()), "poisoned": poisoned,
           "next_n": next_n, "schedule": list(schedule.shape), "max_len": int(lens.max())}
    out["max_err_rel"] = _max_err_rel(torch, got, sim.masked_fill(~valid, 0))
    out["ok"] = (out["sim_diff"] < LOGITS_SIM_TOLERANCE and out["max_err_rel"] < LOGITS_MAX_ERR and not out["nan"]
                 and list(logits.shape) == [m * next_n, max_context])
    out["diff_within_1e-3"] = out["diff"] < LOGITS_TOLERANCE
    out["deepgemm_ms"] = _device_ms(torch, call, iters)
    width_k = int(lens.max())
    if m * width_k * dim * 2 <= 4 << 30:
        kg = torch.zeros(m, width_k, dim, device="cuda", dtype=torch.bfloat16)
        qg = q_bf.view(m, next_n * h, dim)
        out["baseline_ms"] = _device_ms(torch, lambda: torch.bmm(qg, kg.transpose(1, 2)), iters)
        out["baseline"] = "cuBLAS bf16 bmm of the same product over the padded batch, without ReLU and head sum"
    return out


def _timing(dg, torch, a, sfa, b, sfb, d, use_ue8m0: bool, iters: int) -> dict:
    def device_ms(fn) -> float:
        return _device_ms(torch, fn, iters)

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
