"""Qwen3.5 / Qwen3-Next's Triton rows: every kernel vLLM's launch code reaches, keyed from those launches.

vLLM declares none of this model's kernels to its JIT warmup registry. The rows come from three sets
of vLLM's own launch code run on the stand-in GPU (launches.py): `qwen_triton_warmup` itself
(stand_in.qwen_warmup: the launches vLLM makes at startup), the layers' call sites per step kind and
batch size (call_sites.py), and the routed experts per M with vLLM's own tile-config lookup (moe.py).
Each set runs once per deployment and only when one of its kernels is selected (`--kernels`).
"""

from __future__ import annotations

from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.models.qwen3_5 import call_sites, moe
from nojit.aot.models.qwen3_5.config import text_config
from nojit.aot.models.qwen3_5.launches import Recorded
from nojit.aot.models.qwen3_5.stand_in import qwen_warmup
from nojit.aot.runtimes.triton.rows import DerivedKernel, Tensor

FLA = "vllm.third_party.flash_linear_attention.ops"
CONV = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
LAYER_NORM = f"{FLA}.layernorm_guard:layer_norm_fwd_kernel"
POST_CONV = f"{FLA}.fused_gdn_prefill_post_conv:_fused_post_conv_kernel"
SIGMOID = f"{FLA}.fused_sigmoid_gating:fused_sigmoid_gating_delta_rule_update_kernel"
PACKED = f"{FLA}.fused_recurrent:fused_recurrent_gated_delta_rule_packed_decode_kernel"
CONV_FWD = f"{CONV}:_causal_conv1d_fwd_kernel"
CONV_UPDATE = f"{CONV}:_causal_conv1d_update_kernel"
QK_NORM_ROPE = "vllm.model_executor.layers.fused_qk_norm_rope:_fused_qk_rmsnorm_rope_gate_kernel"
BATCH_MEMCPY = "vllm.v1.worker.mamba_utils:batch_memcpy_kernel"
FUSED_MOE = "vllm.model_executor.layers.fused_moe.fused_moe:fused_moe_kernel"

GDN = ("qwen", "qwen-gdn")
WARMUP = Recorded({"qwen_triton_warmup": qwen_warmup}, (LAYER_NORM, CONV_FWD, POST_CONV, SIGMOID))
SITES = Recorded(call_sites.LAUNCHES, (LAYER_NORM, CONV_FWD, POST_CONV, SIGMOID, PACKED, CONV_UPDATE,
                                       QK_NORM_ROPE, BATCH_MEMCPY))
MOE = Recorded({"routed_experts": moe.routed_experts}, (FUSED_MOE,))

WHY_WARMUP = "no warmup declaration; vLLM's own qwen_triton_warmup launches, run on the stand-in GPU"
WHY_SITE = "no warmup declaration; vLLM's wrapper at the layer's call site, run on the stand-in GPU per step and size"
WHY_MOE = "fused_moe_kernel with vLLM's own tile config per M (try_get_optimal_moe_config), run on the stand-in GPU"


def _rows(recorded: Recorded, site: str, why: str, groups: tuple[str, ...]) -> tuple[DerivedKernel, ...]:
    return tuple(DerivedKernel(k, site, recorded.of(k), why, groups) for k in recorded.kernels)


ROPE = "vllm.v1.worker.gpu.mm.rope:_prepare_rope_positions_kernel"


def _mrope_positions(d: Deployment) -> list[dict[str, Any]]:
    """The V2 runner's M-RoPE positions (gpu/mm/rope.py:98-115, RopeState made when the model uses M-RoPE,
    :118-135): positions [3, max_num_tokens + 1] int64 (:52), the staged prefill positions [max_num_seqs * 3,
    max_model_len] int32 passed with strides 3 * max_model_len and max_model_len (UVA, offset 0)."""
    rope = text_config(d.hf_config).get("rope_parameters") or text_config(d.hf_config).get("rope_scaling") or {}
    if "v2" not in d.model_runners or not rope.get("mrope_section"):
        return []
    dims = 3  # mrope_num_dims: T, H, W
    i32, i64 = torch.int32, torch.int64
    return [dict(positions_ptr=Tensor(i64), positions_stride=d.max_num_batched_tokens + 1,
                 prefill_positions_ptr=Tensor(i32), prefill_positions_stride0=dims * d.max_model_len,
                 prefill_positions_stride1=d.max_model_len, prefill_delta_ptr=Tensor(i32),
                 idx_mapping_ptr=Tensor(i64), query_start_loc_ptr=Tensor(i32), prefill_lens_ptr=Tensor(i32),
                 num_computed_tokens_ptr=Tensor(i32), BLOCK_SIZE=1024, NUM_DIMS=dims)]


QWEN_DERIVED: tuple[DerivedKernel, ...] = (
    _rows(WARMUP, "model_executor/warmup/qwen_triton_warmup.py:386", WHY_WARMUP, GDN)
    + _rows(SITES, "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:1556-2237", WHY_SITE, GDN)
    + _rows(MOE, "model_executor/layers/fused_moe/experts/triton_moe.py:322", WHY_MOE, ("qwen", "qwen-moe"))
    + (DerivedKernel(ROPE, "v1/worker/gpu/mm/rope.py:106", _mrope_positions,
                     "unregistered V2 runner kernel of M-RoPE models; warmed only by gpu/warmup.py's fake steps",
                     ("qwen", "runner", "runner-v2")),)
)
