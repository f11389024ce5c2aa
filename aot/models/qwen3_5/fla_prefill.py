"""The GDN layers' Triton prefill (`--gdn-prefill-backend triton`): FLA's autotuned chunk kernels, through
vLLM's own `ChunkGatedDeltaRule.forward_native`, per prefill chunk shape.

vLLM's log on sm_90 suggests this backend to avoid FlashInfer's JIT (gdn/qwen_gdn_linear_attn.py:306-310);
then `forward_native` (:434) calls FLA's `chunk_gated_delta_rule`, whose kernels are `triton.autotune`d
(cumsum, scaled_dot_kkt, solve_tril, wy_fast, chunk_delta_h, chunk_o). vLLM reaches it from two places:
`_forward_core`'s prefill (:1823; with this backend there is no checkpointed prefill: only FlashInfer's
emits checkpoints, :691-702, so prefix caching splits the prefill at block boundaries instead), with the
chunk metadata vLLM's GDN metadata builder precomputes (`_build_chunk_metadata`, gdn_attn.py:271-310), and
the startup warmup (`_warmup_prefill_kernels`, :1308: one 64-token chunk, no chunk metadata). Both pass
q, k, v, g, beta from `fused_post_conv_prep` ([1, T, heads, dim] in the model dtype, g and beta fp32), an
initial state (`ssm_state[prefill_state_indices]` with the no-history rows zeroed: always a tensor),
`output_final_state=True` and `use_qk_l2norm_in_kernel=False` (the l2norm is fused into the prep).

The build runs these calls on the stand-in GPU while Triton's Autotuner is intercepted
(aot/runtimes/triton/autotune.py): every tuning key and every config Triton's own pruning keeps.
With FlashInfer's backend (the default) nothing here runs.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.models.qwen3_5.config import GDN, gdn_prefill_backend
from nojit.aot.models.qwen3_5.launches import stand_in_device
from nojit.aot.models.qwen3_5.prefill_inputs import chunk_shapes, layer, tensors
from nojit.aot.vllm_env import import_kernel_module

GDN_ATTN = "vllm.v1.attention.backends.gdn_attn"
FLA = "vllm.third_party.flash_linear_attention.ops"
SITE = "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:1823,1399 -> :434 forward_native"
# Every autotuned JITFunction FLA's chunk path can reach (ops/chunk.py:23-85): the scalar cumsum (g is
# [B, T, H]), and solve_tril's kernels for each chunk size it supports (vLLM's is 64).
KERNELS = (
    f"{FLA}.cumsum:chunk_local_cumsum_scalar_kernel",
    f"{FLA}.cumsum:chunk_local_cumsum_vector_kernel",
    f"{FLA}.chunk_scaled_dot_kkt:chunk_scaled_dot_kkt_fwd_kernel",
    f"{FLA}.solve_tril:solve_tril_16x16_kernel",
    f"{FLA}.solve_tril:merge_16x16_to_32x32_inverse_kernel",
    f"{FLA}.solve_tril:merge_16x16_to_64x64_inverse_kernel",
    f"{FLA}.wy_fast:recompute_w_u_fwd_kernel",
    f"{FLA}.chunk_delta_h:chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
    f"{FLA}.chunk_o:chunk_fwd_kernel_o",
    f"{FLA}.l2norm:l2norm_fwd_kernel1",
    f"{FLA}.l2norm:l2norm_fwd_kernel",
    f"{FLA}.l2norm:l2norm_fwd_kernel2",
)


def calls(d: Deployment) -> list[dict[str, Any]]:
    """One call per (tokens, sequences) of `_forward_core`, and the warmup's; none unless the backend is triton."""
    if gdn_prefill_backend(d) != "triton":
        return []
    facts = layer(d)
    warmup = {**facts, "tokens": 64, "seqs": 1, "warmup": True}  # FLA_CHUNK_SIZE tokens (:1345)
    return [warmup, *({**facts, "tokens": t, "seqs": n, "warmup": False} for t, n in chunk_shapes(d))]


def prefill(call: dict[str, Any], device: torch.device) -> None:
    """vLLM's forward_native with the arguments `_forward_core` (:1823) or the warmup (:1399) passes."""
    gdn, attn = import_kernel_module(GDN), import_kernel_module(GDN_ATTN)
    n, hv, k, v = (call[x] for x in ("seqs", "hv", "k", "v"))
    x = tensors(call, device)
    initial_state = torch.zeros((n, hv, v, k), dtype=getattr(torch, call["state_dtype"]), device=device)
    cu_seqlens = x["cu_seqlens"]
    chunk_indices = chunk_offsets = None
    if not call["warmup"]:  # the metadata builder's own code, as it runs for this backend (gdn_attn.py:549-556)
        builder = SimpleNamespace(gdn_prefill_backend="triton")
        chunk_indices, chunk_offsets = attn.GDNAttentionMetadataBuilder._build_chunk_metadata(
            builder, cu_seqlens, cu_seqlens.cpu(), device)
    gdn.ChunkGatedDeltaRule.forward_native(
        None, **x, initial_state=initial_state, output_final_state=True, chunk_indices=chunk_indices,
        chunk_offsets=chunk_offsets, use_qk_l2norm_in_kernel=False)


def run(d: Deployment) -> bool:
    """Every call of this deployment on the stand-in GPU; False when the deployment does not use this backend.
    The metadata builder's host-to-device copy stages in pinned memory, which needs a driver: not on the stand-in
    (the copy's result, a CPU tensor of the same dtype, is the same)."""
    todo = calls(d)
    if not todo:
        return False
    torch_utils = import_kernel_module("vllm.utils.torch_utils")
    pinned, torch_utils.PIN_MEMORY = torch_utils.PIN_MEMORY, False
    try:
        with stand_in_device() as device:
            for call in todo:
                prefill(call, device)
    finally:
        torch_utils.PIN_MEMORY = pinned
    return True
