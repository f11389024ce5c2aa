"""The Qwen3.5 / Qwen3-Next layers' Triton launches, run through vLLM's own wrappers on the stand-in GPU.

Each function restates one call site of vLLM 0.33.0 (file:line) with tensors laid out as the layer
passes them there (which views, which strides, which dtypes), then calls vLLM's own wrapper, which
computes every kernel argument (strides, constexpr choices, Triton heuristics) itself. The caches are
laid out as vLLM's runner allocates them (`stand_in.py`). Steps, as the GDN layer sees them with MTP on
(gdn/qwen_gdn_linear_attn.py): prefill-only (`_forward_core`, :1556), prefill mixed with spec decodes
(index_select'ed, contiguous pieces), spec-decode-only (the fused CUDA MTP kernel after a Triton conv
update, :2033), and non-spec decode (the packed recurrent decode, :1981; reached without MTP).

Counts are one per Triton int class and per wrapper choice: tokens and requests 1, 2, 3, 16, 17, 64,
255, 1024 and the deployment's maxima.
"""

from __future__ import annotations

from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.models.qwen3_5.config import text_config
from nojit.aot.models.qwen3_5.stand_in import GDN, gdn_layer
from nojit.aot.vllm_env import import_kernel_module

COUNTS = (1, 2, 3, 16, 17, 64, 255, 1024)
CONV = "vllm.model_executor.layers.mamba.ops.causal_conv1d"
FLA = "vllm.third_party.flash_linear_attention.ops"


def token_counts(d: Deployment) -> list[int]:
    return sorted({n for n in COUNTS if n <= d.max_num_batched_tokens} | {d.max_num_batched_tokens})


def request_counts(d: Deployment) -> list[int]:
    return sorted({n for n in COUNTS if n <= d.max_num_seqs} | {d.max_num_seqs})


def _k(d: Deployment) -> int:
    return d.num_speculative_tokens if d.spec_decode else 0


def _projections(layer: Any, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """in_proj_qkvz / in_proj_ba outputs split as forward does (:1169-1184, fused-norm path :2130-2137):
    mixed_qkv and the gate are views of one [n, conv_dim + value_dim] row; b, a are halves of [n, 2 hv]."""
    f: GDN = layer.facts
    qkvz = torch.empty((n, f.conv_dim + f.hv * f.v), dtype=layer.dtype, device=device)
    mixed_qkv, gate = qkvz.split([f.conv_dim, f.hv * f.v], dim=-1)
    ba = torch.empty((n, 2 * f.hv), dtype=layer.dtype, device=device)
    b, a = ba.chunk(2, dim=-1)
    return mixed_qkv, gate.reshape(n, -1, f.v), b, a


def _ints(values: list[int] | int, device: torch.device, dtype: torch.dtype = torch.int32) -> torch.Tensor:
    n = values if isinstance(values, int) else len(values)
    return torch.empty((n,), dtype=dtype, device=device)


def prefill(d: Deployment, device: torch.device) -> None:
    """Prefill steps (no spec decode in the batch): causal_conv1d_fn on the transposed split view (:1668),
    fused_post_conv_prep (:1731), the gated RMSNorm after the core (:2237 -> :2164 layer_norm_fwd)."""
    conv = import_kernel_module(CONV)
    post = import_kernel_module(f"{FLA}.fused_gdn_prefill_post_conv")
    layer = gdn_layer(d, device)
    f = layer.facts
    for t in token_counts(d):
        for mixed in (True, False):  # with spec decodes in the step the pieces are index_select'ed (contiguous)
            if mixed and not d.spec_decode:
                continue
            mixed_qkv, gate, b, a = _projections(layer, t, device)
            if mixed:
                mixed_qkv, b, a = mixed_qkv.contiguous(), b.contiguous(), a.contiguous()
            else:
                b, a = b.contiguous(), a.contiguous()  # _forward_core_fused_norm (:2230)
            reqs = min(t, 3)
            out = conv.causal_conv1d_fn(
                mixed_qkv.transpose(0, 1), layer.conv_weights, None, activation="silu",
                conv_states=layer.conv_state, has_initial_state=_ints(reqs, device, torch.bool),
                cache_indices=_ints(reqs, device), query_start_loc=_ints(reqs + 1, device), metadata=None,
            ).transpose(0, 1)
            post.fused_post_conv_prep(
                conv_output=out, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias, num_k_heads=f.h,
                head_k_dim=f.k, head_v_dim=f.v, apply_l2norm=True, output_g_exp=False)
            core = torch.zeros((t, f.hv, f.v), dtype=layer.dtype, device=device)
            layer.rms_norm_gated(core, gate, core)


def spec_decode(d: Deployment, device: torch.device) -> bool | None:
    """MTP verification steps. Spec-only: the conv update on the split view (:2059), then vLLM's fused CUDA
    kernel (not Triton). Mixed with prefills or decodes: index_select'ed conv update (:1646) and
    fused_sigmoid_gating_delta_rule_update with the accepted counts (:1760), then the gated RMSNorm."""
    if not d.spec_decode:
        return False
    conv = import_kernel_module(CONV)
    sig = import_kernel_module(f"{FLA}.fused_sigmoid_gating")
    layer = gdn_layer(d, device)
    f, q = layer.facts, _k(d) + 1
    for reqs in request_counts(d):
        n = reqs * q
        state_indices = torch.empty((reqs, q), dtype=torch.int32, device=device)  # spec_state_indices_tensor
        accepted, cu = _ints(reqs, device), _ints(reqs + 1, device)
        mixed_qkv, gate, b, a = _projections(layer, n, device)
        conv.causal_conv1d_update(  # spec-only (fused norm path): the split view
            mixed_qkv, layer.conv_state, layer.conv_weights, None, "silu",
            conv_state_indices=state_indices[:reqs, 0], num_accepted_tokens=accepted[:reqs],
            query_start_loc=cu[: reqs + 1], max_query_len=q, validate_data=False)
        spec_qkv = mixed_qkv.contiguous()  # mixed step: index_select(0, spec_token_indx)
        out = conv.causal_conv1d_update(
            spec_qkv, layer.conv_state, layer.conv_weights, None, "silu",
            conv_state_indices=state_indices[:, 0][:reqs], num_accepted_tokens=accepted,
            query_start_loc=cu, max_query_len=q, validate_data=False)
        qq, kk, vv = layer.rearrange_mixed_qkv(out)
        sig.fused_sigmoid_gating_delta_rule_update(
            A_log=layer.A_log, a=a.contiguous(), b=b.contiguous(), dt_bias=layer.dt_bias, q=qq, k=kk, v=vv,
            initial_state=layer.ssm_state, inplace_final_state=True, cu_seqlens=cu[: reqs + 1],
            ssm_state_indices=state_indices, num_accepted_tokens=accepted, use_qk_l2norm_in_kernel=True)
        core = torch.zeros((n, f.hv, f.v), dtype=layer.dtype, device=device)
        layer.rms_norm_gated(core, gate, core)


def decode(d: Deployment, device: torch.device) -> None:
    """Non-spec decode: the conv update (:2009) and the packed recurrent decode (:2019); and, in a step that
    mixes decodes with prefills, the decodes' sigmoid-gating update (:1787) on the split-off decode tokens."""
    conv = import_kernel_module(CONV)
    rec = import_kernel_module(f"{FLA}.fused_recurrent")
    sig = import_kernel_module(f"{FLA}.fused_sigmoid_gating")
    layer = gdn_layer(d, device)
    f = layer.facts
    for reqs in request_counts(d):
        mixed_qkv, _, b, a = _projections(layer, reqs, device)
        b, a = b.contiguous(), a.contiguous()
        indices = _ints(reqs, device)
        out = conv.causal_conv1d_update(mixed_qkv, layer.conv_state, layer.conv_weights, None, "silu",
                                        conv_state_indices=indices[:reqs], validate_data=False)
        core = torch.zeros((reqs, f.hv, f.v), dtype=layer.dtype, device=device)
        rec.fused_recurrent_gated_delta_rule_packed_decode(
            mixed_qkv=out, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias, scale=f.k ** -0.5,
            initial_state=layer.ssm_state, out=core[:reqs].unsqueeze(1), ssm_state_indices=indices[:reqs],
            use_qk_l2norm_in_kernel=True)
        # A prefill step with decodes in it: the non-spec pieces go through causal_conv1d_fn (above, in
        # prefill); the decodes' recurrence is the sigmoid-gating update on their rows.
        qq, kk, vv = layer.rearrange_mixed_qkv(mixed_qkv)
        sig.fused_sigmoid_gating_delta_rule_update(
            A_log=layer.A_log, a=a, b=b, dt_bias=layer.dt_bias, q=qq, k=kk, v=vv,
            initial_state=layer.ssm_state, inplace_final_state=True, cu_seqlens=_ints(reqs + 1, device),
            ssm_state_indices=indices, use_qk_l2norm_in_kernel=True)


def attention_qk_norm_rope_gate(d: Deployment, device: torch.device) -> None:
    """The full-attention layers' fused split + QK-RMSNorm + partial RoPE + gate (models/qwen3_next.py:407-431):
    q_gate, k are views of the qkv projection; positions are the runners' M-RoPE buffer (3, max_num_tokens + 1)
    int64 (gpu_model_runner.py:844, gpu/mm/rope.py:52) for an M-RoPE checkpoint, else 1-D."""
    mod = import_kernel_module("vllm.model_executor.layers.fused_qk_norm_rope")
    tc = text_config(d.hf_config)
    tp = d.tensor_parallel_size
    heads = int(tc["num_attention_heads"]) // tp
    kv_heads = max(1, int(tc["num_key_value_heads"]) // tp)
    head_dim = int(tc.get("head_dim") or int(tc["hidden_size"]) // int(tc["num_attention_heads"]))
    rope = tc.get("rope_parameters") or tc.get("rope_scaling") or {}
    rotary = int(head_dim * float(rope.get("partial_rotary_factor", tc.get("partial_rotary_factor", 1.0))))
    section = rope.get("mrope_section") if rope.get("mrope_interleaved") else None
    dtype = getattr(torch, d.dtype)
    weight = torch.empty((head_dim,), dtype=dtype, device=device)
    cache = torch.empty((int(tc["max_position_embeddings"]), rotary), dtype=dtype, device=device)
    buffer = torch.empty((3, d.max_num_batched_tokens + 1), dtype=torch.int64, device=device)
    for t in token_counts(d):
        qkv = torch.empty((t, (2 * heads + 2 * kv_heads) * head_dim), dtype=dtype, device=device)
        q_gate, k, _ = qkv.split([2 * heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        positions = buffer[:, :t] if section else buffer[0, :t]
        mod.fused_qk_rmsnorm_rope_gate(q_gate, k, weight, weight, cache, positions, 1e-6, heads, kv_heads, head_dim,
                                       rotary, norm_beta=1.0, mrope_section=section)


def prefix_cache_copy(d: Deployment, device: torch.device) -> None:
    """Mamba prefix-cache state copies (v1/worker/mamba_utils.py:1391 -> batch_memcpy :657; warmed by
    mamba_triton_warmup.py:29 with int32 sizes): u64 pointers and int32 sizes."""
    mu = import_kernel_module("vllm.v1.worker.mamba_utils")
    for n in (1, 3, 16):
        mu.batch_memcpy(_ints(n, device, torch.uint64), _ints(n, device, torch.uint64), _ints(n, device))


LAUNCHES = {
    "prefill": prefill,
    "spec_decode": spec_decode,
    "decode": decode,
    "attention_qk_norm_rope_gate": attention_qk_norm_rope_gate,
    "prefix_cache_copy": prefix_cache_copy,
}
