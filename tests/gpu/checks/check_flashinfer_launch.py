"""H200 check (issue 12): FlashInfer's modules of the bundle launched by FlashInfer itself against torch references.

Run from the repository root on the device, with .device-fi/ made by tools/prepare_flashinfer_device.py, FlashInfer's
Python unpacked and apache-tvm-ffi installed on PYTHONPATH, LD_LIBRARY_PATH holding libcudart.so.13, and the
process guard preloaded (tests/gpu/device_run.sh, step flashinfer-launch, does all of it):
    LD_PRELOAD=libnojit_exec_guard.so python3 tests/gpu/checks/check_flashinfer_launch.py --dir .device-fi --json OUT

How the modules are reached: nojit's loader installs the bundle in strict mode as a server does (seeds FlashInfer's
jit-cache provider directory and TensorRT-LLM DeepGEMM's cache from the bundle, loader/runtimes/flashinfer/serving.py);
FlashInfer's own entry points then run, as vLLM 0.33.0 calls them, and load the modules through FlashInfer's own
AOT lookup (jit/env.py get_aot_artifacts) and loader (jit/core.py JitSpec.try_load -> tvm_ffi.load_module).
  * sampling (vllm/v1/sample/ops/topk_topp_sampler.py:631-670 `flashinfer_sample`, per-request k int32 and p float32
    tensors, deterministic=True): top-p from probs, top-k from probs, top-k + top-p from logits (FlashInfer's
    top_k_first path: its top_k_mask_logits, torch softmax, its top_p_sampling_from_probs). Checked as FlashInfer's
    tests/utils/test_sampling.py checks (flashinfer-ai/flashinfer, test_top_k_sampling / test_top_p_sampling /
    test_top_k_top_p_joint_sampling_from_probs): every sampled token inside the torch-computed top-k / top-p set
    (top-p with the test's eps 1e-4), over many draws and several logit seeds. The deterministic functions of the
    module against torch within the test's rtol = atol = 1e-3 (test_top_k_renorm_probs, test_top_p_renorm_probs,
    test_top_k_mask_logits): top_k_mask_logits (reached by vLLM's top-k + top-p call), top_k_renorm_probs,
    top_p_renorm_probs.
  * fp8_blockscale_gemm_90 (vllm/model_executor/kernels/linear/scaled_mm/flashinfer.py:260-270: bf16 input, FP8
    weight, float32 128x128 weight scales, out_dtype bf16) for every (N, K) whose TensorRT-LLM DeepGEMM cubin the
    bundle holds, at M in 1..31 (the swapAB path, compiled by TensorRT-LLM's JIT with nvcc through popen when its
    cache misses): against a float32 torch product of the same block-scaled FP8 operands (the input quantized 1x128
    as TensorRT-LLM's scale_1x128_kernel does: scale 448 / amax), within calc_diff < 1e-3 (the TensorRT-LLM
    similarity metric of FlashInfer's tests/gemm/test_fp8_blockscale_gemm.py, DeepGEMM's bound), and cosine
    similarity > 0.967 against the bf16 product (that test's threshold for BF16 input + FP8 per-block weights).
  * trtllm_comm, trtllm_mnnvl_comm (TP allreduce fusion: they need two or more ranks): loaded by FlashInfer's
    build_and_load from the seeded provider and their functions looked up; not launched.
Outputs poisoned first: the outputs FlashInfer's wrappers allocate (torch.empty / empty_like) are filled with NaN or
-1 as they are allocated (class Poison), the GEMM's second call writes into an `out=` buffer filled with NaN; a call
whose output is not one of the poisoned allocations, or still holds poison, fails its case. Zero compiles, zero processes: the preloaded guard (tests/gpu/checks/exec_guard.c) counts every
fork/exec/posix_spawn/popen/system and nvrtcCompileProgram from C and refuses them from the first FlashInfer call
on; a Python audit hook counts process starts; nojit's strict loader refuses a module FlashInfer would build; the
TensorRT-LLM cache must hold only the seeded cubins afterwards.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import sys
import time
from typing import Any

SAMPLING_EPS = 1e-4  # FlashInfer tests/utils/test_sampling.py: top-p mask `cdf > (1 - p) - eps`
RENORM_TOL = 1e-3  # the same file: torch.testing.assert_close(..., rtol=1e-3, atol=1e-3)
GEMM_DIFF = 1e-3  # FlashInfer tests/gemm/test_fp8_blockscale_gemm.py calc_diff: "diff < 0.001"
GEMM_COS_BF16 = 0.967  # the same file, BF16 input + FP8 per-block weight against the bf16 product
VOCAB = 129280  # DeepSeek-V4-Flash's vocabulary (config.json vocab_size)
BATCHES = (1, 13, 128)
GEMM_MS = (1, 2, 7, 16, 31)
PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "os.fork",
                            "os.forkpty", "pty.spawn"})
DEVICE = "cuda"  # the CPU test runs the cases' harness on "cpu" with a torch stand-in for FlashInfer
TRTLLM_NAME = re.compile(r"gemm_swapAB_(\d+)_(\d+)_")

_audit: list[str] = []


def _audit_hook(event: str, args: tuple) -> None:
    if event in PROCESS_EVENTS:
        _audit.append(f"{event} {str(args)[:200]}")


def process_guard() -> Any:
    """The preloaded C guard (None when the process was started without it)."""
    lib = ctypes.CDLL(None)
    try:
        lib.nojit_guard_processes.restype = ctypes.c_long
        lib.nojit_guard_nvrtc.restype = ctypes.c_long
        lib.nojit_guard_set_mode.argtypes = [ctypes.c_int]
    except AttributeError:
        return None
    return lib


def counts(guard: Any) -> dict[str, int]:
    return {"c_processes": int(guard.nojit_guard_processes()), "nvrtc_compiles": int(guard.nojit_guard_nvrtc()),
            "python_processes": len(_audit)}


# ------------------------------------------------------------------------------------------------ references
def top_k_mask(probs_or_logits: Any, k: Any) -> Any:
    """FlashInfer's test: the pivot is the k-th largest value; everything >= it is in the set."""
    import torch

    ordered, _ = torch.sort(probs_or_logits, dim=-1, descending=True)
    pivot = ordered.gather(1, (k.long() - 1).clamp(min=0).view(-1, 1))
    return probs_or_logits >= pivot


def top_p_mask(probs: Any, p: Any, eps: float = SAMPLING_EPS) -> Any:
    """FlashInfer's test: ascending sort, cumulative sum, the tokens where cdf > (1 - p) - eps."""
    import torch

    ordered, idx = torch.sort(probs, dim=-1, descending=False)
    cdf = torch.cumsum(ordered, dim=-1)
    keep = (cdf > (1 - p.view(-1, 1)) - eps).int()
    mask = torch.zeros_like(keep)
    mask.scatter_add_(1, idx, keep)
    return mask.bool()


def masked_logits_reference(logits: Any, k: Any) -> Any:
    import torch

    return torch.where(top_k_mask(logits, k), logits, torch.full_like(logits, float("-inf")))


def renorm_reference(probs: Any, mask: Any) -> Any:
    kept = torch_where_zero(probs, mask)
    return kept / kept.sum(dim=-1, keepdim=True)


def torch_where_zero(x: Any, mask: Any) -> Any:
    import torch

    return torch.where(mask, x, torch.zeros_like(x))


def quantize_input_1x128(x: Any) -> tuple[Any, Any]:
    """The bf16 activation quantized as TensorRT-LLM's scale_1x128_kernel does (fp8_blockscale_gemm_kernel.cuh:
    scale = 448 / amax of each 1x128 group, q = fp8(x * scale), stored scale 1 / scale): (q, dequant scale)."""
    import torch

    m, k = x.shape
    groups = x.view(m, k // 128, 128)
    amax = groups.abs().amax(dim=2).float()
    scale = torch.where(amax != 0, 448.0 / amax, torch.ones_like(amax))
    q = (groups.float() * scale.unsqueeze(2)).to(torch.float8_e4m3fn).view(m, k)
    return q, 1.0 / scale


def quantize_weight_128x128(w: Any) -> tuple[Any, Any]:
    """A block-FP8 weight as DeepSeek checkpoints hold them: 128x128 blocks, power-of-two float32 scales."""
    import torch

    n, k = w.shape
    blocks = w.float().view(n // 128, 128, k // 128, 128)
    amax = blocks.abs().amax(dim=(1, 3)).clamp(min=1e-4)
    scale = torch.pow(2.0, torch.ceil(torch.log2(amax / 448.0)))
    q = (blocks / scale.view(n // 128, 1, k // 128, 1)).to(torch.float8_e4m3fn).view(n, k)
    return q, scale.contiguous()


def block_fp8_reference(x: Any, wq: Any, wscale: Any) -> Any:
    """float32 product of the same block-scaled FP8 operands."""
    xq, xs = quantize_input_1x128(x)
    m, k = x.shape
    n = wq.shape[0]
    a = (xq.float().view(m, k // 128, 128) * xs.unsqueeze(2)).view(m, k)
    b = (wq.float().view(n // 128, 128, k // 128, 128) * wscale.view(n // 128, 1, k // 128, 1)).view(n, k)
    return a @ b.t()


def calc_diff(out: Any, ref: Any) -> float:
    """TensorRT-LLM's similarity metric, as FlashInfer's test defines it: 1 - 2<x,y> / (|x|^2 + |y|^2)."""
    import torch

    o, r = out.to(torch.float64), ref.to(torch.float64)
    return float(1 - 2 * (o * r).sum() / (o * o + r * r).sum())


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------------------------ poisoning
class Poison:
    """While active, torch.empty and torch.empty_like (what FlashInfer's wrappers allocate their outputs with:
    sampling.py `samples = torch.empty(batch_size, ...)`, gemm_base.py `out = torch.empty(M, N, ...)`) hand out
    tensors already filled with a poison: NaN for floating dtypes, -1 for int32/int64. Other dtypes (uint8
    workspaces, bool flags) are left as allocated; zero-initialised scratch comes from torch.zeros, untouched.
    `hit(out)`: the output is one of the poisoned allocations."""

    def __enter__(self) -> Poison:  # noqa: PYI034
        import torch

        self.torch, self.ptrs = torch, set()
        self.saved = (torch.empty, torch.empty_like)
        real_empty, real_like = self.saved

        def poison(t: Any) -> Any:
            if t.is_floating_point() and t.element_size() >= 2:
                t.fill_(float("nan"))
            elif t.dtype in (torch.int32, torch.int64):
                t.fill_(-1)
            else:
                return t
            self.ptrs.add(t.data_ptr())
            return t

        torch.empty = lambda *a, **kw: poison(real_empty(*a, **kw))
        torch.empty_like = lambda *a, **kw: poison(real_like(*a, **kw))
        return self

    def __exit__(self, *exc: object) -> None:
        self.torch.empty, self.torch.empty_like = self.saved

    def hit(self, out: Any) -> bool:
        return out.data_ptr() in self.ptrs


# ------------------------------------------------------------------------------------------------ cases
def sampling_inputs(batch: int, seed: int) -> tuple[Any, Any, Any]:
    """Per-request logits of varied sharpness, k in 1..200 (int32, as vLLM's SamplingMetadata.top_k), p in
    [0.3, 0.95] (float32)."""
    import torch

    g = torch.Generator(device=DEVICE).manual_seed(seed)
    sharp = torch.rand(batch, 1, device=DEVICE, generator=g) * 4 + 1
    logits = torch.randn(batch, VOCAB, device=DEVICE, generator=g) * sharp
    k = torch.randint(1, 201, (batch,), device=DEVICE, generator=g, dtype=torch.int32)
    p = (torch.rand(batch, device=DEVICE, generator=g) * 0.65 + 0.3).float()
    return logits.float().contiguous(), k, p


def run_sampling(fi: Any, draws: int, seeds: int) -> list[dict]:
    import torch

    rows = []
    for op in ("top_p", "top_k", "top_k_top_p"):
        for batch in BATCHES:
            case = {"case": f"sampling {op} batch={batch}", "calls": 0, "draws": 0, "poisoned": 0, "outside": 0,
                    "poison_left": 0, "distinct": 0}
            t0 = time.perf_counter()
            seen: set[tuple[int, int]] = set()
            try:
                for seed in range(seeds):
                    logits, k, p = sampling_inputs(batch, 1000 * seed + batch)
                    probs = logits.softmax(dim=-1, dtype=torch.float32)  # vLLM: logits.softmax(dim=-1, dtype=float32)
                    if op == "top_p":
                        allowed = top_p_mask(probs, p)
                    elif op == "top_k":
                        allowed = top_k_mask(probs, k)
                    else:
                        masked = masked_logits_reference(logits, k)
                        allowed = top_k_mask(logits, k) & top_p_mask(torch.softmax(masked, dim=-1), p)
                    for _ in range(draws):
                        with Poison() as poison:
                            if op == "top_p":
                                out = fi.sampling.top_p_sampling_from_probs(probs, p, deterministic=True)
                            elif op == "top_k":
                                out = fi.sampling.top_k_sampling_from_probs(probs, k, deterministic=True)
                            else:
                                out = fi.sampling.top_k_top_p_sampling_from_logits(logits, k, p, deterministic=True)
                        case["calls"] += 1
                        case["poisoned"] += poison.hit(out)
                        ids = out.view(-1).long()
                        case["poison_left"] += int((ids == -1).sum())
                        valid = (ids >= 0) & (ids < VOCAB)
                        inside = allowed.gather(1, ids.clamp(0, VOCAB - 1).view(-1, 1)).view(-1) & valid
                        case["outside"] += int((~inside).sum())
                        seen.update(zip(range(batch), ids.tolist()))
                        case["draws"] += batch
            except Exception as exc:  # noqa: BLE001 - reported as the case's failure
                case["error"] = f"{type(exc).__name__}: {exc}"[:600]
            case["distinct"] = len(seen)
            case["seconds"] = round(time.perf_counter() - t0, 3)
            case["ok"] = ("error" not in case and case["draws"] > 0 and case["poisoned"] == case["calls"]
                          and case["outside"] == 0 and case["poison_left"] == 0)
            rows.append(case)
    return rows


def run_deterministic(fi: Any) -> list[dict]:
    """top_k_mask_logits, top_k_renorm_probs, top_p_renorm_probs vs torch at rtol = atol = 1e-3."""
    import torch

    rows = []
    for batch in BATCHES:
        g = torch.Generator(device=DEVICE).manual_seed(42 + batch)
        logits = torch.randn(batch, VOCAB, device=DEVICE, generator=g) * 5  # test_top_k_mask_logits' input
        pre = torch.rand(batch, VOCAB, device=DEVICE, generator=g)  # test_top_k/p_renorm_probs' input
        probs = pre / pre.sum(dim=-1, keepdim=True)
        for k_max in (10, 100, 500):
            k = torch.randint(1, k_max + 1, (batch,), device=DEVICE, generator=g, dtype=torch.int32)
            rows.append(_deterministic_case(
                f"top_k_mask_logits batch={batch} k<={k_max}",
                fi.sampling.top_k_mask_logits, (logits, k), masked_logits_reference(logits, k), masked=True))
            rows.append(_deterministic_case(
                f"top_k_renorm_probs batch={batch} k<={k_max}",
                fi.sampling.top_k_renorm_probs, (probs, k), renorm_reference(probs, top_k_mask(probs, k))))
        for p_val in (0.1, 0.5, 0.9, 1.0):
            p = torch.full((batch,), p_val, device=DEVICE, dtype=torch.float32)
            ordered, idx = torch.sort(probs, dim=-1, descending=False)
            keep = (torch.cumsum(ordered, dim=-1) >= (1 - p_val)).int()  # test_top_p_renorm_probs: cdf >= 1 - p
            mask = torch.zeros_like(keep).scatter_add_(1, idx, keep).bool()
            rows.append(_deterministic_case(
                f"top_p_renorm_probs batch={batch} p={p_val}",
                fi.sampling.top_p_renorm_probs, (probs, p), renorm_reference(probs, mask)))
    return rows


def _deterministic_case(name: str, fn: Any, args: tuple, ref: Any, masked: bool = False) -> dict:
    import torch

    case: dict[str, Any] = {"case": name}
    try:
        with Poison() as poison:
            out = fn(*args)
        case["poisoned"] = poison.hit(out)
        case["nan_left"] = int(torch.isnan(out).sum())
        if masked:  # the same tokens masked to -inf, the kept logits unchanged
            same_mask = torch.equal(torch.isneginf(out), torch.isneginf(ref))
            kept = ~torch.isneginf(ref)
            err = float((out[kept] - ref[kept]).abs().max()) if bool(kept.any()) else 0.0
            case.update(same_mask=same_mask, max_abs_err=err)
            good = same_mask and err <= RENORM_TOL + RENORM_TOL * float(ref[kept].abs().max())
            sm_out, sm_ref = torch.softmax(out, dim=-1), torch.softmax(ref, dim=-1)
            torch.testing.assert_close(sm_out, sm_ref, rtol=RENORM_TOL, atol=RENORM_TOL)
        else:
            case["max_abs_err"] = float((out - ref).abs().max())
            torch.testing.assert_close(out, ref, rtol=RENORM_TOL, atol=RENORM_TOL)
            good = True
        case["ok"] = bool(good and case["poisoned"] and case["nan_left"] == 0)
    except Exception as exc:  # noqa: BLE001
        case["error"] = f"{type(exc).__name__}: {exc}"[:600]
        case["ok"] = False
    return case


def tile_config_ms(entries: Any) -> dict[tuple[int, int], set[int]]:
    """The first and last M of each bundled TensorRT-LLM tile config, by (N, K): bundles since session 13 key each
    kernel by its config and the range of M it serves (aot/runtimes/flashinfer/trtllm.py)."""
    out: dict[tuple[int, int], set[int]] = {}
    for e in entries:  # any bundle's entries: another runtime's launch record has no `kind`
        if getattr(e.launch, "kind", None) == "trtllm_deepgemm" and isinstance(e.key, dict) and "m" in e.key:
            out.setdefault((e.key["n"], e.key["k"]), set()).update(e.key["m"])
    return out


def run_gemm(fi: Any, shapes: list[tuple[int, int]], config_ms: dict[tuple[int, int], set[int]] | None = None
             ) -> list[dict]:
    """GEMM_MS for each (N, K), plus `config_ms`: the first and last M of each bundled tile config's range (a
    shape whose M < 32 takes several configs, as Qwen3.5's in_proj_qkvz does, runs each of its kernels)."""
    import torch

    rows = []
    for n, k in shapes:
        g = torch.Generator(device=DEVICE).manual_seed(n * 7 + k)
        w = (torch.randn(n, k, device=DEVICE, generator=g) * 0.05).to(torch.bfloat16)
        wq, ws = quantize_weight_128x128(w)
        for m in sorted(set(GEMM_MS) | (config_ms or {}).get((n, k), set())):
            case: dict[str, Any] = {"case": f"fp8_blockscale_gemm_sm90 M={m} N={n} K={k}"}
            try:
                x = torch.randn(m, k, device=DEVICE, generator=g).to(torch.bfloat16)
                ref = block_fp8_reference(x, wq, ws)
                bf16 = (x.float() @ w.float().t())
                # vLLM's call (scaled_mm/flashinfer.py:260-270): the wrapper allocates the output
                with Poison() as poison:
                    out = fi.gemm.fp8_blockscale_gemm_sm90(input=x, weight=wq, weight_scale=ws,
                                                           out_dtype=torch.bfloat16)
                _sync()
                case["poisoned"] = poison.hit(out)
                given = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
                fi.gemm.fp8_blockscale_gemm_sm90(input=x, weight=wq, weight_scale=ws, out=given)
                _sync()
                case["nan_left"] = int(torch.isnan(out).sum()) + int(torch.isnan(given).sum())
                case["calc_diff"] = calc_diff(out.float(), ref)
                case["calc_diff_out"] = calc_diff(given.float(), ref)
                case["cos_bf16"] = float(torch.nn.functional.cosine_similarity(out.float().flatten(), bf16.flatten(),
                                                                               dim=0))
                case["max_rel_err"] = float((out.float() - ref).abs().max() / ref.abs().max())
                case["ok"] = bool(case["poisoned"] and case["nan_left"] == 0 and case["calc_diff"] < GEMM_DIFF
                                  and case["calc_diff_out"] < GEMM_DIFF and case["cos_bf16"] > GEMM_COS_BF16)
            except Exception as exc:  # noqa: BLE001
                case["error"] = f"{type(exc).__name__}: {exc}"[:600]
                case["ok"] = False
            rows.append(case)
    return rows


def run_comm_loaded(names: list[str]) -> list[dict]:
    """The allreduce modules through FlashInfer's own loader, their functions looked up (not launched)."""
    from flashinfer.jit import comm

    functions = {"trtllm_comm": ("trtllm_allreduce_fusion", "trtllm_custom_all_reduce", "trtllm_lamport_initialize",
                                 "trtllm_moe_allreduce_fusion", "trtllm_moe_finalize_allreduce_fusion"),
                 "trtllm_mnnvl_comm": ("trtllm_mnnvl_allreduce_fusion",)}
    gens = {"trtllm_comm": comm.gen_trtllm_comm_module, "trtllm_mnnvl_comm": comm.gen_trtllm_mnnvl_comm_module}
    rows = []
    for name in names:
        case: dict[str, Any] = {"case": f"{name} loaded (not launched: needs TP > 1)"}
        try:
            spec = gens[name]()
            case["artifact"] = [str(a.path) for a in spec.aot_artifacts]
            module = spec.build_and_load()
            found = {f: getattr(module, f, None) is not None for f in functions[name]}
            case["functions"] = found
            case["ok"] = bool(case["artifact"]) and all(found.values())
        except Exception as exc:  # noqa: BLE001
            case["error"] = f"{type(exc).__name__}: {exc}"[:600]
            case["ok"] = False
        rows.append(case)
    return rows


def trtllm_cache_state(root: str) -> dict[str, list[str]]:
    cache = os.path.join(root, "cache")
    tmp = os.path.join(root, "tmp")
    return {"cache": sorted(os.listdir(cache)) if os.path.isdir(cache) else [],
            "tmp": sorted(os.listdir(tmp)) if os.path.isdir(tmp) else []}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=".device-fi")
    ap.add_argument("--json", default="")
    ap.add_argument("--draws", type=int, default=100, help="sampling calls per logits seed")
    ap.add_argument("--seeds", type=int, default=4, help="logits seeds per sampling case")
    args = ap.parse_args()
    result: dict[str, Any] = {"ok": False, "cases": []}

    def finish(code: int) -> int:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1, default=str)
        print("FLASHINFER-LAUNCH:", "PASS" if result["ok"] else "FAIL")
        return code

    sys.addaudithook(_audit_hook)
    guard = process_guard()
    if guard is None:
        result["error"] = "the process guard is not preloaded (LD_PRELOAD=libnojit_exec_guard.so)"
        print(result["error"])
        return finish(1)
    import torch

    torch.cuda.init()
    torch.empty(1, device=DEVICE)
    torch.backends.cuda.matmul.allow_tf32 = False  # the float32 references in float32
    result["device"] = torch.cuda.get_device_name()
    result["torch"] = torch.__version__
    try:  # what torch 2.14 (the serving torch) imports in torch.cuda._utils; its import asks `ldconfig -p`
        import cuda.pathfinder  # noqa: F401  (ctypes.util.find_library), before the counted windows as in a server
    except ImportError:
        pass
    result["counts_at_start"] = counts(guard)

    from nojit.loader.runtimes.flashinfer import serving as flashinfer_serving
    from nojit.loader.strict import guards
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.install import install

    bundle_path = os.path.join(args.dir, "flashinfer.nojit")
    index = Bundle.open(bundle_path).manifest
    ids = sorted({e.kernel for e in index.entries if index.kernels[e.kernel].runtime == "flashinfer"})
    shapes = sorted({(int(mt.group(1)), int(mt.group(2))) for e in index.entries
                     if e.launch.kind == "trtllm_deepgemm" and (mt := TRTLLM_NAME.match(e.launch.module))})
    config_ms = tile_config_ms(index.entries)
    modules = sorted(e.launch.module for e in index.entries if e.launch.kind == "module")
    before = counts(guard)
    t0 = time.perf_counter()
    # as a server: strict, the bundle's FlashInfer entries; this machine has no vLLM (the bundle names 0.33.0)
    inst = install(bundle_path=bundle_path, mode="strict", allow_mismatch=frozenset({"vllm"}), kernels=set(ids))
    serving = inst.state("flashinfer")
    result["install_ms"] = round(1000 * (time.perf_counter() - t0), 1)
    if serving is None:
        result["error"] = "nojit found no FlashInfer here (flashinfer-python's dist-info is not on the path)"
        print(result["error"])
        return finish(1)
    trtllm_root = os.environ.get("TRTLLM_DG_CACHE_DIR", "")
    result["seeded"] = {"provider_dir": serving.root, "modules": sorted(serving.modules),
                        "trtllm_cache": trtllm_cache_state(trtllm_root)}
    try:  # FlashInfer's own package, carried without data/, under this machine's torch (2.11)
        import flashinfer
        import flashinfer.gemm
        import flashinfer.jit.env as fi_env
        import flashinfer.sampling
    except Exception as exc:  # noqa: BLE001 - the step's answer: FlashInfer's Python does not run here
        import traceback

        traceback.print_exc()
        result["error"] = f"import flashinfer failed: {type(exc).__name__}: {exc}"[:1000]
        return finish(1)

    result["flashinfer"] = {"version": getattr(flashinfer, "__version__", None), "file": flashinfer.__file__,
                            "providers": [p.provider_id for p in fi_env.FLASHINFER_AOT_PROVIDERS]}
    after_import = counts(guard)
    result["counts_install_and_import"] = {k: after_import[k] - before[k] for k in after_import}
    print(f"flashinfer {result['flashinfer']['version']} from {flashinfer.__file__}; providers "
          f"{result['flashinfer']['providers']}; seeded {serving.root}")
    guard.nojit_guard_set_mode(1)  # from here every process start and NVRTC compile is refused
    t0 = time.perf_counter()
    cases = run_sampling(flashinfer, args.draws, args.seeds)
    cases += run_deterministic(flashinfer)
    cases += run_gemm(flashinfer, shapes, config_ms)
    cases += run_comm_loaded([m for m in modules if m in ("trtllm_comm", "trtllm_mnnvl_comm")])
    result["launch_seconds"] = round(time.perf_counter() - t0, 1)
    guard.nojit_guard_set_mode(0)
    end = counts(guard)
    result["counts_launch"] = {k: end[k] - after_import[k] for k in end}
    result["compile_attempts"] = list(guards.compile_attempts)
    result["flashinfer_builds"] = list(flashinfer_serving.current().builds)
    result["trtllm_cache_after"] = trtllm_cache_state(trtllm_root)
    result["cases"] = cases
    result["python_process_events"] = list(_audit)
    for c in cases:
        extra = {k: v for k, v in c.items() if k not in ("case", "ok")}
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['case']:58s} {json.dumps(extra, default=str)[:260]}")
    cache_clean = (result["trtllm_cache_after"]["cache"] == result["seeded"]["trtllm_cache"]["cache"]
                   and not result["trtllm_cache_after"]["tmp"])
    zero = (all(v == 0 for v in result["counts_install_and_import"].values())
            and all(v == 0 for v in result["counts_launch"].values())
            and not result["compile_attempts"] and not result["flashinfer_builds"])
    result["summary"] = {
        "cases": len(cases), "passed": sum(c["ok"] for c in cases),
        "gemm_shapes": len(shapes),
        "modules_in_bundle": modules, "zero_compiles_zero_processes": zero, "trtllm_cache_unchanged": cache_clean}
    result["ok"] = bool(cases) and all(c["ok"] for c in cases) and zero and cache_clean and len(shapes) > 0
    print(json.dumps({k: result[k] for k in ("summary", "counts_install_and_import", "counts_launch",
                                             "compile_attempts", "flashinfer_builds", "launch_seconds")}))
    return finish(0 if result["ok"] else 1)


if __name__ == "__main__":
    sys.exit(main())
