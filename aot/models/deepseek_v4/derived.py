"""Derived keys for DeepSeek-V4 model kernels (see nojit.aot.runtimes.triton.rows for what a row is).

Three kinds, each read from vLLM 0.33.0's call sites:
- keys vLLM's declaration misses: CombineTopkSwaIndicesKernel's pointer-alignment
  combinations that prefill chunking reaches;
- keys vLLM's declaration gets wrong: the indexer compressor's KV_BLOCK_STRIDE constexpr
  (the pool's bytes per block, not a page) and the `launch_pdl=False` launch option the
  compressor passes to it and to SavePartialStatesKernel (their warmup passes none, and a
  launch option is part of Triton's key);
- plain @triton.jit kernels with no warmup owner: _fill_short_context_topk_indices,
  _dsv4_topk_kernel, _token_request_mapping_kernel.
"""

from __future__ import annotations

from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.models.deepseek_v4.config import hf_config, indexer_kv_block_stride, layer_compress_ratios
from nojit.aot.runtimes.triton.rows import DerivedKernel, Tensor

I32, I64, F32, BF16, U8, BOOL = torch.int32, torch.int64, torch.float32, torch.bfloat16, torch.uint8, torch.bool
DSV4 = "vllm.models.deepseek_v4"


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _c128a_widths(d: Deployment) -> list[int]:
    """Every C128A active top-k width: min(max(next_pow2(max_seq_len // 128), 128), cmax)
    with cmax = round_up(cdiv(max_model_len, 128), 128) (sparse_mla.py:158-163, 253-259)."""
    cmax = _round_up(-(-d.max_model_len // 128), 128)
    widths, w = [], 128
    while True:
        widths.append(min(w, cmax))
        if w >= cmax:
            return widths
        w *= 2


def _combine_calls(d: Deployment) -> list[dict[str, Any]]:
    """Prefill combine, nvidia/flashmla.py:361-395 -> cache_utils.py:790 -> launch :1067-1079.

    Per chunk of the prefill plan (sparse_swa.py:260-339), the call passes
    query_start_loc[num_decodes + chunk_start:] and seq_lens[num_decodes:][chunk_start:]
    (aligned iff (num_decodes + chunk_start) % 4 == 0, int32 from an aligned base) and
    gather_lens[chunk_start:] (a fresh buffer, sparse_swa.py:970: aligned iff
    chunk_start % 4 == 0). topk_indices is a row slice of a buffer whose rows are 2 KiB
    (C4, SWA-only) or 4*cmax bytes (C128A), always aligned, and it also fills the two
    visibility slots on text models (cache_utils.py:1070-1071). So all four (qsl/seq,
    gather) combinations occur; vLLM warms (T,T) and (F,T) only (cache_utils.py:993-1015).
    """
    hf = hf_config(d)
    if getattr(hf, "vision_n_layers", 0) > 0:
        raise BuildError("derived CombineTopkSwaIndices keys cover text models only (IMAGE_WIDTH 0)",
                         fix="record the keys of a vision deployment with NOJIT_MODE=record")
    topk, window = int(hf.index_topk), int(hf.sliding_window)
    groups: list[tuple[int, int, int]] = []  # (TOP_K, COMPRESS_RATIO, PADDED_TOP_K)
    for r in sorted(set(layer_compress_ratios(d))):
        if r == 128:  # TOP_K = topk_indices.shape[-1] = active width (flashmla.py:302-304)
            groups += [(w, r, _pow2(w)) for w in _c128a_widths(d)]
        elif r in (1, 4):  # SWA-only: TOP_K 0 over the C4 buffer's 512 columns (flashmla.py:305-309)
            groups.append((0 if r == 1 else topk, r, _pow2(topk)))
        else:
            raise BuildError(f"no CombineTopkSwaIndices derivation for compress ratio {r}", fix="report this to nojit")
    calls, cmax = [], _c128a_widths(d)[-1]
    for top_k, ratio, padded in groups:
        stride = cmax if ratio == 128 else topk
        for qsl_seq, gather in ((True, True), (False, True), (True, False), (False, False)):
            topk_indices = Tensor(I32, True)
            calls.append(dict(
                combined_indices_ptr=Tensor(I32), combined_indices_stride=_round_up(top_k + window, 128),
                combined_lens_ptr=Tensor(I32), topk_indices_ptr=topk_indices, topk_indices_stride=stride,
                query_start_loc_ptr=Tensor(I32, qsl_seq), seq_lens_ptr=Tensor(I32, qsl_seq),
                gather_lens_ptr=Tensor(I32, gather), left_visible_ptr=topk_indices, right_visible_ptr=topk_indices,
                M=_round_up(top_k + window, 128), N=top_k,  # do_not_specialize: any i32
                TOP_K=top_k, COMPRESS_RATIO=ratio, WINDOW_SIZE=window, IMAGE_WIDTH=0, PADDED_TOP_K=padded,
            ))
    return calls


def _state_cache_stride0(d: Deployment) -> int:
    """Compressor state caches are fp32 views of the same block-outermost pool: stride(0) is
    the pool's bytes per block / 4 (see dsv4_model)."""
    return indexer_kv_block_stride(d) // 4


def _save_partial_states_calls(d: Deployment) -> list[dict[str, Any]]:
    """compressor.py:396-407 with pdl_kwargs = {"launch_pdl": False} on CUDA (:384-388);
    launch save_partial_states.py:178-189. kv/score are the halves of an fp32 GEMM output
    [T, 2*coff*head] (attention.py:698-720), ape is [ratio, coff*head]."""
    hf, ratios = hf_config(d), set(layer_compress_ratios(d))
    kinds = [(int(hf.head_dim), r) for r in sorted(ratios) if r > 1]
    kinds += [(int(hf.index_head_dim), 4)] if 4 in ratios else []
    calls, stride0 = [], _state_cache_stride0(d) if kinds else 0
    for head_dim, ratio in kinds:
        coff = 2 if ratio == 4 else 1
        width = coff * head_dim
        calls.append(dict(
            kv_ptr=Tensor(F32), kv_stride=2 * width, score_ptr=Tensor(F32), score_stride=2 * width,
            ape_ptr=Tensor(F32), ape_stride=width, positions_ptr=Tensor(I64), state_cache_ptr=Tensor(F32),
            state_cache_stride0=stride0, state_cache_stride1=2 * width, slot_mapping_ptr=Tensor(I64),
            block_size=4 if ratio == 4 else 8,  # state cache block (compressor.py:168-171)
            HEAD_SIZE=width, TRITON_BLOCK_SIZE=_pow2(width), STATE_WIDTH=width, COMPRESS_RATIO=ratio,
            launch_pdl=False,
        ))
    return calls


def _indexer_compress_calls(d: Deployment) -> list[dict[str, Any]]:
    """Indexer compressor (head 128, fp8 cache): compressor.py:500-523 ->
    fused_compress_quant_cache.py:82-105 -> launch :1293-1320, with KV_BLOCK_STRIDE =
    kv_cache.stride(0) of the indexer K cache view (bytes per pool block, dsv4_model) and
    pdl_kwargs {"launch_pdl": False} (compressor.py:384-388). kv_cache.shape[1] = 256 / 4 =
    64 rows (indexer.py:354-357); MX_SCALE is False below SM100 (utils/deep_gemm.py:597-606)."""
    if 4 not in layer_compress_ratios(d):
        return []
    hf, block_stride = hf_config(d), indexer_kv_block_stride(d)
    head = int(hf.index_head_dim)
    return [dict(
        state_cache_ptr=Tensor(F32), state_cache_stride0=block_stride // 4, state_cache_stride1=4 * head,
        token_to_req_indices_ptr=Tensor(I32), positions_ptr=Tensor(I64), slot_mapping_ptr=Tensor(I64),
        block_table_ptr=Tensor(I32), block_table_stride=-(-d.max_model_len // 4), block_size=4,
        rms_norm_weight_ptr=Tensor(BF16), rms_norm_eps=float(hf.rms_norm_eps),
        cos_sin_cache_ptr=Tensor(F32), cos_sin_stride=int(hf.qk_rope_head_dim),  # fp32 cache (deepseek_scaling_rope.py:249)
        k_cache_ptr=Tensor(U8), kv_slot_mapping_ptr=Tensor(I64), kv_cache_block_size=d.block_size // 4,
        HEAD_SIZE=head, TRITON_BLOCK_SIZE=_pow2(head), STATE_WIDTH=2 * head, COMPRESS_RATIO=4, OVERLAP=True,
        ROPE_HEAD_DIM=int(hf.qk_rope_head_dim), FP8_MAX=448.0, QUANT_BLOCK=128, TOKEN_STRIDE=head, SCALE_DIM=4,
        KV_BLOCK_STRIDE=block_stride, MX_SCALE=False,
        num_warps=1, launch_pdl=False,
    )]


def _fill_short_context_calls(d: Deployment) -> list[dict[str, Any]]:
    """attention.py:1135-1143 (C4 indexer, eager, contexts with max_seq_len // 4 <= index_topk):
    output is the whole [max_num_batched_tokens, index_topk] int32 buffer (nvidia/model.py:848),
    positions the runner's int64 positions prefix."""
    if 4 not in layer_compress_ratios(d):
        return []
    topk = int(hf_config(d).index_topk)
    return [dict(output=Tensor(I32), positions=Tensor(I64), TOP_K=topk, COMPRESS_RATIO=4,
                 PADDED_TOP_K=_pow2(topk), num_warps=8)]


def _dsv4_topk_calls(d: Deployment) -> list[dict[str, Any]]:
    """dsv4_topk.py:152-168, reached from fused_topk_bias (fused_topk_bias_router.py:180-201)
    on every non-hash MoE layer, the MTP layer's included (nvidia/model.py:283-310).

    can_use_dsv4_topk (dsv4_topk.py:15-35) needs fp32 [T, 256|384] logits (GateLinear
    out_dtype fp32), a correction bias (created when topk_method == "noaux_tc"; the
    checkpoint's config.json carries it, transformers' DeepseekV4Config does not, so a
    missing field counts as noaux_tc here), top-6 and renormalize. Indices are int32
    (prepare/finalize without EP has no dtype constraint, prepare_finalize/no_dp_ep.py:117).
    is_padding: the runners' forward context holds a bool mask slice (V2
    model_runner.py:1398, V1 gpu_model_runner.py:3242) but the V2 MTP speculator passes
    none (target_dependent_ar/speculator.py:384), so HAS_PADDING takes both values.
    input_ids: always a tensor on this model (the hash layers refuse None,
    nvidia/model.py:455-456); bias_vl None and image_sentinel_lo 0 on text models.
    """
    hf = hf_config(d)
    experts, moe_layers = int(hf.n_routed_experts), list(hf.mlp_layer_types)
    usable = (
        getattr(hf, "topk_method", "noaux_tc") == "noaux_tc"
        and getattr(hf, "scoring_func", "sqrtsoftplus") == "sqrtsoftplus"
        and experts in (256, 384) and int(hf.num_experts_per_tok) == 6 and bool(hf.norm_topk_prob)
        and ("moe" in moe_layers or d.speculative_method == "mtp")
    )
    if not usable:
        return []
    if getattr(hf, "vision_n_layers", 0) > 0:
        raise BuildError("derived _dsv4_topk_kernel keys cover text models only", fix="record them with NOJIT_MODE=record")
    calls = []
    for padding in (True, False):
        calls.append(dict(
            gating_output_ptr=Tensor(F32), correction_bias_ptr=Tensor(F32),
            is_padding_ptr=Tensor(BOOL) if padding else None, topk_weights_ptr=Tensor(F32),
            topk_ids_ptr=Tensor(I32), routed_scaling_factor=hf.routed_scaling_factor, input_ids_ptr=Tensor(I32),
            bias_vl_ptr=None, image_sentinel_lo=0, NUM_EXPERTS=experts, BLOCK_N=_pow2(experts),
            HAS_PADDING=padding, HAS_VL=False, num_warps=1, launch_pdl=d.platform.pdl,
        ))
    return calls


def _token_request_mapping_calls(d: Deployment) -> list[dict[str, Any]]:
    """metadata.py:43-51 via CommonAttentionMetadata.token_to_req_indices (v1/attention/
    backend.py:496-517), called by the SWA, sparse-MLA and compressor metadata builders
    (sparse_swa.py:620, 858; sparse_mla.py:192; compressor.py:113): int32 query_start_loc
    prefix and int32 output buffer; the three ints are do_not_specialize."""
    return [dict(query_start_loc=Tensor(I32), output=Tensor(I32), num_reqs=d.max_num_seqs,
                 num_mapped=d.max_num_batched_tokens, num_tokens=d.max_num_batched_tokens, num_warps=4)]


DSV4_DERIVED: tuple[DerivedKernel, ...] = (
    DerivedKernel(
        f"{DSV4}.common.ops.cache_utils:CombineTopkSwaIndicesKernel.kernel",
        "models/deepseek_v4/nvidia/flashmla.py:361",
        _combine_calls,
        "vLLM warms three of the pointer-alignment rows; prefill chunks with chunk_start % 4 != 0 "
        "pass an unaligned gather_lens (inventory 3.6)",
    ),
    DerivedKernel(
        f"{DSV4}.common.ops.save_partial_states:SavePartialStatesKernel.kernel",
        "models/deepseek_v4/compressor.py:396",
        _save_partial_states_calls,
        "the call passes launch_pdl=False, a launch option in Triton's key; vLLM's warmup passes none",
    ),
    DerivedKernel(
        f"{DSV4}.common.ops.fused_compress_quant_cache:_fused_kv_compress_norm_rope_insert_indexer_attn",
        "models/deepseek_v4/common/ops/fused_compress_quant_cache.py:82",
        _indexer_compress_calls,
        "vLLM declares KV_BLOCK_STRIDE = one padded page (8640) and no launch_pdl; the call passes "
        "kv_cache.stride(0), the block-outermost pool's bytes per block, and launch_pdl=False (inventory 3.12)",
    ),
    DerivedKernel(
        f"{DSV4}.attention:_fill_short_context_topk_indices",
        "models/deepseek_v4/attention.py:1135",
        _fill_short_context_calls,
        "plain @triton.jit kernel with no warmup owner",
    ),
    DerivedKernel(
        "vllm.model_executor.layers.fused_moe.router.dsv4_topk:_dsv4_topk_kernel",
        "model_executor/layers/fused_moe/router/dsv4_topk.py:152",
        _dsv4_topk_calls,
        "plain @triton.jit kernel with no warmup owner",
    ),
    DerivedKernel(
        "vllm.v1.attention.ops.metadata:_token_request_mapping_kernel",
        "v1/attention/ops/metadata.py:43",
        _token_request_mapping_calls,
        "plain @triton.jit kernel with no warmup owner",
    ),
)
