"""Derived keys for vLLM's model-runner kernels, for any model served through them (see triton_derived);
what depends on the model's KV-cache groups takes them from its room (`runner_derived(kv_groups)`).

The V2 runner (vllm/v1/worker/gpu, the default) launches plain @triton.jit kernels that no
warmup owner declares; vLLM only warms them by running fake scheduler steps
(v1/worker/gpu/warmup.py). Each row below restates one launch site of vLLM 0.33.0.

What "reached" means here. A kernel is reached when some request mix a server accepts by
default makes the runner launch it: every request uses any subset of the per-request
options temperature (0, 1 or other), top_p, top_k, min_p, repetition / frequency /
presence penalty, logit_bias, allowed_token_ids, min_tokens, bad_words and (sample)
logprobs, on a deployment with vLLM's default serving flags. That is the sampler feature
set of vLLM's own warmup (SamplingParams.for_sampler_warmup, sampling_params.py:1477)
minus prompt_logprobs and watermarking. Not covered (not reached by that mix, or needing a
non-default flag): structured outputs (grammar bitmask kernel, min_tokens row restore),
prompt logprobs, logprob_token_ids, watermarking, thinking budgets (reasoning config),
return_sampling_mask, VLLM_COMPUTE_NANS_IN_LOGITS, processed_* logprobs modes,
use_fp64_gumbel, probabilistic draft sampling, block / synthetic / FLy verification,
adaptive verification, batch-sharded sampling, pipeline / context parallelism, pooling,
multimodal inputs, and rejection-sampler chunking (needs more than 2**30 / (4 * vocab)
logits rows in a step: 2076 for DeepSeek-V4, above the 1024 * 2 of the default deployment).

Argument kinds. Tensors the runner allocates per step or keeps as persistent buffers are
passed from offset 0 (whole buffers, `[:n]` prefixes, fresh torch allocations, UVA views
of pinned host memory), so every pointer below is 16-byte aligned. Ints that vary at run
time are given one value per Triton class the runtime can produce (1, a multiple of 16,
other); ints fixed by the deployment are passed as their real value.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.models.runner import KVCacheGroup, KVGroups
from nojit.aot.runtimes.triton.rows import DerivedKernel, Tensor

I32, I64, U64, F32, BOOL = torch.int32, torch.int64, torch.uint64, torch.float32, torch.bool
ONE, DIV16, OTHER = 1, 16, 3  # one representative per Triton int class
MAX_LOGPROBS = 20  # ModelConfig.max_logprobs default (config/model.py): logprobs=0..20
BAD_WORDS_TOTAL_TOKENS, MAX_NUM_BAD_WORDS = 1024, 128  # vllm/envs.py defaults
GROUPS_V2 = ("runner", "runner-v2")
GROUPS_SPEC_V2 = ("runner", "runner-v2", "spec-v2")
Calls = list[dict[str, Any]]

IB = "vllm.v1.worker.gpu.input_batch"
BT = "vllm.v1.worker.gpu.block_table"
BU = "vllm.v1.worker.gpu.buffer_utils"
SMP = "vllm.v1.worker.gpu.sample"
RS = "vllm.v1.worker.gpu.spec_decode.rejection_sampler"
RSU = "vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils"
SPEC = "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator"


def T(dtype: Any) -> Tensor:
    return Tensor(dtype)


def grid(base: dict[str, Any], **axes: Iterable[Any]) -> Calls:
    """One call per combination of the axes' values (cartesian product)."""
    names = list(axes)
    return [{**base, **dict(zip(names, values))} for values in itertools.product(*axes.values())]


def pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


# ------------------------------------------------------------------------ deployment facts
def v2(d: Deployment) -> bool:
    return "v2" in d.model_runners


def spec_v2(d: Deployment) -> bool:
    return v2(d) and d.spec_decode


def text(d: Deployment) -> dict[str, Any]:
    """The language model's HF config, as vLLM's hf_text_config: `text_config` where the checkpoint nests it (Qwen3.5)."""
    inner = d.hf_config.get("text_config")
    return inner if isinstance(inner, dict) else d.hf_config


def vocab(d: Deployment) -> int:
    return int(text(d)["vocab_size"])


def k(d: Deployment) -> int:
    return d.num_speculative_tokens if d.spec_decode else 0


def raw_logits(d: Deployment) -> Tensor:
    """compute_logits output: head_dtype = hf_config head_dtype or the model dtype (config/model.py:2521)."""
    head = text(d).get("head_dtype")
    return T(getattr(torch, d.dtype if head in (None, "model") else str(head).lower()))


def raw_stride(d: Deployment) -> int:
    """Row stride of compute_logits output: the TP-gathered vocab is padded to 64
    (vocab_parallel_embedding.py:36, 286) and sliced to the vocab (logits_processor.py:198)."""
    return cdiv(vocab(d), 64) * 64


def logits_variants(d: Deployment) -> list[tuple[Tensor, int]]:
    """Sampler / rejection-sampler logits: raw when no request of the step needs processing
    (Sampler.apply_sampling_params returns them as is, sampler.py:239), else an fp32 copy (:242)."""
    return [(raw_logits(d), raw_stride(d)), (T(F32), vocab(d))]


def draft_stride(d: Deployment) -> int:
    """RequestState.draft_tokens is [max_num_seqs, k] (states.py:76): stride(0) is k, 1 for k <= 1."""
    return max(k(d), 1)


def lookahead(d: Deployment) -> int:
    """max(1, num_prefill_lookahead_tokens) (gpu/model_runner.py:280; config/vllm.py:655-675)."""
    layers = text(d).get("num_nextn_predict_layers", text(d).get("mtp_num_hidden_layers", 1))
    multi_module = min(int(layers), k(d)) > 1
    return k(d) if d.spec_decode and multi_module else 1


def on(cond: bool, calls: Calls) -> Calls:
    return calls if cond else []


# ------------------------------------------------------------------------ input batch
def _prepare_prefill_inputs(d: Deployment) -> Calls:
    n = lookahead(d)
    return on(v2(d), [dict(
        input_ids_ptr=T(I32), next_prefill_tokens_ptr=T(I32), next_prefill_tokens_stride=d.max_num_seqs,
        num_lookahead=n, idx_mapping_ptr=T(I64), query_start_loc_ptr=T(I32), all_token_ids_ptr=T(I32),
        all_token_ids_stride=d.max_model_len, prefill_lens_ptr=T(I32), num_computed_tokens_ptr=T(I32),
        BLOCK_SIZE=1024, LOOKAHEAD_BLOCK=pow2(n))])


def _prepare_pos_seq_lens(d: Deployment) -> Calls:
    return on(v2(d), [dict(
        pos_ptr=T(I64), seq_lens_ptr=T(I32), idx_mapping_ptr=T(I64), query_start_loc_ptr=T(I32),
        num_computed_tokens_ptr=T(I32), max_num_reqs=d.max_num_seqs, BLOCK_SIZE=1024)])


def _combine_sampled_and_draft_tokens(d: Deployment) -> Calls:
    return on(v2(d), [dict(
        input_ids_ptr=T(I32), idx_mapping_ptr=T(I64), last_sampled_tokens_ptr=T(I64), query_start_loc_ptr=T(I32),
        seq_lens_ptr=T(I32), prefill_len_ptr=T(I32), draft_tokens_ptr=T(I64), draft_tokens_stride=draft_stride(d),
        cu_num_logits_ptr=T(I32), logits_indices_ptr=T(I64),
        BLOCK_SIZE=pow2(k(d) + 1), NUM_NEW_SAMPLED_TOKENS=1)])


def _get_num_sampled_and_rejected(d: Deployment) -> Calls:
    return on(v2(d), [dict(
        num_sampled_ptr=T(I32), num_rejected_ptr=T(I32), seq_lens_ptr=T(I32), cu_num_logits_ptr=T(I32),
        idx_mapping_ptr=T(I64), prefill_len_ptr=T(I32))])


def _post_update(d: Deployment) -> Calls:
    # sampled_tokens: Sampler's sampled.view(-1, 1) (stride 1, sampler.py:217) or the
    # rejection sampler's [num_reqs, k + 1] (rejection_sampler_utils.py:1300).
    strides = [1] + ([k(d) + 1] if d.spec_decode else [])
    return on(v2(d), grid(dict(
        idx_mapping_ptr=T(I64), num_computed_tokens_ptr=T(I32), last_sampled_tokens_ptr=T(I64),
        output_bin_counts_ptr=T(I32), output_bin_counts_stride=vocab(d), sampled_tokens_ptr=T(I64),
        num_sampled_ptr=T(I32), num_rejected_ptr=T(I32), query_start_loc_ptr=T(I32), all_token_ids_ptr=T(I32),
        all_token_ids_stride=d.max_model_len, total_len_ptr=T(I32), draft_tokens_ptr=None,
        draft_tokens_out_ptr=T(I64), num_draft_tokens=0, num_warps=1), sampled_tokens_stride=strides))


def _expand_idx_mapping(d: Deployment) -> Calls:
    return on(spec_v2(d), [dict(
        idx_mapping_ptr=T(I64), expanded_idx_mapping_ptr=T(I64), expanded_local_pos_ptr=T(I32),
        cu_num_logits_ptr=T(I32), BLOCK_SIZE=pow2(k(d) + 1))])


# ------------------------------------------------------------------------ block tables, staged writes
def _gather_block_tables(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> Calls:
    # MASK_SLIDING_WINDOW: prepare_attn passes num_computed_tokens; the mask is on when a group is a
    # sliding window keeping tokens (gpu/model_runner.py:658, block_table.py:63; DeepSeek-V4's SWA and
    # compressor-state groups). num_reqs is do_not_specialize.
    return on(v2(d), [dict(
        batch_idx_to_req_idx=T(I64), src_block_table_ptrs=T(U64), dst_block_table_ptrs=T(U64),
        block_table_strides=T(I64), num_blocks_ptr=T(I32), num_blocks_stride=d.max_num_seqs, num_reqs=OTHER,
        num_computed_tokens_ptr=T(I32), sliding_window_reach_ptr=T(I32), block_sizes_ptr=T(I32),
        MASK_SLIDING_WINDOW=any(g.sliding_window for g in groups), BLOCK_SIZE=1024)])


def _compute_slot_mappings(d: Deployment) -> Calls:
    return on(v2(d), [dict(
        max_num_tokens=d.max_num_batched_tokens, idx_mapping=T(I64), query_start_loc=T(I32), pos=T(I64),
        block_table_ptrs=T(U64), block_table_strides=T(I64), block_sizes=T(I32), slot_mapping_enabled=T(BOOL),
        dcp_sharded=T(BOOL), slot_mappings_ptr=T(I64), slot_mappings_stride=d.max_num_batched_tokens, cp_rank=0,
        CP_SIZE=1, CP_INTERLEAVE=1, PAD_ID=-1, TRITON_BLOCK_SIZE=1024)])


def _apply_write(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> Calls:
    # StagedWriteTensor.apply_write: (target dtype, row stride) of each staged tensor.
    staged = [
        (I32, d.max_model_len),  # RequestState.all_token_ids (states.py:37), UVA
        (I32, 1),  # total_len, num_computed_tokens: 1-D (states.py:55, 61)
        (I32, 1024), (F32, 1024),  # allowed_token_ids, logit_bias token ids / values (logit_bias.py:33-44)
        (I32, 128),  # stop_token_ids for min_tokens (logit_bias.py:50)
        (I32, BAD_WORDS_TOTAL_TOKENS), (I32, MAX_NUM_BAD_WORDS + 1),  # bad_words.py:30-37
    ]
    calls = [dict(output_ptr=T(dt), output_stride=stride, write_indices_ptr=T(I32), write_starts_ptr=T(I32),
                  write_contents_ptr=T(dt), write_cu_lens_ptr=T(I32), write_group_ids_ptr=None,
                  BLOCK_SIZE=1024, MULTI_GROUP=False) for dt, stride in staged]
    # Block tables of several KV cache groups (DeepSeek-V4 has 256-, 64-, 8- and 4-token
    # groups): one FusedStagedWriter launch (buffer_utils.py:296, block_table.py:155). One group
    # writes its block table directly (block_table.py:149): a row no model here needs yet.
    if v2(d) and len(groups) < 2:
        raise BuildError(f"{d.source}: the V2 runner rows know block tables of several KV-cache groups only "
                         f"(this model has {len(groups)})",
                         fix="add the single-group apply_write row to aot/models/runner/derived.py")
    calls.append(dict(output_ptr=T(U64), output_stride=T(I64), write_indices_ptr=T(I32), write_starts_ptr=T(I32),
                      write_contents_ptr=T(I32), write_cu_lens_ptr=T(I32), write_group_ids_ptr=T(I32),
                      BLOCK_SIZE=1024, MULTI_GROUP=True))
    return on(v2(d), calls)


def _zero_kv_blocks(d: Deployment) -> Calls:
    # Both runners: DeepSeek-V4 mixes uint8 (fp8_ds_mla) and fp32 (compressor state)
    # attention caches, so needs_kv_cache_zeroing holds (kv_cache_interface.py:1652) and
    # KVBlockZeroer zeroes new blocks each step. BLOCK_SIZE = min(next_pow2(largest page in
    # int32 words), 1024) (utils.py:222): 1024, the largest (MLA) page is far over 4 KiB.
    return [dict(seg_addrs_ptr=T(U64), seg_block_strides_ptr=T(I64), seg_page_sizes_ptr=T(I64),
                 block_ids_ptr=T(I64), BLOCK_SIZE=1024)]


# ------------------------------------------------------------------------ Mamba state groups ("align" mode, V2)
MAMBA_TEMPORAL_TILES = 16  # v1/worker/mamba_utils.py:35


def _mamba(groups: tuple[KVCacheGroup, ...]) -> KVCacheGroup | None:
    """The first Mamba group (vLLM requires every Mamba group to share block size and spec blocks,
    mamba_utils.py:843-850), or None."""
    return next((g for g in groups if g.mamba), None)


def _mamba_width(d: Deployment, g: KVCacheGroup) -> int:
    """The Mamba groups' block-table row length: cdiv(max_model_len, block) + spec blocks in align mode
    (kv_cache_interface.py:1143-1153); MambaSpecDecodeGPUContext takes it as block_table_stride_req."""
    return cdiv(d.max_model_len, g.block_size) + g.speculative_blocks


def _scatter_num_accepted(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> Calls:
    return on(v2(d) and _mamba(groups) is not None, [dict(
        idx_mapping_ptr=T(I64), num_sampled_ptr=T(I32), num_accepted_ptr=T(I32))])


def _fill_num_accepted(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> Calls:
    # max(num_sampled, 1) with an int num_sampled (a step that samples nothing: 1; else the count)
    return on(v2(d) and _mamba(groups) is not None, grid(dict(
        idx_mapping_ptr=T(I64), num_accepted_ptr=T(I32)), num_sampled=(ONE, OTHER)))


def _preprocess_mamba_align(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> Calls:
    g = _mamba(groups)
    return on(v2(d) and g is not None, [dict(
        idx_mapping_ptr=T(I64), state_idx_ptr=T(I32), num_computed_tokens_ptr=T(I32), query_start_loc_ptr=T(I32),
        num_accepted_tokens_ptr=T(I32), src_col_ptr=T(I32), src_off_ptr=T(I32), num_reqs=OTHER,
        BLOCK_SIZE=256, MAMBA_BLOCK_SIZE=g.block_size if g else 0)])


def _state_layout(d: Deployment, g: KVCacheGroup) -> dict[str, Any]:
    """MambaSpecDecodeGPUContext's flattened state metadata (mamba_utils.py:870-906): int64 addresses, strides
    and inner sizes, int32 element sizes, conv widths, group indices and row counts; SD conv layout."""
    return dict(block_table_ptrs_ptr=T(I64), block_table_stride_req=_mamba_width(d, g), state_base_addrs_ptr=T(I64),
                state_block_strides_ptr=T(I64), state_elem_sizes_ptr=T(I32), state_inner_sizes_ptr=T(I64),
                state_conv_widths_ptr=T(I32), state_group_indices_ptr=T(I32), state_dim_row_count_ptr=T(I32),
                state_dim_row_stride_ptr=T(I64), COPY_BLOCK_SIZE=1024, CONV_STATE_DIM_FIRST=False,
                TEMPORAL_TILES=MAMBA_TEMPORAL_TILES)


def _precopy_mamba_align(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> Calls:
    g = _mamba(groups)
    return on(v2(d) and g is not None, [dict(
        mamba_state_idx_ptr=T(I32), src_col_ptr=T(I32), token_bias_ptr=T(I32), idx_mapping_ptr=T(I64),
        num_reqs=OTHER, HAS_IDX_MAPPING=True, **_state_layout(d, g))] if g else [])


def _postprocess_mamba_align(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> Calls:
    g = _mamba(groups)
    return on(v2(d) and g is not None, [dict(
        num_accepted_tokens_ptr=T(I32), mamba_state_idx_ptr=T(I32), num_scheduled_tokens_ptr=None,
        num_computed_tokens_ptr=T(I32), num_draft_tokens_ptr=None, num_accepted_tokens_out_ptr=T(I32),
        idx_mapping_ptr=T(I64), num_reqs=OTHER, block_size=g.block_size, HAS_IDX_MAPPING=True,
        PRECOMPUTED_NEW_COMPUTED=True, **_state_layout(d, g))] if g else [])


def _aligned_state_indices(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> Calls:
    # compute_aligned_state_indices (mamba_utils.py:1112): seq_lens int32 stride 1, aligned_state_indices
    # [n_mamba_groups, max_num_seqs, 1 + spec blocks] int32 (:907-915)
    g = _mamba(groups)
    if not (v2(d) and g is not None):
        return []
    n, slots = sum(x.mamba for x in groups), 1 + g.speculative_blocks
    return [dict(block_table_ptrs_ptr=T(I64), seq_lens_ptr=T(I32), state_indices_ptr=T(I32),
                 block_table_stride_req=_mamba_width(d, g), seq_lens_stride=1,
                 state_indices_stride_0=d.max_num_seqs * slots, state_indices_stride_1=slots,
                 state_indices_stride_2=1, num_requests=OTHER, CACHE_BLOCK_SIZE=g.block_size, NUM_GROUPS=n,
                 BLOCK_GROUPS=pow2(n), NUM_STATE_SLOTS=slots, BLOCK_STATE_SLOTS=pow2(slots), BLOCK_ROWS=32,
                 num_warps=1)]


# ------------------------------------------------------------------------ sampling
def _gumbel_sample(d: Deployment) -> Calls:
    nb = cdiv(vocab(d), 1024)
    return on(v2(d), [dict(
        local_argmax_ptr=T(I64), local_argmax_stride=nb, local_max_ptr=T(F32), local_max_stride=nb,
        logits_cache_ptr=None, logits_cache_stride_0=0, logits_cache_stride_1=0, logits_cache_col_ptr=None,
        logits_cache_source_ptr=None, logits_cache_source_stride=0, logits_ptr=lg, logits_stride=stride,
        expanded_idx_mapping_ptr=T(I64), seeds_ptr=T(I64), pos_ptr=T(I64), temp_ptr=T(F32), vocab_size=vocab(d),
        BLOCK_SIZE=1024, IS_DRAFTING=False, APPLY_TEMPERATURE=False, USE_FP64=False, PER_TOKEN_COL=False)
        for lg, stride in logits_variants(d)])


def _processed(d: Deployment, **kw: Any) -> Calls:
    """A logits processor's launch: fp32 logits copy, stride vocab (sampler.py:242)."""
    return on(v2(d), [dict(logits_ptr=T(F32), logits_stride=vocab(d), **kw)])


def _temperature(d: Deployment) -> Calls:
    return _processed(d, expanded_idx_mapping_ptr=T(I64), temperature_ptr=T(F32), vocab_size=vocab(d),
                      BLOCK_SIZE=8192)


def _min_p(d: Deployment) -> Calls:
    return _processed(d, expanded_idx_mapping_ptr=T(I64), min_p_ptr=T(F32), vocab_size=vocab(d), BLOCK_SIZE=1024)


def _penalties(d: Deployment) -> Calls:
    return _processed(d, expanded_idx_mapping_ptr=T(I64), token_ids_ptr=T(I32), expanded_local_pos_ptr=T(I32),
                      repetition_penalty_ptr=T(F32), frequency_penalty_ptr=T(F32), presence_penalty_ptr=T(F32),
                      prompt_bin_mask_ptr=T(I32), prompt_bin_mask_stride=cdiv(vocab(d), 32),
                      output_bin_counts_ptr=T(I32), output_bin_counts_stride=vocab(d), vocab_size=vocab(d),
                      BLOCK_SIZE=8192)


def _bincount(d: Deployment) -> Calls:
    return on(v2(d), [dict(
        expanded_idx_mapping_ptr=T(I64), all_token_ids_ptr=T(I32), all_token_ids_stride=d.max_model_len,
        prompt_len_ptr=T(I32), prefill_len_ptr=T(I32), prompt_bin_mask_ptr=T(I32),
        prompt_bin_mask_stride=cdiv(vocab(d), 32), output_bin_counts_ptr=T(I32),
        output_bin_counts_stride=vocab(d), BLOCK_SIZE=1024)])


def _bias(d: Deployment) -> Calls:
    # CHECK_ALL_MASKED_ROWS is True only for min_tokens with structured outputs (logit_bias.py:107, 137).
    return _processed(d, vocab_size=vocab(d), expanded_idx_mapping_ptr=T(I64),
                      num_allowed_token_ids_ptr=T(I32), allowed_token_ids_ptr=T(I32), allowed_token_ids_stride=1024,
                      num_logit_bias_ptr=T(I32), bias_token_ids_ptr=T(I32), bias_token_ids_stride=1024,
                      bias_ptr=T(F32), bias_stride=1024, pos_ptr=T(I64), min_lens_ptr=T(I32),
                      num_stop_token_ids_ptr=T(I32), restore_when_all_masked_ptr=T(I32),
                      stop_token_ids_ptr=T(I32), stop_token_ids_stride=128,
                      BLOCK_SIZE=1024, LOGITS_BLOCK_SIZE=8192, CHECK_ALL_MASKED_ROWS=False)


def _bad_words(d: Deployment) -> Calls:
    return _processed(d, expanded_idx_mapping_ptr=T(I64), bad_word_token_ids_ptr=T(I32),
                      bad_word_token_ids_stride=BAD_WORDS_TOTAL_TOKENS, bad_word_offsets_ptr=T(I32),
                      bad_word_offsets_stride=MAX_NUM_BAD_WORDS + 1, num_bad_words_ptr=T(I32),
                      all_token_ids_ptr=T(I32), all_token_ids_stride=d.max_model_len, prompt_len_ptr=T(I32),
                      total_len_ptr=T(I32), input_ids_ptr=T(I32), expanded_local_pos_ptr=T(I32))


def _topk_log_softmax(d: Deployment) -> Calls:
    # raw_logprobs (default logprobs_mode): the raw logits (sampler.py:174, rejection_sampler.py:364).
    # token_ids = cat(sampled, topk(n)) is [B, n + 1] (logprob.py:126-133): topk = stride = n + 1.
    return on(v2(d), [dict(
        output_ptr=T(F32), logits_ptr=raw_logits(d), logits_stride=raw_stride(d), topk_ids_ptr=T(I64),
        topk_ids_stride=n + 1, topk=n + 1, vocab_size=vocab(d), BLOCK_SIZE=1024,
        TOPK_BLOCK_SIZE=min(pow2(n + 1), 1024)) for n in range(MAX_LOGPROBS + 1)])


def _ranks(d: Deployment) -> Calls:
    return on(v2(d), [dict(output_ptr=T(I64), logits_ptr=raw_logits(d), logits_stride=raw_stride(d),
                           token_ids_ptr=T(I64), vocab_size=vocab(d), BLOCK_SIZE=8192)])


# ------------------------------------------------------------------------ spec decode (V2, MTP)
def _flatten_sampled(d: Deployment) -> Calls:
    return on(spec_v2(d), [dict(flat_sampled_ptr=T(I64), sampled_ptr=T(I64), sampled_stride=k(d) + 1,
                                num_sampled_ptr=T(I32), cu_num_logits_ptr=T(I32), num_warps=1)])


# A verification step has at least one draft, so >= 2 logits rows: classes 16k and other.
NUM_LOGITS = (DIV16, OTHER)


def _gather_draft_sampled(d: Deployment) -> Calls:
    return on(spec_v2(d), grid(dict(
        draft_sampled_ptr=T(I32), pos_ptr=T(I64), input_ids_ptr=T(I32), positions_ptr=T(I64),
        logits_indices_ptr=T(I64), expanded_idx_mapping_ptr=T(I64), expanded_local_pos_ptr=T(I32),
        prefill_len_ptr=T(I32), BLOCK_SIZE=1024), num_logits=NUM_LOGITS))


def _rs_blocks(d: Deployment) -> tuple[int, int]:
    """(vocab blocks of 8192, padded to a power of two) (rejection_sampler_utils.py:1179-1180)."""
    n = cdiv(vocab(d), 8192)
    return n, pow2(n)


def _local_logits_stats(d: Deployment) -> Calls:
    nb, _ = _rs_blocks(d)
    return on(spec_v2(d), [dict(
        target_local_argmax_ptr=T(I64), target_local_argmax_stride=nb, target_local_max_ptr=T(F32),
        target_local_max_stride=nb, target_local_sumexp_ptr=T(F32), target_local_sumexp_stride=nb,
        draft_local_max_ptr=T(F32), draft_local_max_stride=nb, draft_local_sumexp_ptr=T(F32),
        draft_local_sumexp_stride=nb, target_logits_ptr=lg, target_logits_stride=stride, draft_logits_ptr=None,
        draft_logits_stride_0=0, draft_logits_stride_1=0, expanded_idx_mapping_ptr=T(I64),
        expanded_local_pos_ptr=T(I32), temp_ptr=T(F32), vocab_size=vocab(d), num_logits=n,
        BLOCK_SIZE=8192, HAS_DRAFT_LOGITS=False)
        for lg, stride in logits_variants(d) for n in NUM_LOGITS])


def _rejection(d: Deployment) -> Calls:
    nb, padded = _rs_blocks(d)
    return on(spec_v2(d), [dict(
        sampled_ptr=T(I64), sampled_stride=k(d) + 1, rejected_steps_ptr=T(I32),
        target_rejected_logsumexp_ptr=T(F32), draft_rejected_logsumexp_ptr=T(F32), target_logits_ptr=lg,
        target_logits_stride=stride, target_local_argmax_ptr=T(I64), target_local_argmax_stride=nb,
        target_local_max_ptr=T(F32), target_local_max_stride=nb, target_local_sumexp_ptr=T(F32),
        target_local_sumexp_stride=nb, draft_sampled_ptr=T(I32), draft_logits_ptr=None, draft_logits_stride_0=0,
        draft_logits_stride_1=0, draft_local_max_ptr=T(F32), draft_local_max_stride=nb,
        draft_local_sumexp_ptr=T(F32), draft_local_sumexp_stride=nb, cu_num_logits_ptr=T(I32),
        idx_mapping_ptr=T(I64), temp_ptr=T(F32), seed_ptr=T(I64), pos_ptr=T(I64),
        synthetic_conditional_rates_ptr=None, cumulative_log_p_ptr=None, local_residual_mass_ptr=None,
        local_residual_mass_stride=0, fly_entropy_ptr=None, fly_entropy_threshold=0.3,
        vocab_num_blocks=nb, PADDED_VOCAB_NUM_BLOCKS=padded, HAS_DRAFT_LOGITS=False, SYNTHETIC_MODE=False,
        USE_BLOCK_VERIFICATION=False, FLY_WINDOW_SIZE=0, num_warps=1)
        for lg, stride in logits_variants(d)])


def _resample(d: Deployment) -> Calls:
    nb = cdiv(vocab(d), 1024)
    return on(spec_v2(d), [dict(
        resampled_local_argmax_ptr=T(I64), resampled_local_argmax_stride=nb, resampled_local_max_ptr=T(F32),
        resampled_local_max_stride=nb, target_logits_ptr=lg, target_logits_stride=stride,
        target_rejected_logsumexp_ptr=T(F32), draft_logits_ptr=None, draft_logits_stride_0=0,
        draft_logits_stride_1=0, draft_rejected_logsumexp_ptr=T(F32), rejected_step_ptr=T(I32),
        cu_num_logits_ptr=T(I32), expanded_idx_mapping_ptr=T(I64), draft_sampled_ptr=T(I32), temp_ptr=T(F32),
        seed_ptr=T(I64), pos_ptr=T(I64), cumulative_log_p_ptr=None, contexts_ptr=None, contexts_stride=0,
        watermarking_ptr=None, watermarking_skip_mask_ptr=None, watermark_key_0=0, watermark_key_1=0,
        vocab_size=vocab(d), BLOCK_SIZE=1024, HAS_DRAFT_LOGITS=False, USE_FP64=False,
        USE_BLOCK_VERIFICATION=False, CONTEXT_WIDTH=1, WATERMARK=False, DEDUPLICATE_CONTEXTS=False)
        for lg, stride in logits_variants(d)])


def _insert_resampled(d: Deployment) -> Calls:
    nb = cdiv(vocab(d), 1024)
    return on(spec_v2(d), [dict(
        sampled_ptr=T(I64), sampled_stride=k(d) + 1, num_sampled_ptr=T(I32), resampled_local_argmax_ptr=T(I64),
        resampled_local_argmax_stride=nb, resampled_local_max_ptr=T(F32), resampled_local_max_stride=nb,
        resample_num_blocks=nb, cu_num_logits_ptr=T(I32), expanded_idx_mapping_ptr=T(I64), temp_ptr=T(F32),
        PADDED_RESAMPLE_NUM_BLOCKS=pow2(nb))])


def _spec_prepare_prefill(d: Deployment) -> Calls:
    return on(spec_v2(d), [dict(
        last_token_indices_ptr=T(I64), draft_current_step_ptr=T(I64), draft_input_ids_ptr=T(I32),
        draft_positions_ptr=T(I64), draft_query_start_loc_ptr=T(I32), draft_seq_lens_ptr=T(I32),
        target_input_ids_ptr=T(I32), target_positions_ptr=T(I64), idx_mapping_ptr=T(I64),
        last_sampled_ptr=T(I64), next_prefill_tokens_ptr=T(I32), num_sampled_ptr=T(I32),
        num_rejected_ptr=T(I32), query_start_loc_ptr=T(I32), seq_lens_ptr=T(I32),
        max_num_reqs=d.max_num_seqs, BLOCK_SIZE=1024)])


def _spec_prepare_decode(d: Deployment) -> Calls:
    # Only k > 1: with one speculative token propose() returns after the draft prefill (speculator.py:297).
    return on(spec_v2(d) and k(d) > 1, [dict(
        draft_tokens_ptr=T(I64), draft_tokens_stride=k(d), target_seq_lens_ptr=T(I32), num_rejected_ptr=T(I32),
        input_ids_ptr=T(I32), positions_ptr=T(I64), sample_src_positions_ptr=T(I64), query_start_loc_ptr=T(I32),
        seq_lens_ptr=T(I32), max_model_len=d.max_model_len, max_num_reqs=d.max_num_seqs, BLOCK_SIZE=1024,
        ADVANCE_DRAFT_POSITIONS=True)])


def _spec_update_draft(d: Deployment) -> Calls:
    # k > 1 only. Hidden states are the pre-hc_head residual, hidden_size * hc_mult wide
    # (spec_decode/speculator.py:119-135); greedy drafts are argmax int64.
    width = int(text(d)["hidden_size"]) * int(text(d).get("hc_mult", 1))
    dtype = getattr(torch, d.dtype)
    return on(spec_v2(d) and k(d) > 1, [dict(
        output_draft_tokens_ptr=T(I64), output_draft_tokens_stride=k(d), next_input_hidden_states_ptr=T(dtype),
        next_input_hidden_states_stride=width, input_ids_ptr=T(I32), positions_ptr=T(I64),
        sample_src_positions_ptr=T(I64), seq_lens_ptr=T(I32), draft_tokens_ptr=T(I64),
        current_draft_step_ptr=T(I64), hidden_states_ptr=T(dtype), hidden_states_stride=width,
        hidden_size=width, max_model_len=d.max_model_len, num_speculative_steps=k(d), BLOCK_SIZE=1024,
        ADVANCE_DRAFT_POSITIONS=True)])


MH = "vllm.v1.worker.gpu.model_states.mamba_hybrid"
MU = "vllm.v1.worker.mamba_utils"
WHY_MAMBA = "unregistered V2 runner kernel of Mamba state groups (prefix caching's align mode); warmed by fake steps"
WHY_V2 = "unregistered V2 runner kernel; vLLM warms it only through fake scheduler steps (gpu/warmup.py)"
WHY_SPEC = "unregistered V2 MTP spec-decode kernel; warmed only by gpu/warmup.py's fake steps"


def _row(kernel: str, site: str, calls: Any, why: str = WHY_V2, groups: tuple[str, ...] = GROUPS_V2) -> DerivedKernel:
    return DerivedKernel(kernel, site, calls, why, groups)


def runner_derived(kv_groups: KVGroups) -> tuple[DerivedKernel, ...]:
    """The runners' derived rows for a model whose deployments have `kv_groups`."""
    return (
        # Input preparation (gpu/model_runner.py:1388-1593 prepare_inputs, 1720 postprocess_sampled).
        _row(f"{IB}:_prepare_prefill_inputs_kernel", "v1/worker/gpu/input_batch.py:340", _prepare_prefill_inputs),
        _row(f"{IB}:_prepare_pos_seq_lens_kernel", "v1/worker/gpu/input_batch.py:403", _prepare_pos_seq_lens),
        _row(f"{IB}:_combine_sampled_and_draft_tokens_kernel", "v1/worker/gpu/input_batch.py:495",
             _combine_sampled_and_draft_tokens),
        _row(f"{IB}:_get_num_sampled_and_rejected_kernel", "v1/worker/gpu/input_batch.py:554",
             _get_num_sampled_and_rejected),
        _row(f"{IB}:_post_update_kernel", "v1/worker/gpu/input_batch.py:668", _post_update),
        _row(f"{IB}:_expand_idx_mapping_kernel", "v1/worker/gpu/input_batch.py:752", _expand_idx_mapping,
             WHY_SPEC, GROUPS_SPEC_V2),
        # Block tables and staged buffer writes.
        _row(f"{BT}:_gather_block_tables_kernel", "v1/worker/gpu/block_table.py:197",
             lambda d: _gather_block_tables(d, kv_groups(d))),
        _row(f"{BT}:_compute_slot_mappings_kernel", "v1/worker/gpu/block_table.py:242", _compute_slot_mappings),
        _row(f"{BU}:_apply_write_kernel", "v1/worker/gpu/buffer_utils.py:223,296",
             lambda d: _apply_write(d, kv_groups(d))),
        _row("vllm.v1.worker.utils:_zero_kv_blocks_kernel", "v1/worker/utils.py:247", _zero_kv_blocks,
             "unregistered KV-block zeroing of both runners; warmed by KVBlockZeroer.warmup",
             ("runner", "runner-v2", "runner-v1")),
        # Mamba state groups (gpu/model_states/mamba_hybrid.py; v1/worker/mamba_utils.py), from the groups.
        _row(f"{MH}:_scatter_num_accepted_kernel", "v1/worker/gpu/model_states/mamba_hybrid.py:363",
             lambda d: _scatter_num_accepted(d, kv_groups(d)), WHY_MAMBA),
        _row(f"{MH}:_fill_num_accepted_kernel", "v1/worker/gpu/model_states/mamba_hybrid.py:370",
             lambda d: _fill_num_accepted(d, kv_groups(d)), WHY_MAMBA),
        _row(f"{MU}:preprocess_mamba_align_fused_kernel", "v1/worker/gpu/model_states/mamba_hybrid.py:210",
             lambda d: _preprocess_mamba_align(d, kv_groups(d)), WHY_MAMBA),
        _row(f"{MU}:precopy_mamba_align_fused_kernel", "v1/worker/mamba_utils.py:1226",
             lambda d: _precopy_mamba_align(d, kv_groups(d)), WHY_MAMBA),
        _row(f"{MU}:postprocess_mamba_fused_kernel", "v1/worker/mamba_utils.py:1276",
             lambda d: _postprocess_mamba_align(d, kv_groups(d)), WHY_MAMBA),
        _row(f"{MU}:get_aligned_state_indices_multi_group_kernel", "v1/worker/mamba_utils.py:1123",
             lambda d: _aligned_state_indices(d, kv_groups(d)), WHY_MAMBA),
        # Sampler (gpu/sample/sampler.py) and its logits processors.
        _row(f"{SMP}.gumbel:_gumbel_sample_kernel", "v1/worker/gpu/sample/gumbel.py:390", _gumbel_sample),
        _row(f"{SMP}.gumbel:_temperature_kernel", "v1/worker/gpu/sample/gumbel.py:55", _temperature),
        _row(f"{SMP}.min_p:_min_p_kernel", "v1/worker/gpu/sample/min_p.py:53", _min_p),
        _row(f"{SMP}.penalties:_penalties_kernel", "v1/worker/gpu/sample/penalties.py:201", _penalties),
        _row(f"{SMP}.penalties:_bincount_kernel", "v1/worker/gpu/sample/penalties.py:287", _bincount),
        _row(f"{SMP}.logit_bias:_bias_kernel", "v1/worker/gpu/sample/logit_bias.py:327", _bias),
        _row(f"{SMP}.bad_words:_bad_words_kernel", "v1/worker/gpu/sample/bad_words.py:182", _bad_words),
        _row(f"{SMP}.logprob:_topk_log_softmax_kernel", "v1/worker/gpu/sample/logprob.py:97", _topk_log_softmax),
        _row(f"{SMP}.logprob:_ranks_kernel", "v1/worker/gpu/sample/logprob.py:174", _ranks),
        # MTP verification (gpu/spec_decode/rejection_sampler.py) and drafting.
        _row(f"{RS}:_gather_draft_sampled_kernel", "v1/worker/gpu/spec_decode/rejection_sampler.py:132",
             _gather_draft_sampled, WHY_SPEC, GROUPS_SPEC_V2),
        _row(f"{RS}:_flatten_sampled_kernel", "v1/worker/gpu/spec_decode/rejection_sampler.py:200", _flatten_sampled,
             WHY_SPEC, GROUPS_SPEC_V2),
        _row(f"{RSU}:_compute_local_logits_stats_kernel", "v1/worker/gpu/spec_decode/rejection_sampler_utils.py:1196",
             _local_logits_stats, WHY_SPEC, GROUPS_SPEC_V2),
        _row(f"{RSU}:_rejection_kernel", "v1/worker/gpu/spec_decode/rejection_sampler_utils.py:1306", _rejection,
             WHY_SPEC, GROUPS_SPEC_V2),
        _row(f"{RSU}:_resample_kernel", "v1/worker/gpu/spec_decode/rejection_sampler_utils.py:1360", _resample,
             WHY_SPEC, GROUPS_SPEC_V2),
        _row(f"{RSU}:_insert_resampled_kernel", "v1/worker/gpu/spec_decode/rejection_sampler_utils.py:1397",
             _insert_resampled, WHY_SPEC, GROUPS_SPEC_V2),
        _row(f"{SPEC}:_prepare_prefill_inputs_kernel",
             "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:785", _spec_prepare_prefill,
             WHY_SPEC, GROUPS_SPEC_V2),
        _row(f"{SPEC}:_prepare_decode_inputs_kernel",
             "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:873", _spec_prepare_decode,
             WHY_SPEC, GROUPS_SPEC_V2),
        _row(f"{SPEC}:_update_draft_inputs_kernel",
             "v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:976", _spec_update_draft,
             WHY_SPEC, GROUPS_SPEC_V2),
    )
