"""Qwen3.5 / Qwen3-Next's Triton rows: every kernel vLLM's launch code reaches, keyed from those launches.

vLLM declares none of this model's kernels to its JIT warmup registry. The rows come from three sets
of vLLM's own launch code run on the stand-in GPU (launches.py): `qwen_triton_warmup` itself
(stand_in.qwen_warmup: the launches vLLM makes at startup), the layers' call sites per step kind and
batch size (call_sites.py), and the routed experts per M with vLLM's own tile-config lookup (moe.py).
Each set runs once per deployment and only when one of its kernels is selected (`--kernels`).
"""

from __future__ import annotations

from nojit.aot.models.qwen3_5 import call_sites, moe
from nojit.aot.models.qwen3_5.launches import Recorded
from nojit.aot.models.qwen3_5.stand_in import qwen_warmup
from nojit.aot.runtimes.triton.rows import DerivedKernel

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


QWEN_DERIVED: tuple[DerivedKernel, ...] = (
    _rows(WARMUP, "model_executor/warmup/qwen_triton_warmup.py:386", WHY_WARMUP, GDN)
    + _rows(SITES, "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py:1556-2237", WHY_SITE, GDN)
    + _rows(MOE, "model_executor/layers/fused_moe/experts/triton_moe.py:322", WHY_MOE, ("qwen", "qwen-moe"))
)
