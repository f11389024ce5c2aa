"""Humming's MoE GEMM kernels on the H200, launched by Humming itself with the kernels served from the bundle.

Humming is carried in `.device-hg/` (tools/prepare_humming_device.py: the installed humming-kernels package, its
dependency wheels, the bundle, and the arguments of vLLM's first-forward calls into Humming for the deployment).
This process is a serving process in nojit's strict mode: `nojit.loader.install` seeds Humming's cache from the
bundle (loader/runtimes/humming/serving.py) and guards Humming's compile step; every arrival at the compile step is counted
here, and every process start is recorded by an audit hook. Both must stay at 0.

Per GEMM (w13: N=1024 K=4096, w2: N=4096 K=512; 256 experts, MXFP4 weights x block-FP8 activations, indexed
routing with top-k 6) and per token count (chosen so that M = tokens * top_k falls in different intervals of
vLLM's tuning table, that is different bundled kernels):
  * weights in the checkpoint's MXFP4 layout (uint8 e2m1 pairs, e8m0 scales per 32), random, converted and
    repacked by Humming's own code as vLLM does (Mxfp4WeightSchema.convert_humming, then
    prepare_and_transform_humming_tensors); its two weight-transform kernels are served from the bundle, so they
    compile nothing;
  * activations quantized to FP8 E4M3 with float32 scales per 128 (what vLLM's prepare step hands the experts);
  * routing aligned to the kernel's block size (vLLM's moe_align_block_size layout: Humming's test helper);
  * Humming's own launch: `humming.ops.humming_gemm` with vLLM's layer config, compute config and tuning table
    (prepare_kernels -> launch_kernel through Humming's precompiled launcher), outputs NaN-poisoned first;
  * reference: both operands dequantized in torch (e2m1 table x 2^(e8m0 - 127); FP8 x scale), matmul in float64,
    rounded to bf16; a kernel without stream-K is compared with Humming's own GEMM test tolerance
    (humming/testing/runner.py KernelTestCase: rtol 0.01, atol 0.05); a stream-K kernel, whose slices are reduced
    in bf16 in a run-dependent order, with a per-element bound derived from that reduction and the accumulation
    (stream_k_close, "stream-K rule" below);
  * a control: the same output against the reference of a different expert routing (one token: every expert id
    moved by one) must NOT match.

    python tests/gpu/checks/check_humming_gemm.py --dir .device-hg [--json OUT] [--tokens 1,4,64,200,300,435,500] [--dry-run]

--dry-run (no GPU): a stand-in H200 answers Humming's device questions and the launcher registration is counted;
checks the carried calls, the intervals the token counts reach, the seeding (0 compiles, 0 processes) and the
reference dequantization against Humming's own CPU-side decoding where it has one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

PROCESSES: list[str] = []
AT_IMPORT: list[str] = []  # processes started while importing Humming's dependencies, before any kernel work


def _audit(event: str, args: object) -> None:
    if event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.system", "os.fork", "os.forkpty"):
        where = [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}" for f in traceback.extract_stack()[-14:-1]]
        PROCESSES.append(f"{event} {str(args)[:160]} at {' < '.join(reversed(where))}")


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
TOP_K_DEFAULT = 6
RTOL, ATOL = 0.01, 0.05  # humming/testing/runner.py KernelTestCase defaults


# ------------------------------------------------------------------------------------------------ reference
def dequant_mxfp4(w_bytes, s_bytes):
    """[..., N, K/2] uint8 (element 2i in the low nibble) and [..., N, K/32] e8m0 -> [..., N, K] float64."""
    import torch

    lut = torch.tensor(E2M1, dtype=torch.float64, device=w_bytes.device)
    lo = lut[(w_bytes & 0xF).long()]
    hi = lut[(w_bytes >> 4).long()]
    w = torch.stack((lo, hi), dim=-1).flatten(-2)
    # exp2 on the CPU: torch JIT-compiles CUDA exp2 with NVRTC (its jiterator), which strict mode refuses in this
    # process (H200, session 7); 2^integer is exact on either side
    scale = torch.exp2(s_bytes.double().cpu() - 127.0).to(w_bytes.device).repeat_interleave(32, dim=-1)
    return w * scale


def quant_fp8_groups(x, group: int):
    """Block-FP8 activations as vLLM's prepare step makes them: per row and group of `group`, scale = absmax/448."""
    import torch

    rows, k = x.shape
    v = x.float().view(rows, k // group, group)
    scale = (v.abs().amax(dim=-1) / 448.0).clamp_min(1e-10)
    q = (v / scale.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(rows, k)
    return q, scale.contiguous()


def dequant_fp8_groups(q, scale, group: int):
    return (q.double().view(q.size(0), -1, group) * scale.double().unsqueeze(-1)).view(q.shape)


def reference(x_deq, topk_flat, w_bytes, s_bytes, rows_per_token: int):
    """out[r] = x[r // rows_per_token] @ W[expert of r].T in float64, then bf16 (Humming's reference dtype)."""
    import torch

    n = w_bytes.size(1)
    out = torch.zeros((topk_flat.numel(), n), dtype=torch.float64, device=x_deq.device)
    for e in torch.unique(topk_flat).tolist():
        rows = torch.nonzero(topk_flat == e).flatten()
        w = dequant_mxfp4(w_bytes[e], s_bytes[e])
        out[rows] = x_deq[rows // rows_per_token] @ w.T
    return out


# ------------------------------------------------------------------------------------------------ stream-K rule
# A stream-K kernel splits a tile's K range into slices run by different CTAs; slice 0 stores its float32 partial as
# bf16 and every other slice adds its partial into the bf16 output (TMA reduce-add or a bf16 atomic, in the order the
# CTAs arrive: humming/include/humming/epilogue/gmem_writer.cuh, pipeline.cuh). So the output is rounded to bf16
# once per slice and once per reduce-add, in a run-dependent order: bitwise equality is the wrong rule (session 6:
# Humming's own JIT differs launch to launch), and Humming's own isolated-outlier allowance failed 3 of 8 stream-K
# cases on the H200 (session 8: 1-2 bf16 steps, up to 179 elements). The rule below bounds the error of any such
# reduction against the float64 reference, per element, from quantities the reference computes:
#   S = sum_k |x_k w_k|                 (the accumulation's magnitude),
#   U = sum_g |sum_{k in g} x_k w_k|     over the slices' granularity g (a slice starts on a multiple of the largest
#                                        scale group, 128: scheduler.cuh kStreamKBlockAlignment), so that the slice
#                                        partials p_i of any split satisfy sum_i |p_i| <= U,
#   W = max(sum_g max(P_g, 0), sum_g max(-P_g, 0))   bounds every running sum of any subset of slices, any order;
# with u = 2^-8 (bf16 round-to-nearest) and s <= 10 slices per tile (scheduler.cuh kMaxSlices), the reductions add at
# most u * (U + (s - 1) * W); inside a slice the FP8 tensor-core accumulation (Hopper keeps about 14 bits, DeepSeek-V3
# report 3.3.2: 2^-13 per 32-deep WGMMA step, promoted to float32 per 128-group) and the float32 adds add at most
# (128/32 * 2^-13 + K/128 * 2^-24) * S. The bound is 1.01 times their sum. (A gate on the share of elements outside
# Humming's rtol/atol was tried and dropped: a simulated 10-slice reduction puts 1% of a w13 output there, the H200
# 0.13%; the share is not bounded by anything the reference knows.)
U_BF16 = 2.0 ** -8
U_FP32 = 2.0 ** -24
U_WGMMA_FP8 = 2.0 ** -13
WGMMA_K = 32
MAX_SLICES = 10  # humming scheduler.cuh: kMaxSlices


def stream_k_terms(x_deq, topk_flat, w_bytes, s_bytes, rows_per_token: int, group: int = 128):
    """(S, U, W) per output element (see above), float64, in the reference's layout."""
    import torch

    n, k = w_bytes.size(1), w_bytes.size(2) * 2
    rows_all = topk_flat.numel()
    terms = [torch.zeros((rows_all, n), dtype=torch.float64, device=x_deq.device) for _ in range(3)]
    for e in torch.unique(topk_flat).tolist():
        rows = torch.nonzero(topk_flat == e).flatten()
        w = dequant_mxfp4(w_bytes[e], s_bytes[e])
        x = x_deq[rows // rows_per_token]
        parts = torch.bmm(x.view(-1, k // group, group).transpose(0, 1),
                          w.view(n, k // group, group).permute(1, 2, 0))  # [groups, rows, n]
        terms[0][rows] = x.abs() @ w.abs().T
        terms[1][rows] = parts.abs().sum(0)
        terms[2][rows] = torch.maximum(parts.clamp(min=0).sum(0), (-parts).clamp(min=0).sum(0))
        del parts
    return tuple(terms)


def stream_k_bound(terms, k: int, group: int = 128):
    """The per-element bound on |out - reference| of a stream-K launch (the derivation above)."""
    s_abs, u_abs, w_run = terms
    slices = max(1, min(MAX_SLICES, k // group))
    gamma = (group / WGMMA_K) * U_WGMMA_FP8 + (k / group) * U_FP32
    return 1.01 * (U_BF16 * (u_abs + (slices - 1) * w_run) + gamma * s_abs)


def stream_k_close(out, ref, terms, k: int, group: int = 128) -> tuple[bool, str]:
    """A stream-K output against the float64 reference: no NaN and every element within the bound (Humming's own
    rtol/atol is reported, not required)."""
    import torch

    bound = stream_k_bound(terms, k, group)
    o = out.double()
    nan = int(torch.isnan(o).sum())
    err = (o - ref).abs()
    over = int((err.nan_to_num(float("inf")) > bound).sum())
    outside = int((~torch.isclose(out.float(), ref.to(out.dtype).float(), rtol=RTOL, atol=ATOL)).sum())
    ratio = err.nan_to_num(float("inf")) / bound.clamp_min(1e-300)
    stats = (f"nan {nan}, over the stream-K bound {over}/{out.numel()}, max |err|/bound {float(ratio.max()):.3g}, "
             f"max |err| {float(err.nan_to_num(float('inf')).max()):.4g}, outside Humming's rtol/atol {outside}, "
             f"max |ref| {float(ref.abs().max()):.4g} (stream-K bound)")
    ok = nan == 0 and over == 0
    return ok, stats


def humming_close(out, ref, stream_k: bool) -> tuple[bool, str]:
    """Humming's _assert_close (runner.py): bf16 output vs the reference in bf16, rtol 0.01 atol 0.05; for bf16
    stream-K kernels up to max(2, numel/10000) isolated outliers within 2*atol."""
    import torch

    ref = ref.to(out.dtype)
    bad = ~torch.isclose(out.float(), ref.float(), rtol=RTOL, atol=ATOL)
    n_bad = int(bad.sum())
    nan = int(torch.isnan(out.float()).sum())
    err = (out.float() - ref.float()).abs()
    stats = f"nan {nan}, mismatched {n_bad}/{out.numel()}, max |err| {float(err.nan_to_num(float('inf')).max()):.4g}, " \
            f"max |ref| {float(ref.float().abs().max()):.4g}"
    if nan:
        return False, stats
    if n_bad == 0:
        return True, stats
    if out.dtype != torch.bfloat16 or not stream_k:
        return False, stats
    wide = ~torch.isclose(out.float(), ref.float(), rtol=RTOL, atol=2 * ATOL)
    flat = bad.reshape(-1)
    ok = not bool(wide.any()) and n_bad <= max(2, out.numel() // 10000) and not bool((flat[:-1] & flat[1:]).any())
    return ok, stats + " (stream-K outlier allowance)"


# ------------------------------------------------------------------------------------------------ routing
def interval_of(table: list, m: int) -> int | None:
    """vLLM's choice (fused_humming_moe.py prepare_humming_moe_kwargs): the interval with lo < m <= hi."""
    for i, (lo, hi, _config) in enumerate(table):
        if lo < m <= hi:
            return i
    return None


def align(topk_ids, num_experts: int, block: int):
    """sorted_ids / expert_ids / num_tokens_padded for the indexed GEMM (Humming's own test helper)."""
    from humming.testing.data import generate_moe_tensors

    _, _, sorted_ids, expert_ids, padded = generate_moe_tensors(topk_ids, num_experts, "indexed",
                                                                block_size_config=block)
    return sorted_ids, expert_ids, padded


# ------------------------------------------------------------------------------------------------ serving
def _imports_done() -> None:
    """Humming and its dependencies are imported and the bundle seeded: later processes are the kernels' doing.
    (cuda-pathfinder runs `ldconfig -p` through ctypes.util.find_library when it is imported: reported apart.)"""
    import humming.forward  # noqa: F401
    import humming.ops  # noqa: F401
    import humming.transform  # noqa: F401

    AT_IMPORT.extend(PROCESSES)
    del PROCESSES[:]


def count_compiles() -> list[str]:
    """Every arrival at Humming's compile step (`Compiler._compile`, which starts the NVRTC child), counted by class
    name and passed on to whatever is there: nojit's strict guard (which refuses) in a serving process, Humming's
    own compile in a JIT process. The one counter of the Humming checks (this one, check_humming_jit.py and the CPU
    probe tests/probes/probe_humming_serving.py)."""
    import humming.jit.compiler as compilers

    compiles: list[str] = []
    for cls in (compilers.NVRTCCompiler, compilers.NVCCCompiler):
        current = cls.__dict__["_compile"].__func__  # the guard, or Humming's own

        def counted(c, *args, _current=current, **kwargs):
            compiles.append(c.__name__)
            return _current(c, *args, **kwargs)

        cls._compile = classmethod(counted)
    return compiles


def compile_step_guarded() -> bool:
    """Whether nojit's strict guard (loader/strict/guards.py) sits on Humming's compile step (before count_compiles)."""
    import humming.jit.compiler as compilers

    return all("_guard_humming" in cls.__dict__["_compile"].__func__.__qualname__
               for cls in (compilers.NVRTCCompiler, compilers.NVCCCompiler))


def install_strict(root: str):
    from nojit.loader.install import install

    inst = install(bundle_path=os.path.join(root, "humming.nojit"), mode="strict")
    import humming.jit.runtime  # noqa: F401  (nojit seeds the cache as this finishes loading)

    if inst.state("humming") is None:
        raise RuntimeError("nojit did not serve Humming (humming-kernels not found by importlib.metadata?)")
    if not compile_step_guarded():
        raise RuntimeError("no strict-mode guard on Humming's compile step")
    return inst, count_compiles()


# ------------------------------------------------------------------------------------------------ one GEMM
class Gemm:
    """One sublayer (w13 or w2) with random MXFP4 weights converted and repacked by Humming's own code."""

    def __init__(self, op: str, call: dict, input_schema: dict, seed: int):
        import torch
        from humming.schema import BaseWeightSchema
        from humming.schema.humming import HummingInputSchema
        from humming.transform import prepare_and_transform_humming_tensors

        self.op = op
        self.layer_config = call["layer_config"]
        self.compute_config = call["compute_config"]
        self.tuning_config = call["tuning_config"]
        self.table = json.loads(self.tuning_config)
        cfg = json.loads(self.layer_config)
        self.n, self.k, self.experts = cfg["shape_n"], cfg["shape_k"], cfg["num_experts"]
        self.group = cfg["input_scale_group_size"]
        dev = torch.device("cuda", torch.cuda.current_device())
        gen = torch.Generator(device=dev).manual_seed(seed)
        e, n, k = self.experts, self.n, self.k
        self.w_bytes = torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device=dev, generator=gen)
        # e8m0 scales 2^-7 .. 2^0: within the 11-step range Humming's fused-e8m0 transform keeps exactly
        self.s_bytes = torch.randint(120, 128, (e, n, k // 32), dtype=torch.uint8, device=dev, generator=gen)
        checkpoint = {"weight": self.w_bytes.clone(), "weight_scale": self.s_bytes.clone()}  # transformed in place
        stacks_n = [n // 2, n // 2] if op == "w13" else [n]  # vLLM _convert_sublayer_to_humming (gated w13)
        weight_schema, tensors = BaseWeightSchema.from_config({"quant_method": "mxfp4"}).convert_humming(
            tensors=checkpoint, shape_n_stacks=stacks_n, shape_k_stacks=[k], param_dtype=torch.bfloat16,
            num_experts=e, device=dev)
        in_schema = HummingInputSchema(**input_schema)
        config, self.tensors = prepare_and_transform_humming_tensors(
            tensors=tensors, shape_n=n, shape_k=k, weight_schema=weight_schema, input_schema=in_schema,
            num_experts=e, pad_n_to_multiple=256, pad_k_to_multiple=128, has_bias=False, torch_dtype=torch.bfloat16,
            device=dev)  # vLLM moe.py _prepare_and_transform_sublayer
        self.config_matches = json.loads(config.to_str()) == cfg
        self.config_str = config.to_str()
        self.config_diff = {key: (v, cfg.get(key)) for key, v in json.loads(config.to_str()).items() if cfg.get(key) != v}

    def kernels(self):
        """Humming's prepare_kernels for this layer (cached by Humming): rows (lo, hi, kernel id, ...)."""
        import torch
        from humming.kernel.humming import HummingKernel

        configs = HummingKernel.prepare_kernels(self.layer_config, self.compute_config, self.tuning_config,
                                                torch.cuda.current_device())
        return configs.reshape(-1, 4).tolist()

    def case(self, tokens: int, top_k: int, seed: int) -> dict | None:
        """One launch's inputs: routing, FP8 activations with their scales, the aligned routing of the interval's
        block size (None where M falls in no interval of the table)."""
        import torch
        from humming.testing.data import generate_random_tensor

        dev = self.w_bytes.device
        gen = torch.Generator(device=dev).manual_seed(seed)
        m = tokens * top_k
        topk = torch.rand((tokens, self.experts), device=dev, generator=gen).argsort(dim=1)[:, :top_k]
        topk = topk.to(torch.int32).contiguous()
        rows = tokens if self.op == "w13" else m  # w13 reads each token top_k times; w2 reads its m rows once
        # Activations as Humming's own tests make them (testing/data.py generate_random_tensor: per-group mean and
        # spread, row std ~ K^-1/4), so outputs have the magnitudes its tolerances (runner.py) are set for.
        torch.manual_seed(seed)
        x = generate_random_tensor((rows, self.k), torch.float32, group_size=self.group, device=dev).to(torch.bfloat16)
        q, scale = quant_fp8_groups(x, self.group)
        interval = interval_of(self.table, m)
        if interval is None:
            return None
        sorted_ids, expert_ids, padded = align(topk, self.experts, self.table[interval][2]["block_shape"][0])
        return {"tokens": tokens, "top_k": top_k, "m": m, "topk": topk, "q": q, "scale": scale,
                "interval": interval, "sorted_ids": sorted_ids, "expert_ids": expert_ids, "padded": padded}

    def launch(self, case: dict, locks):
        """Humming's own launch (ops.humming_gemm with vLLM's configs) into a NaN-poisoned output; (output, s)."""
        import torch
        from humming import ops

        out = torch.full((case["m"], self.n), float("nan"), dtype=torch.bfloat16, device=self.w_bytes.device)
        kw = {name: self.tensors[name] for name in ("weight_scale_2", "zero_point", "bias") if name in self.tensors}
        t0 = time.perf_counter()
        ops.humming_gemm(layer_config=self.layer_config, compute_config=self.compute_config,
                         tuning_config=self.tuning_config, inputs=case["q"], weight=self.tensors["weight"],
                         weight_scale=self.tensors["weight_scale"], input_scale=case["scale"], outputs=out,
                         sorted_ids=case["sorted_ids"], expert_ids=case["expert_ids"],
                         num_tokens_padded=case["padded"], locks=locks,
                         top_k=case["top_k"] if self.op == "w13" else 1,  # vLLM moe_kwargs1 / moe_kwargs2
                         valid_shape_m=case["m"], **kw)
        torch.cuda.synchronize()
        return out, time.perf_counter() - t0

    def kernel_of(self, m: int):
        """The kernel object Humming picked for M (its prepare_kernels table), or None."""
        from humming.kernel.humming import HummingKernel

        rows_k = [r for r in self.kernels() if r[0] < m <= r[1]]
        return HummingKernel._id2kernel[int(rows_k[0][2])] if rows_k else None

    def check(self, case: dict, out, launch_s: float = 0.0) -> dict:
        """The output against the float64 reference with Humming's rule, and the wrong-routing control."""
        import torch

        m, top_k, interval = case["m"], case["top_k"], case["interval"]
        kernel = self.kernel_of(m)
        x_deq = dequant_fp8_groups(case["q"], case["scale"], self.group)
        flat = case["topk"].reshape(-1).long()
        per_token = top_k if self.op == "w13" else 1
        ref = reference(x_deq, flat, self.w_bytes, self.s_bytes, per_token)
        stream_k = bool(getattr(kernel, "use_stream_k", self.table[interval][2].get("use_stream_k", False)))
        ok, stats = self.close(out, ref, x_deq, flat, per_token, stream_k)
        result = {"op": self.op, "tokens": case["tokens"], "m": m, "interval": interval,
                  "interval_bounds": self.table[interval][:2], "block_shape": self.table[interval][2]["block_shape"],
                  "stream_k": stream_k, "kernel_file": getattr(kernel, "kernel_filename", None),
                  "ok": ok, "stats": stats, "first_call_s": round(launch_s, 4)}
        # control: the same output against another routing's reference must not match (tokens rolled; with one
        # token, every expert id moved by one: a wrong expert)
        if case["tokens"] > 1:
            other = torch.roll(flat.view(case["tokens"], top_k), shifts=1, dims=0).reshape(-1)
        else:
            other = (flat + 1) % self.experts
        control_ok, control_stats = self.close(out, reference(x_deq, other, self.w_bytes, self.s_bytes, per_token),
                                               x_deq, other, per_token, stream_k)
        result["control_detected"] = not control_ok
        result["control_stats"] = control_stats
        if control_ok:
            result["ok"] = False
            result["reason"] = "the check cannot fail: another routing's reference matched too"
        return result

    def close(self, out, ref, x_deq, flat, per_token: int, stream_k: bool) -> tuple[bool, str]:
        """Humming's own rule for a kernel without stream-K; the stream-K bound (stream_k_close) for one with it."""
        if not stream_k:
            return humming_close(out, ref, False)
        terms = stream_k_terms(x_deq, flat, self.w_bytes, self.s_bytes, per_token, self.stream_k_group())
        return stream_k_close(out, ref, terms, self.k, self.stream_k_group())

    def stream_k_group(self) -> int:
        """The K granularity a slice starts on: the largest scale group (activations per `group`, MXFP4 per 32)."""
        return max(self.group, 32)

    def run(self, tokens: int, top_k: int, seed: int, locks) -> dict:
        case = self.case(tokens, top_k, seed)
        if case is None:
            return {"ok": False, "reason": f"M={tokens * top_k} is in no interval of the tuning table"}
        out, launch_s = self.launch(case, locks)
        return self.check(case, out, launch_s)


def make_locks():
    """The stream-K locks vLLM hands Humming (vllm.utils.humming.create_humming_locks: 8 per SM, zeroed)."""
    import torch

    sm_count = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return torch.zeros(sm_count * 8, dtype=torch.int32, device="cuda")


def gemm_seed(layer_index: int, op: str) -> int:
    """The weights' seed of one GEMM (the same in every check that launches these cases)."""
    return 1000 + layer_index * 10 + (op == "w2")


def case_seed(tokens: int, layer_index: int) -> int:
    """The routing's and activations' seed of one case."""
    return tokens * 7 + layer_index


# ------------------------------------------------------------------------------------------------ main
def device_main(opts, report: dict) -> None:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    inst, compiles = install_strict(opts.dir)
    serving = inst.state("humming")
    _imports_done()
    report["seeded_from_bundle"] = len(serving.seeded)
    with open(os.path.join(opts.dir, "humming_calls.json")) as f:
        calls = json.load(f)
    locks = make_locks()
    tokens = [int(t) for t in opts.tokens.split(",")]
    for li, layer in enumerate(calls["layers"]):
        top_k = int(layer["moe"].get("top_k", TOP_K_DEFAULT))
        for op, call in layer["gemms"].items():
            try:
                gemm = Gemm(op, call, layer["input_schema"], seed=gemm_seed(li, op))
            except Exception as exc:
                report["failures"].append(f"{op}: weight preparation failed: {type(exc).__name__}: {str(exc)[:600]}")
                report["tracebacks"].append(traceback.format_exc()[-3000:])
                continue
            if not gemm.config_matches:
                report["failures"].append(f"{op}: Humming's layer config differs from vLLM's bundled one: "
                                          f"{json.dumps(gemm.config_diff)[:400]}")
                continue
            for t in tokens:
                try:
                    r = gemm.run(t, top_k, seed=case_seed(t, li), locks=locks)
                except Exception as exc:
                    r = {"op": op, "tokens": t, "ok": False, "reason": f"{type(exc).__name__}: {str(exc)[:600]}"}
                    report["tracebacks"].append(traceback.format_exc()[-3000:])
                report["cases"].append(r)
                print(f"  {op} tokens={t} M={r.get('m')} interval={r.get('interval')} {r.get('block_shape')} "
                      f"stream_k={r.get('stream_k')}: {'ok' if r['ok'] else 'FAIL'} {r.get('stats', '')} "
                      f"{r.get('reason', '')} control={'detected' if r.get('control_detected') else r.get('control_detected')}",
                      flush=True)
                if not r["ok"]:
                    report["failures"].append(f"{op} tokens={t}: {r.get('reason') or r.get('stats')}")
            del gemm
            torch.cuda.empty_cache()
    seeded = set(serving.seeded)
    used = {c["kernel_file"] for c in report["cases"] if c.get("kernel_file")}
    report["kernels_launched"] = len(used)
    report["kernels_not_from_bundle"] = sorted(used - seeded)
    if used - seeded:
        report["failures"].append(f"{len(used - seeded)} launched kernel files are not the bundle's seeded ones")
    report["intervals"] = sorted({(c["op"], c["interval"]) for c in report["cases"] if "interval" in c})
    report["compiles"] = list(compiles)
    report["bundle_hits"] = serving.hits
    report["misses"] = list(serving.misses)


def dry_main(opts, report: dict) -> None:
    """No GPU: stand-in H200; the calls, intervals, seeding and Humming's own kernel creation (0 compiles)."""
    from nojit.aot.runtimes.humming import standin

    standin.install("NVIDIA H200", (9, 0), 132)
    inst, compiles = install_strict(opts.dir)
    _imports_done()
    report["seeded_from_bundle"] = len(inst.state("humming").seeded)
    from humming.kernel.humming import HummingKernel
    from humming.kernel.process_mxfp4 import ProcessMxfp4W4A8Kernel
    from humming.kernel.repack_weight import RepackWeightKernel

    registered: list[str] = []
    def register(self):  # the launcher registration is a GPU call: counted, with the id Humming would get
        registered.append(self.kernel_filename)
        self.kernel_id = len(registered)

    HummingKernel.register_kernel = register
    transform = [e.key for e in inst.state("humming").entries.values()
                 if e.key["class"].endswith((":ProcessMxfp4W4A8Kernel", ":RepackWeightKernel"))]
    if not transform:
        report["failures"].append("the bundle holds no weight-transform kernels (rebuild it with `nojit build`)")
    for e in transform:  # Humming constructs them as transform_humming_tensors does: a cache hit each
        cls = ProcessMxfp4W4A8Kernel if e["class"].endswith("ProcessMxfp4W4A8Kernel") else RepackWeightKernel
        kernel = cls(**e["args"])
        report["cases"].append({"transform": e["class"], "file_seeded": os.path.exists(kernel.kernel_filename)})
    with open(os.path.join(opts.dir, "humming_calls.json")) as f:
        calls = json.load(f)
    tokens = [int(t) for t in opts.tokens.split(",")]
    for layer in calls["layers"]:
        top_k = int(layer["moe"].get("top_k", TOP_K_DEFAULT))
        for op, call in layer["gemms"].items():
            configs = HummingKernel.prepare_kernels(call["layer_config"], call["compute_config"],
                                                    call["tuning_config"], 0).reshape(-1, 4).tolist()
            table = json.loads(call["tuning_config"])
            for t in tokens:
                m = t * top_k
                i = interval_of(table, m)
                kid = [r[2] for r in configs if r[0] < m <= r[1]]
                report["cases"].append({"op": op, "tokens": t, "m": m, "interval": i,
                                        "block_shape": table[i][2]["block_shape"] if i is not None else None,
                                        "kernel_file_seeded": bool(kid) and registered[int(kid[0]) - 1]
                                        in inst.state("humming").seeded})
    report["registered"] = len(registered)
    report["compiles"] = list(compiles)
    report["bundle_hits"] = inst.state("humming").hits
    report["misses"] = list(inst.state("humming").misses)
    # the reference's MXFP4 decoding: codes 0..15 in the low nibble (element 2i: Humming views the bytes as int32
    # and unpacks 4-bit element i from bits 4i, little-endian), scale 2^(127-127)
    import torch

    pair = torch.arange(16, dtype=torch.uint8).view(1, 16) | (15 << 4)
    decoded = dequant_mxfp4(pair, torch.full((1, 1), 127, dtype=torch.uint8)).view(16, 2)
    report["e2m1_decode_ok"] = bool(torch.equal(decoded[:, 0], torch.tensor(E2M1, dtype=torch.float64))
                                    and bool((decoded[:, 1] == -6.0).all()))
    if not report["e2m1_decode_ok"]:
        report["failures"].append("MXFP4 decoding of the reference is wrong")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=".device-hg")
    ap.add_argument("--json")
    ap.add_argument("--tokens", default="1,4,64,200,300,435,500")
    ap.add_argument("--dry-run", action="store_true")
    opts = ap.parse_args()
    sys.addaudithook(_audit)
    sys.path.insert(0, os.path.abspath(os.path.join(opts.dir, "site")))
    os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")
    report: dict = {"cases": [], "failures": [], "tracebacks": [], "dry_run": opts.dry_run}
    t0 = time.perf_counter()
    try:
        (dry_main if opts.dry_run else device_main)(opts, report)
    except Exception as exc:
        report["failures"].append(f"setup failed: {type(exc).__name__}: {str(exc)[:800]}")
        report["tracebacks"].append(traceback.format_exc()[-4000:])
    report["processes"] = list(PROCESSES)
    report["processes_at_import"] = list(AT_IMPORT)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if report.get("compiles"):
        report["failures"].append(f"{len(report['compiles'])} arrivals at Humming's compile step")
    if PROCESSES:
        report["failures"].append(f"{len(PROCESSES)} processes started")
    checked = [c for c in report["cases"] if "ok" in c]
    if not opts.dry_run and not checked:
        report["failures"].append("no GEMM case ran")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    for tb in report["tracebacks"][:3]:
        print(tb, file=sys.stderr)
    ops = sorted({c["op"] for c in checked})
    print(f"RESULT humming-gemm: {sum(c['ok'] for c in checked)}/{len(checked)} launches of "
          f"{len(report.get('intervals', []))} bundled GEMM kernels ({', '.join(ops) or 'none'}) through Humming's own "
          f"launcher vs float64 reference (rtol {RTOL}, atol {ATOL}; stream-K: the reduction's bound), controls detected "
          f"{sum(bool(c.get('control_detected')) for c in checked)}/{sum('control_detected' in c for c in checked)}, "
          f"seeded {report.get('seeded_from_bundle')} from the bundle, "
          f"{len(report.get('compiles', []))} compiles, {len(PROCESSES)} processes "
          f"(+{len(AT_IMPORT)} at import), "
          f"{len(report['failures'])} failures" + (" (dry run)" if opts.dry_run else ""))
    if opts.dry_run:
        planned = [c for c in report["cases"] if "op" in c]
        print(f"  dry run: {len(planned)} cases over {len({(c['op'], c['interval']) for c in planned})} tuning intervals, "
              f"all served by seeded bundle cubins: {all(c['kernel_file_seeded'] for c in planned)}; "
              f"{report.get('registered')} GEMM kernels created by Humming, {report.get('bundle_hits')} bundle hits, "
              f"misses {len(report.get('misses', []))}")
    for f in report["failures"][:20]:
        print("  FAIL", f)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
