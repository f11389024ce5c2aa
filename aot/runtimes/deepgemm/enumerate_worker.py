"""Runs inside the fake-device process (see enumerate.py): calls DeepGEMM's own op entry points with
meta tensors for every shape and M, so DeepGEMM's own heuristics pick the configuration and its own
code generator writes the kernel source; the stand-ins record what it asked for.

Input (argv[1]): JSON {"ops": [{"op": "fp8_gemm_nt", "name", "n", "k", "ms": [..]}], "num_sms": int,
"pdl": bool, "out": path}. Output: JSON lines {"op", "name", "n", "k", "m", "entry"} where entry is the cache
directory name DeepGEMM looked up (`<kernel>.<digest>`), read from the driver stand-in's log.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    spec = json.loads(open(sys.argv[1]).read())
    import torch
    import vllm.envs as envs

    firewall = None
    if spec.get("install"):  # before DeepGEMM is imported, as vLLM's plugin runs before the model
        from nojit.loader.install import install  # the lookup check: the loader's own install(), strict mode

        inst = install(spec["install"], mode="strict")
        firewall = inst.state("deepgemm").firewall
        with open(spec["out"] + ".install.json", "w") as f:
            json.dump({"cache_dir": inst.state("deepgemm").cache_dir, "DG_JIT_NVCC_COMPILER": os.environ["DG_JIT_NVCC_COMPILER"],
                       "DG_JIT_CACHE_DIR": os.environ["DG_JIT_CACHE_DIR"], "PATH": os.environ["PATH"]}, f)
    import vllm.third_party.deep_gemm as dg

    if spec.get("firewall"):  # serve from a seeded cache, probe answered in process
        from nojit.loader.runtimes.deepgemm.popen import PopenFirewall
        from nojit.loader.runtimes.deepgemm.serving import extension_path

        firewall = PopenFirewall(nvcc=spec["firewall"]["nvcc"], version_text=spec["firewall"]["version_text"])
        firewall.install(extension_path(dg))
    dg.set_pdl(spec["pdl"])  # vllm/utils/deep_gemm.py: _apply_pdl(_dg, True) when the platform supports PDL
    dg.set_num_sms(spec["num_sms"])
    use_ue8m0 = bool(envs.VLLM_USE_DEEP_GEMM_E8M0)  # vllm/utils/deep_gemm.py:138 fp8_gemm_nt's cast flag
    cuda = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)
    log_path = os.environ["NOJIT_DG_LOG"]
    open(log_path, "w").close()  # events of an earlier run in this folder would shift the library numbering
    log = open(log_path)
    libraries: dict[int, str] = {}
    library_paths: dict[int, str] = {}
    last_fn = None

    def drain() -> None:
        nonlocal last_fn
        for line in log:
            ev = json.loads(line)
            if ev["ev"] == "load":
                fn = 0x1000 + len(libraries) + 1  # fake_libcuda.c: library handles count from 1, kernel = 0x1000 + handle
                libraries[fn] = os.path.basename(os.path.dirname(ev["path"]))
                library_paths[fn] = ev["path"]
            elif ev["ev"] == "launch":
                last_fn = ev["fn"]

    call = {"fp8_gemm_nt": _fp8_gemm_nt, "fp8_einsum": _fp8_einsum, "tf32_hc_prenorm_gemm": _tf32_hc_prenorm_gemm,
            "fp8_fp4_mqa_logits": _fp8_fp4_mqa_logits, "fp8_fp4_paged_mqa_logits": _fp8_fp4_paged_mqa_logits,
            "get_paged_mqa_logits_metadata": _get_paged_mqa_logits_metadata}
    os.access("/nojit-deepgemm-calls-begin", os.F_OK)  # a marker for an exec trace
    with open(spec["out"], "w") as out:
        for op in spec["ops"]:
            n, k = op["n"], op["k"]
            for i, m in enumerate(op["ms"]):
                last_fn, error = None, None
                try:
                    call[op["op"]](torch, cuda, op, m, i, use_ue8m0)
                except RuntimeError as exc:
                    if firewall is None:
                        raise
                    error = str(exc).splitlines()[0][:300]
                drain()
                entry = libraries.get(last_fn) if last_fn is not None else None
                out.write(json.dumps({"op": op["op"], "name": op["name"], "n": n, "k": k, "m": m,
                                      "entry": entry, "library": library_paths.get(last_fn), "error": error}) + "\n")

    os.access("/nojit-deepgemm-calls-end", os.F_OK)
    if firewall is not None:
        with open(spec["out"] + ".firewall.json", "w") as f:
            json.dump({"answered": firewall.answered, "refused": firewall.refused}, f)


# One call per (op row, M), with the tensors vLLM passes (meta tensors: DeepGEMM reads shapes, strides, dtypes).
def _fp8_gemm_nt(torch, cuda, op: dict, m: int, i: int, use_ue8m0: bool) -> None:
    """vllm/utils/deep_gemm.py fp8_gemm_nt: A [M, K] FP8 with 1x128 FP32 scales (TMA-aligned MN-major),
    B [N, K] FP8 with 128x128 scales, D [M, N] BF16."""
    n, k = op["n"], op["k"]
    b = torch.empty(n, k, dtype=torch.float8_e4m3fn, device="meta")
    sfb = torch.empty((n + 127) // 128, (k + 127) // 128, dtype=torch.float32, device="meta")
    a = torch.empty(m, k, dtype=torch.float8_e4m3fn, device="meta")
    aligned = (m + 3) // 4 * 4  # DeepGEMM's TMA-aligned MN-major SF layout (utils/layout)
    sfa = torch.empty_strided((m, (k + 127) // 128), (1, aligned), dtype=torch.float32, device="meta")
    d = torch.empty(m, n, dtype=torch.bfloat16, device="meta")
    torch.ops.deep_gemm.fp8_fp4_gemm_nt.default.redispatch(
        cuda, a, sfa, b, sfb, d, None, None, None, None, "nk", not use_ue8m0, None, 0, None, None)


def _fp8_einsum(torch, cuda, op: dict, m: int, i: int, use_ue8m0: bool) -> None:
    """models/deepseek_v4/nvidia/ops/o_proj.py deep_gemm_fp8_o_proj on sm90: fp8_einsum("bhr,hdr->bhd",
    (x, sx), (wo_a [G, d, r], 128x128 scales), z [T, G, d], recipe (1, 128, 128)); x and sx as
    fused_inv_rope_fp8_quant lays them out ([G, T, r] and MN-major TMA-aligned FP32 scales, transposed)."""
    g, d_out, r = op["groups"], op["n"], op["k"]
    aligned = (m + 3) // 4 * 4
    x = torch.empty(g, m, r, dtype=torch.float8_e4m3fn, device="meta").transpose(0, 1)
    inner = r // 128
    sx = torch.empty(g * inner * aligned, dtype=torch.float32, device="meta").as_strided(
        (g, m, inner), (inner * aligned, 1, aligned)).transpose(0, 1)
    w = torch.empty(g, d_out, r, dtype=torch.float8_e4m3fn, device="meta")
    sw = torch.empty(g, d_out // 128, inner, dtype=torch.float32, device="meta")
    z = torch.empty(m, g, d_out, dtype=torch.bfloat16, device="meta")
    torch.ops.deep_gemm.fp8_einsum.default.redispatch(cuda, "bhr,hdr->bhd", x, sx, w, sw, z, None, [1, 128, 128],
                                                      None, False, 0, None, None)


def _tf32_hc_prenorm_gemm(torch, cuda, op: dict, m: int, i: int, use_ue8m0: bool) -> None:
    """model_executor/kernels/mhc/tilelang.py: x [T, K] BF16, fn [N, K] FP32, out [splits, T, N] and
    sqrsum [splits, T] FP32; the split count per M is vLLM's own (computed by the planner, op["splits"])."""
    n, k, splits = op["n"], op["k"], op["splits"][i]
    x = torch.empty(m, k, dtype=torch.bfloat16, device="meta")
    fn = torch.empty(n, k, dtype=torch.float32, device="meta")
    out = torch.empty(splits, m, n, dtype=torch.float32, device="meta")
    sqrsum = torch.empty(splits, m, dtype=torch.float32, device="meta")
    torch.ops.deep_gemm.tf32_hc_prenorm_gemm.default.redispatch(cuda, x, fn, out, sqrsum, splits)


def _fp8_fp4_mqa_logits(torch, cuda, op: dict, m: int, i: int, use_ue8m0: bool) -> None:
    """model_executor/layers/sparse_attn_indexer.py:728 on sm90 (FP8 K cache, no MX scales): q [M, H, D] FP8 with
    no scale (folded into the weights), K [M, D] FP8 with FP32 scales [M], weights [M, H] FP32, K ranges [M]
    int32, max_seqlen_k = M (the chunk's own K rows)."""
    h, dim = op["n"], op["k"]
    q = torch.empty(m, h, dim, dtype=torch.float8_e4m3fn, device="meta")
    kv = torch.empty(m, dim, dtype=torch.float8_e4m3fn, device="meta")
    kv_sf = torch.empty(m, dtype=torch.float32, device="meta")
    weights = torch.empty(m, h, dtype=torch.float32, device="meta")
    ks, ke = (torch.empty(m, dtype=torch.int32, device="meta") for _ in range(2))
    torch.ops.deep_gemm.fp8_fp4_mqa_logits.default.redispatch(cuda, q, None, kv, kv_sf, weights, ks, ke, m, None)


def _fp8_fp4_paged_mqa_logits(torch, cuda, op: dict, m: int, i: int, use_ue8m0: bool) -> None:
    """sparse_attn_indexer.py:880 on sm90, a decode step of batch M: q [M, next_n, H, D] FP8 (no scale), the K
    cache viewed as [blocks, block_kv, 1, D + 4] uint8 (kv_cache_as_quant_view), weights [M * next_n, H] FP32,
    context_lens [M, next_n] int32 (vLLM always passes 2D), one block table row per request, the schedule
    metadata [slots + 1, 2] int32, max_model_len = the indexer's (max_model_len // ratio)."""
    h, dim, next_n, block_kv = op["n"], op["k"], op["next_n"], op["block_kv"]
    max_blocks = -(-op["max_context_len"] // block_kv)
    q = torch.empty(m, next_n, h, dim, dtype=torch.float8_e4m3fn, device="meta")
    kv_cache = torch.empty(m * max_blocks, block_kv, 1, dim + 4, dtype=torch.uint8, device="meta")
    weights = torch.empty(m * next_n, h, dtype=torch.float32, device="meta")
    context_lens = torch.empty(m, next_n, dtype=torch.int32, device="meta")
    block_table = torch.empty(m, max_blocks, dtype=torch.int32, device="meta")
    schedule = torch.empty(op["num_slots"] + 1, 2, dtype=torch.int32, device="meta")
    torch.ops.deep_gemm.fp8_fp4_paged_mqa_logits.default.redispatch(
        cuda, q, None, kv_cache, weights, context_lens, block_table, schedule, op["max_context_len"], None)


def _get_paged_mqa_logits_metadata(torch, cuda, op: dict, m: int, i: int, use_ue8m0: bool) -> None:
    """v1/attention/backends/mla/indexer.py:1747 through vllm/utils/deep_gemm.py get_paged_mqa_logits_metadata:
    context_lens [M, next_n] int32, block_kv = the cache's states per block, the scheduler slots vLLM computes."""
    context_lens = torch.empty(m, op["next_n"], dtype=torch.int32, device="meta")
    torch.ops.deep_gemm.get_paged_mqa_logits_metadata.default.redispatch(
        cuda, context_lens, op["block_kv"], op["num_slots"], None)


if __name__ == "__main__":
    main()
