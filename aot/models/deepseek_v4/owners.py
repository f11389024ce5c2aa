"""Which Triton kernels a DeepSeek-V4 deployment reaches through warmup owners, and how vLLM declares their keys.

Rows (see nojit.aot.runtimes.triton.rows) name vLLM's own warmup owner, the JITFunction it
launches, and the arguments vLLM's model code passes to `register_warmup` (file:line in vLLM
0.33.0), as a function of the deployment. Rows are tagged with the group they belong to, so a
build can select them. The model runners' owners are in aot/models/runner/owners.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.models.deepseek_v4.config import hf_config, layer_compress_ratios
from nojit.aot.runtimes.triton.rows import Registrations, TritonOwner
from nojit.aot.runtimes.triton.rows import once as _once


def _v1_spec(d: Deployment) -> bool:
    return d.spec_decode and "v1" in d.model_runners


DSV4 = "vllm.models.deepseek_v4"
SPEC_UTILS = "vllm.v1.spec_decode.utils"

# The eight Triton kernels of the original report (issue 2's vertical slice).
REPORT_KERNELS: tuple[TritonOwner, ...] = (
    TritonOwner(
        f"{DSV4}.common.ops.cache_utils:_COMBINE_TOPK_SWA_INDICES_KERNEL",
        f"{DSV4}.common.ops.cache_utils:CombineTopkSwaIndicesKernel.kernel",
        _once,
        "models/deepseek_v4/attention.py:430",
        ("report", "dsv4"),
    ),
    TritonOwner(
        f"{DSV4}.sparse_mla:_BUILD_C128A_TOPK_METADATA_KERNEL",
        f"{DSV4}.sparse_mla:BuildC128ATopkMetadataKernel.kernel",
        _once,
        "models/deepseek_v4/attention.py:449",
        ("report", "dsv4"),
    ),
    TritonOwner(
        "vllm.v1.attention.backends.mla.sparse_swa:_COMPUTE_PREFILL_METADATA_KERNEL",
        "vllm.v1.attention.backends.mla.sparse_swa:ComputePrefillMetadataKernel.kernel",
        _once,
        "models/deepseek_v4/attention.py:386",
        ("report", "dsv4"),
    ),
    TritonOwner(
        "vllm.v1.attention.backends.mla.indexer:_BUILD_PREFILL_CHUNK_METADATA_KERNEL",
        "vllm.v1.attention.backends.mla.indexer:BuildPrefillChunkMetadataKernel.kernel",
        _once,
        "models/deepseek_v4/attention.py:407",
        ("report", "dsv4"),
    ),
    TritonOwner(
        f"{DSV4}.common.ops.fused_mtp_input_rmsnorm:_MTP_SHARED_HEAD_RMSNORM_KERNEL",
        f"{DSV4}.common.ops.fused_mtp_input_rmsnorm:MTPSharedHeadRMSNormKernel.kernel",
        lambda d: [{}] if d.spec_decode else [],
        "models/deepseek_v4/nvidia/mtp.py:148 (dropped at run time: registered after the registry closes)",
        ("report", "dsv4", "mtp"),
    ),
    TritonOwner(
        f"{SPEC_UTILS}:_eagle_step_slot_mapping_metadata",
        f"{SPEC_UTILS}:eagle_step_slot_mapping_metadata_kernel",
        lambda d: [dict(max_model_len=d.max_model_len, max_batch_size=d.max_num_seqs)] if _v1_spec(d) else [],
        "v1/spec_decode/llm_base_proposer.py:143",
        ("report", "spec-v1"),
    ),
    TritonOwner(
        f"{SPEC_UTILS}:_eagle_prepare_inputs_padded",
        f"{SPEC_UTILS}:eagle_prepare_inputs_padded_kernel",
        lambda d: [dict(max_batch_size=d.max_num_seqs)] if _v1_spec(d) else [],
        "v1/spec_decode/llm_base_proposer.py:147",
        ("report", "spec-v1"),
    ),
    TritonOwner(
        f"{SPEC_UTILS}:_eagle_prepare_next_token_padded",
        f"{SPEC_UTILS}:eagle_prepare_next_token_padded_kernel",
        lambda d: [
            dict(
                vocab_size=int(d.hf_config["vocab_size"]),
                num_sampled_tokens_per_req=d.num_speculative_tokens + 1,
                max_batch_size=d.max_num_seqs,
            )
        ]
        if _v1_spec(d)
        else [],
        "v1/spec_decode/llm_base_proposer.py:148",
        ("report", "spec-v1"),
    ),
)


def _ratios(d: Deployment) -> set[int]:
    return set(layer_compress_ratios(d))


def _when(cond: Callable[[Deployment], bool], regs: Registrations = _once) -> Registrations:
    return lambda d: regs(d) if cond(d) else []


def _has_indexer(d: Deployment) -> bool:  # only C4 layers build a DeepseekV4Indexer (attention.py:302)
    return 4 in _ratios(d)


def _swa_registration(d: Deployment) -> list[dict[str, Any]]:
    hf = hf_config(d)
    image = int(getattr(hf, "vision_max_n_token", 0)) if getattr(hf, "vision_n_layers", 0) > 0 else 0  # attention.py:230-234
    # block_size: DeepseekV4SWACache's default 64 (sparse_swa.py:85; attention.py:349 passes none)
    return [dict(window_size=int(hf.sliding_window), block_size=64, max_image_tokens=image)]


def _save_partial_states_registrations(d: Deployment) -> list[dict[str, Any]]:
    """One per compressor kind: main (head_dim, each ratio > 1; attention.py:369-378) and the
    indexer's (index_head_dim, ratio 4; attention.py:1037). Registered at compressor.py:317."""
    hf, ratios = hf_config(d), _ratios(d)
    regs = [dict(head_dim=int(hf.head_dim), compress_ratio=r) for r in sorted(ratios) if r > 1]
    if 4 in ratios:
        regs.append(dict(head_dim=int(hf.index_head_dim), compress_ratio=4))
    return regs


def _pack_registration(d: Deployment) -> list[dict[str, Any]]:
    # FP8 indexer cache (indexer_kv_dtype auto -> fp8): current_platform.fp8_dtype() is e4m3fn
    # on CUDA. PAD_VALUE -inf is a float constexpr; keys carry it tagged as "-inf".
    return [dict(dtype=torch.float8_e4m3fn, pad_value=-float("inf"))]


MLA_BACKENDS = "vllm.v1.attention.backends.mla"
CACHE_UTILS = f"{DSV4}.common.ops.cache_utils"

# The rest of the DeepSeek-V4 model path on sm_90 (FlashMLA sparse backend, fp8_ds_mla).
# Registration sites are in vLLM 0.33.0; `_when` mirrors the condition around each.
DSV4_OWNERS: tuple[TritonOwner, ...] = (
    TritonOwner(
        f"{MLA_BACKENDS}.sparse_swa:_COMPUTE_SWA_INDICES_AND_LENS_KERNEL",
        f"{MLA_BACKENDS}.sparse_swa:_compute_swa_indices_and_lens_kernel",
        _swa_registration,
        "models/deepseek_v4/attention.py:387",
    ),
    TritonOwner(
        f"{MLA_BACKENDS}.compressor_utils:_COMPRESSED_SLOT_MAPPING_KERNEL",
        f"{MLA_BACKENDS}.compressor_utils:CompressedSlotMappingKernel.kernel",
        _when(lambda d: max(_ratios(d)) > 1),
        "models/deepseek_v4/attention.py:398 (compress_ratio > 1)",
    ),
    TritonOwner(
        f"{MLA_BACKENDS}.indexer:_PREPARE_UNIFORM_DECODE_KERNEL",
        f"{MLA_BACKENDS}.indexer:PrepareUniformDecodeKernel.kernel",
        _when(_has_indexer),
        "models/deepseek_v4/attention.py:406 (layers with an indexer)",
    ),
    TritonOwner(
        "vllm.models.common.ops.fused_qk_rmsnorm:_FUSED_Q_KV_RMSNORM_KERNEL",
        "vllm.models.common.ops.fused_qk_rmsnorm:FusedQKVRMSNormKernel.kernel",
        _once,
        "models/deepseek_v4/attention.py:434",
    ),
    TritonOwner(
        f"{DSV4}.common.ops.fused_inv_rope_fp8_quant:_FUSED_INV_ROPE_FP8_QUANT_KERNEL",
        f"{DSV4}.common.ops.fused_inv_rope_fp8_quant:FusedInvRopeFP8QuantKernel.kernel",
        _once,
        "models/deepseek_v4/attention.py:442 (CUDA; keys need the device capability, 9.0 here)",
    ),
    TritonOwner(
        f"{CACHE_UTILS}:_COMPUTE_GLOBAL_TOPK_INDICES_AND_LENS_KERNEL",
        f"{CACHE_UTILS}:ComputeGlobalTopkIndicesAndLensKernel.kernel",
        _once,
        "models/deepseek_v4/attention.py:457 (backend FLASHMLA_SPARSE_DSV4)",
    ),
    TritonOwner(
        f"{CACHE_UTILS}:_DEQUANTIZE_AND_GATHER_K_CACHE_KERNEL",
        f"{CACHE_UTILS}:DequantizeAndGatherKCacheKernel.kernel",
        _when(lambda d: not d.cutedsl),
        "models/deepseek_v4/attention.py:465 (without CuTeDSL)",
    ),
    TritonOwner(
        f"{DSV4}.common.ops.save_partial_states:_SAVE_PARTIAL_STATES_KERNEL",
        f"{DSV4}.common.ops.save_partial_states:SavePartialStatesKernel.kernel",
        _save_partial_states_registrations,
        "models/deepseek_v4/compressor.py:317 (every compressor)",
    ),
    TritonOwner(
        f"{DSV4}.common.ops.fused_compress_quant_cache:_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL",
        f"{DSV4}.common.ops.fused_compress_quant_cache:_fused_kv_compress_norm_rope_insert_indexer_attn",
        _when(_has_indexer),
        "models/deepseek_v4/compressor.py:352 (indexer compressor, head 128)",
    ),
    TritonOwner(
        f"{DSV4}.common.ops.fused_indexer_q:_FUSED_INDEXER_Q_ROPE_QUANT_TRITON_KERNEL",
        f"{DSV4}.common.ops.fused_indexer_q:FusedIndexerQRopeQuantTritonKernel.kernel",
        _when(lambda d: not d.cutedsl and _has_indexer(d)),
        "models/deepseek_v4/attention.py:1085 (without CuTeDSL; fp8 indexer cache)",
    ),
    TritonOwner(
        "vllm.v1.attention.ops.common:_PACK_SEQ_TRITON_KERNEL",
        "vllm.v1.attention.ops.common:PackSeqTritonKernel.kernel",
        _when(_has_indexer, _pack_registration),
        "model_executor/layers/sparse_attn_indexer.py:1073",
    ),
    TritonOwner(
        "vllm.v1.attention.ops.common:_UNPACK_SEQ_TRITON_KERNEL",
        "vllm.v1.attention.ops.common:UnpackSeqTritonKernel.kernel",
        _when(_has_indexer),
        "model_executor/layers/sparse_attn_indexer.py:1077",
    ),
    TritonOwner(
        f"{DSV4}.common.ops.fused_mtp_input_rmsnorm:_FUSED_MTP_INPUT_RMSNORM_KERNEL",
        f"{DSV4}.common.ops.fused_mtp_input_rmsnorm:FusedMTPInputRMSNormKernel.kernel",
        _when(lambda d: d.spec_decode),
        "models/deepseek_v4/nvidia/mtp.py:147 (dropped at run time: registered after the registry closes)",
        ("dsv4", "mtp"),
    ),
)
