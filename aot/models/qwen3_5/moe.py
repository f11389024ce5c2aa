"""The routed experts of a Qwen3.5 MoE block-FP8 checkpoint: vLLM's Triton fused_moe_kernel, one tile config per M.

On sm_90 with block-FP8 weights and TP (no expert parallelism) vLLM's FP8 MoE oracle puts Triton first
(fused_moe/oracle/fp8.py:122-132): `TritonExperts.apply` (experts/triton_moe.py:322) looks the tile config
up per number of tokens M with `try_get_optimal_moe_config` (fused_moe.py:1421: the JSON file named by E, N,
the device name, fp8_w8a8 and the block shape, nearest M key), assigns tokens to experts
(`_prepare_expert_assignment`, :1549: the naive path when M * top_k * 4 <= E, else moe_align_block_size,
whose CUDA fill is a no-op here: only its output sizes reach the kernel) and launches w13 then w2 through
`invoke_fused_moe_triton_kernel` (:761). Both the config lookup and the launch wrapper are vLLM's own;
the stand-in device name is the deployment's, so the lookup reads the same file as on the H200.

Unquantized (BF16) checkpoints, Qwen3-Next's shared-expert fusion and expert parallelism are not rowed here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.models.qwen3_5.config import text_config
from nojit.aot.vllm_env import import_kernel_module

FM = "vllm.model_executor.layers.fused_moe.fused_moe"
ALIGN = "vllm.model_executor.layers.fused_moe.moe_align_block_size"


def block_fp8(d: Deployment) -> list[int] | None:
    """The checkpoint's FP8 weight block ([128, 128]) or None when it is not a block-FP8 checkpoint."""
    q = d.hf_config.get("quantization_config") or text_config(d.hf_config).get("quantization_config") or {}
    if q.get("quant_method") != "fp8":
        return None
    block = q.get("weight_block_size")
    return list(block) if block else None


def token_counts(d: Deployment) -> list[int]:
    """M values: all up to 256 (every config key and the naive/aligned switch), then one per Triton int class
    (16k, 16k+1, 16k+7) of each 16-token step up to max_num_batched_tokens (the sorted-ids and token counts
    the kernel takes as ints follow M)."""
    top = d.max_num_batched_tokens
    return [m for m in range(1, top + 1) if m <= 256 or m % 16 in (0, 1, 7) or m == top]


@contextlib.contextmanager
def _no_cuda_fill() -> Iterator[None]:
    """moe_align_block_size's CUDA op only fills tensors whose sizes vLLM's Python already chose."""
    mod = import_kernel_module(ALIGN)
    original = mod.ops
    mod.ops = type("NoFill", (), {"moe_align_block_size": staticmethod(lambda *a, **k: None)})()
    try:
        yield
    finally:
        mod.ops = original


def routed_experts(d: Deployment, device: torch.device) -> bool | None:
    block = block_fp8(d)
    tc = text_config(d.hf_config)
    if block is None or "num_experts" not in tc:  # not rowed (BF16 experts) or a dense checkpoint: nothing reached
        return False
    fm = import_kernel_module(FM)
    tl = import_kernel_module("vllm.triton_utils").tl
    tp = d.tensor_parallel_size
    e, top_k, hidden = int(tc["num_experts"]), int(tc["num_experts_per_tok"]), int(tc["hidden_size"])
    inter = int(tc["moe_intermediate_size"])
    if inter % tp:
        raise BuildError(f"{d.source}: tensor_parallel_size {tp} does not divide moe_intermediate_size {inter}",
                         fix="choose a tensor_parallel_size that divides it")
    n = inter // tp
    fp8 = torch.float8_e4m3fn
    w13 = torch.empty((e, 2 * n, hidden), dtype=fp8, device=device)
    w2 = torch.empty((e, hidden, n), dtype=fp8, device=device)
    s13 = torch.empty((e, -(-2 * n // block[0]), -(-hidden // block[1])), dtype=torch.float32, device=device)
    s2 = torch.empty((e, -(-hidden // block[0]), -(-n // block[1])), dtype=torch.float32, device=device)
    dtype = getattr(torch, d.dtype)
    with _no_cuda_fill():
        for m in token_counts(d):
            config = fm.try_get_optimal_moe_config(w13.size(), w2.size(), top_k, "fp8_w8a8", m, block_shape=block)
            _launch(fm, tl, m, top_k, e, config, block, w13, w2, s13, s2, dtype, device)


def _launch(fm: Any, tl: Any, m: int, top_k: int, e: int, config: dict[str, Any], block: list[int],
            w13: torch.Tensor, w2: torch.Tensor, s13: torch.Tensor, s2: torch.Tensor, dtype: torch.dtype,
            device: torch.device) -> None:
    n, hidden = w2.size(2), w13.size(2)
    topk_ids = torch.empty((m, top_k), dtype=torch.int32, device=device)
    topk_weights = torch.empty((m, top_k), dtype=torch.float32, device=device)
    sorted_ids, expert_ids, post = fm._prepare_expert_assignment(topk_ids, config, m, top_k, e, None,
                                                                  block_shape=block, ignore_invalid_experts=False)
    # workspaces (triton_moe.py:347-352): cache1 [M, top_k, 2N], cache2 [M * top_k, N], cache3 [M, top_k, K]
    a1 = torch.empty((m, hidden), dtype=torch.float8_e4m3fn, device=device)
    a1_scale = torch.empty((m, -(-hidden // block[1])), dtype=torch.float32, device=device)
    cache1 = torch.empty((m, top_k, 2 * n), dtype=dtype, device=device)
    a2 = torch.empty((m * top_k, n), dtype=torch.float8_e4m3fn, device=device)
    a2_scale = torch.empty((m * top_k, -(-n // block[1])), dtype=torch.float32, device=device)
    cache3 = torch.empty((m, top_k, hidden), dtype=dtype, device=device)
    common = dict(compute_type=tl.bfloat16 if dtype == torch.bfloat16 else tl.float16, use_fp8_w8a8=True,
                  use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                  block_shape=block)
    fm.invoke_fused_moe_triton_kernel(a1, w13, cache1, a1_scale, s13, topk_weights, sorted_ids, expert_ids, post,
                                      False, top_k, config, **common)
    fm.invoke_fused_moe_triton_kernel(a2, w2, cache3, a2_scale, s2, topk_weights, sorted_ids, expert_ids, post,
                                      True, 1, config, **common)
