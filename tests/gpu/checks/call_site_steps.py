"""The steps check_call_sites.py drives: vLLM 0.33.0's own call sites, for the default deployment.

Each step builds the batch metadata the way vLLM's V2 runner does (requests with prompt and
computed lengths -> idx_mapping, query_start_loc, positions, seq_lens; block tables filled by
BlockTables' staged writes) and then calls vLLM's wrapper functions and kernel owners with it. The
vLLM modules come from the carried copy (vllm_mount); nothing of vLLM is reimplemented here: the
values chosen are the deployment's (DeepSeek-V4-Flash, TP 4, MTP 1, block 256, fp8 KV, 8192
batched tokens, 1024 sequences, vocabulary 129280). A step returns the tensors it produced, which
are hashed and compared between the JIT and the loader runs.
"""

from __future__ import annotations

import collections
import importlib
import types
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

VOCAB = 129280
MAX_NUM_REQS = 1024
MAX_BATCHED = 8192
MAX_MODEL_LEN = 8192  # token buffers and position tables of the steps (the sequences here are shorter)
# The default deployment's max_model_len (aot/data/default-deployment.toml:24, max_position_embeddings): the width of
# the main KV group's block table, cdiv(1048576, 256) = 4096 (gpu/model_runner.py:664-674), which reaches a kernel
# key as a compile-time constant (ComputeGlobalTopkIndicesAndLens' block_table_stride). The other groups' tables
# (block 64, 4, 8: up to 262144 wide at 1M tokens) are sized by MAX_MODEL_LEN: their widths reach keys only as
# strides divisible by 16 either way, and the full ones would hold gigabytes that every launch snapshots and hashes.
DEPLOYMENT_MAX_MODEL_LEN = 1048576
BLOCK_SIZES = [256, 64, 4, 8]  # main KV (C4/C128 layers), SWA cache, C4 and C128 compressor states
# Bytes per block of the default deployment's block-outermost KV pool (all layers' pages of one block, block_size 256),
# as vLLM's kv_cache_planning lays it out (computed by aot/models/deepseek_v4/config.py:indexer_kv_block_stride).
POOL_BYTES_PER_BLOCK = 961344
# Per group, SlidingWindowSpec.num_retained_tokens (sliding_window - 1) as gpu/model_runner.py hands it to BlockTables:
# the main KV group is full attention (0); the SWA cache and the compressor states are SlidingWindowMLASpec.
SLIDING_WINDOW_REACH = [0, 127, 127, 127]
HIDDEN_Q_LORA, HEAD_DIM, ROPE_DIM, NOPE_DIM = 1024, 512, 64, 448
N_LOCAL_HEADS, N_GROUPS, HEADS_PER_GROUP = 16, 2, 8  # 64 heads / TP 4; o_groups 8 / TP 4
WINDOW, INDEX_TOPK = 128, 512
BAD_WORDS_TOTAL_TOKENS, MAX_NUM_BAD_WORDS = 1024, 128  # vllm/envs.py defaults (bad_words.py:30-37)

CALL_SITE_MODULES = (
    "vllm.v1.worker.gpu.block_table",
    "vllm.v1.worker.gpu.buffer_utils",
    "vllm.v1.worker.gpu.sample.gumbel",
    "vllm.v1.worker.gpu.sample.min_p",
    "vllm.v1.worker.gpu.sample.penalties",
    "vllm.v1.worker.gpu.sample.logit_bias",
    "vllm.v1.worker.gpu.sample.bad_words",
    "vllm.v1.worker.gpu.sample.logprob",
    "vllm.v1.sample.ops.topk_topp_triton",
    "vllm.v1.sample.ops.topk_topp_sampler",
    "vllm.v1.worker.gpu.sample.states",
    "vllm.models.common.ops.fused_qk_rmsnorm",
    "vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant",
    "vllm.models.deepseek_v4.common.ops.save_partial_states",
    "vllm.models.deepseek_v4.common.ops.cache_utils",
    "vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache",
    "vllm.v1.attention.ops.common",
    "vllm.v1.attention.backends.mla.indexer",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.worker.utils",
    "vllm.models.deepseek_v4.attention",
    # DeepSeek-V4's SWA metadata builder (its Triton kernels run once per step, shared by every layer)
    "vllm.v1.attention.backend",
    "vllm.v1.attention.backends.mla.sparse_swa",
    "vllm.models.deepseek_v4.sparse_mla",
    "vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router",
    # MTP 1 on the V2 runner: its input preparation, the rejection sampler, the MTP speculator and its model's norms
    "vllm.v1.worker.gpu.input_batch",
    "vllm.v1.worker.gpu.states",
    "vllm.v1.worker.gpu.sample.sampler",
    "vllm.v1.worker.gpu.sample.logits_processor.interface",
    "vllm.v1.worker.gpu.spec_decode.rejection_sampler",
    "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator",
    "vllm.models.deepseek_v4.common.ops.fused_mtp_input_rmsnorm",
)
# Short names that would collide (the key of _m is the module's last name otherwise).
SHORT_NAMES = {"vllm.v1.worker.gpu.states": "req_states", "vllm.v1.worker.gpu.sample.logits_processor.interface":
               "lp_interface", "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator": "speculator"}

_m: dict[str, Any] = {}
# kernel qualname -> tensors it writes through a table of device addresses (set by check_call_sites:
# its tracer counts and hashes them as that kernel's outputs).
INDIRECT: dict[str, list[torch.Tensor]] = {}
ERRORS: list[str] = []  # call sites of the current step that raised (the step goes on with the next)
NEW_BLOCKS: list[int] = []  # block ids of the main KV group allocated in the current step (runner_metadata)


def _site(name: str, call: Any) -> dict[str, torch.Tensor]:
    """Run one call site; an exception is recorded (the step fails) and the step continues."""
    try:
        return call() or {}
    except Exception as exc:  # noqa: BLE001 - reported per call site
        ERRORS.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
        return {}


IMPORT_ERRORS: list[str] = []  # call-site modules that did not import (their sites then fail, the others run)


def import_call_sites() -> list[Any]:
    """Import every call-site module (from the mounted vLLM copy) and return them. A module that does not import
    is listed in IMPORT_ERRORS (the check fails) and the steps' other call sites still run."""
    for name in CALL_SITE_MODULES:
        try:
            _m[SHORT_NAMES.get(name, name.rpartition(".")[2])] = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported, and the check fails
            IMPORT_ERRORS.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
    return list(_m.values())


@dataclass
class Batch:
    """One scheduler step: per request, tokens already computed and tokens scheduled now."""

    computed: list[int]
    scheduled: list[int]
    device: str

    @property
    def num_reqs(self) -> int:
        return len(self.computed)

    @property
    def num_tokens(self) -> int:
        return sum(self.scheduled)

    def idx_mapping(self) -> torch.Tensor:
        # request slots in the persistent batch: not 0..n-1, as after other requests finished
        # int64, as the V2 runner builds it (model_runner.py: torch.tensor(idx_mapping_np, dtype=torch.int64))
        return torch.tensor([3 + 5 * i for i in range(self.num_reqs)], dtype=torch.int64, device=self.device)

    def query_start_loc(self) -> torch.Tensor:
        out = [0]
        for n in self.scheduled:
            out.append(out[-1] + n)
        return torch.tensor(out, dtype=torch.int32, device=self.device)

    def positions(self) -> torch.Tensor:
        pos = [c + j for c, n in zip(self.computed, self.scheduled) for j in range(n)]
        return torch.tensor(pos, dtype=torch.int64, device=self.device)

    def seq_lens(self) -> torch.Tensor:
        return torch.tensor([c + n for c, n in zip(self.computed, self.scheduled)], dtype=torch.int32,
                            device=self.device)


def _gen(device: str, seed: int) -> torch.Generator:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _randn(shape: tuple, dtype: torch.dtype, g: torch.Generator, device: str) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


# --------------------------------------------------------------------------------------------------
# V2 model runner: block tables (staged writes, gather, slot mappings)

def runner_metadata(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    bt_mod = _m["block_table"]
    max_blocks = [_cdiv(DEPLOYMENT_MAX_MODEL_LEN if i == 0 else MAX_MODEL_LEN, bs) for i, bs in enumerate(BLOCK_SIZES)]
    tables = bt_mod.BlockTables(BLOCK_SIZES, MAX_NUM_REQS, MAX_BATCHED, max_blocks, torch.device(batch.device),
                                sliding_window_reach=SLIDING_WINDOW_REACH)
    INDIRECT["_apply_write_kernel"] = [t.gpu for t in tables.block_tables]
    INDIRECT["_gather_block_tables_kernel"] = list(tables.input_block_tables)
    idx = batch.idx_mapping()
    next_block = [1] * len(BLOCK_SIZES)
    new_blocks: list[int] = []  # main-group blocks first written in this step: the scheduler's new blocks to zero
    for r, (c, n) in enumerate(zip(batch.computed, batch.scheduled)):
        ids = []
        for gi, bs in enumerate(BLOCK_SIZES):
            count = -(-(c + n) // bs)
            ids.append(list(range(next_block[gi], next_block[gi] + count)))
            next_block[gi] += count + 7  # other requests' blocks in between
        new_blocks += [b for j, b in enumerate(ids[0]) if j * BLOCK_SIZES[0] >= c]
        tables.append_block_ids(int(idx[r]), tuple(ids), overwrite=True)
    NEW_BLOCKS[:] = new_blocks
    tables.apply_staged_writes()  # several groups: FusedStagedWriter -> _apply_write_kernel (MULTI_GROUP)
    single = _m["buffer_utils"].StagedWriteTensor((MAX_NUM_REQS, 4), dtype=torch.int32,
                                                   device=torch.device(batch.device))
    for r in range(batch.num_reqs):
        single.stage_write(int(idx[r]), 0, [batch.computed[r], batch.scheduled[r]])
    single.apply_write()  # one group: _apply_write_kernel on a plain tensor
    # As the model runner's prepare_attn: num_computed_tokens per request slot (req_states), so sliding-window
    # groups are masked (MASK_SLIDING_WINDOW=True; only the prefill-context-parallel path passes none).
    computed = torch.zeros(MAX_NUM_REQS, dtype=torch.int32, device=batch.device)
    computed[idx] = torch.tensor(batch.computed, dtype=torch.int32, device=batch.device)
    block_tables = tables.gather_block_tables(idx, batch.num_reqs, num_computed_tokens=computed)
    slots = tables.compute_slot_mappings(idx, batch.query_start_loc(), batch.positions(), batch.num_tokens)
    out = {f"block_table_{i}": t for i, t in enumerate(block_tables)}
    out.update(slot_mappings=slots, staged=single.gpu)
    return out


# --------------------------------------------------------------------------------------------------
# DeepSeek-V4 attention layer ops

def attention_ops(batch: Batch, seed: int, meta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    dev, g = batch.device, _gen(batch.device, seed)
    T = batch.num_tokens
    out: dict[str, torch.Tensor] = {}
    qr = _randn((T, HIDDEN_Q_LORA), torch.bfloat16, g, dev)
    kv = _randn((T, HEAD_DIM), torch.bfloat16, g, dev)
    qw = _randn((HIDDEN_Q_LORA,), torch.bfloat16, g, dev)
    kw = _randn((HEAD_DIM,), torch.bfloat16, g, dev)
    out["qr"], out["kv"] = _m["fused_qk_rmsnorm"].fused_q_kv_rmsnorm(qr, kv, qw, kw, 1e-6)
    return out


def inv_rope(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    dev, g = batch.device, _gen(batch.device, seed + 4)
    T = batch.num_tokens
    out: dict[str, torch.Tensor] = {}
    positions = batch.positions()
    cos_sin = _randn((MAX_MODEL_LEN, ROPE_DIM), torch.float32, g, dev)
    o = _randn((T, N_LOCAL_HEADS, HEAD_DIM), torch.bfloat16, g, dev)
    out["o_fp8"], out["o_scale"] = _m["fused_inv_rope_fp8_quant"].fused_inv_rope_fp8_quant(
        o, positions, cos_sin, N_GROUPS, HEADS_PER_GROUP)
    return out


def compressor_state(batch: Batch, seed: int, compress_ratio: int, head_dim: int,
                     meta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Compressor.forward's first kernel: save the KV and score partial states (fused APE add), at the
    slots the runner computed for the compressor-state group (block size 4 for C4, 8 for C128)."""
    dev, g = batch.device, _gen(batch.device, seed + compress_ratio)
    T = batch.num_tokens
    coff = 2 if compress_ratio == 4 else 1
    width = coff * head_dim
    kv_score = _randn((T, 2 * width), torch.float32, g, dev)
    kv, score = kv_score.split([width, width], dim=-1)
    ape = _randn((compress_ratio, width), torch.float32, g, dev)
    block_size = 4 if compress_ratio == 4 else 8
    slots = meta["slot_mappings"][BLOCK_SIZES.index(block_size)][:T].contiguous()
    num_blocks = int(slots.max()) // block_size + 2
    state_cache = torch.zeros((num_blocks, block_size, 2 * width), dtype=torch.float32, device=dev)
    _m["save_partial_states"]._SAVE_PARTIAL_STATES_KERNEL(
        kv=kv, score=score, ape=ape, positions=batch.positions(), state_cache=state_cache, slot_mapping=slots,
        block_size=block_size, state_width=width, compress_ratio=compress_ratio,
        pdl_kwargs={"launch_pdl": False})
    out = {f"state_cache_c{compress_ratio}_{head_dim}": state_cache}
    if head_dim == 128:  # the indexer's compressor: compress, RMSNorm, RoPE, fp8 quant, insert into its K cache
        out.update(indexer_compress_insert(batch, seed, state_cache, width, slots, meta))
    return out


def indexer_compress_insert(batch: Batch, seed: int, state_cache: torch.Tensor, state_width: int,
                            state_slots: torch.Tensor, meta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Compressor._compress_norm_rope_store for the indexer (head 128, C4, overlap, fp8 cache)."""
    dev, g = batch.device, _gen(batch.device, seed + 5)
    T = batch.num_tokens
    token_to_req = torch.repeat_interleave(torch.arange(batch.num_reqs, dtype=torch.int32, device=dev),
                                           torch.tensor(batch.scheduled, device=dev))
    k_slots = (meta["slot_mappings"][0][:T] // 4).contiguous()  # compressed rows of the C4 K cache (64 a block)
    k_block = 256 // 4
    # vLLM's DeepSeek-V4 KV pool is block-outermost: block b of every layer's caches sits in one packed pool block,
    # so the indexer K cache is a view whose stride(0) (the kernel's KV_BLOCK_STRIDE) is the pool's bytes per block,
    # not one page (v1/attention/backends/mla/indexer.py:348-357, v1/core/kv_cache_planning.py:574-605).
    num_blocks = int(k_slots.max()) // k_block + 2
    pool = torch.zeros((num_blocks, POOL_BYTES_PER_BLOCK), dtype=torch.uint8, device=dev)
    kv_cache = pool[:, :k_block * (128 + 4)].view(num_blocks, k_block, 128 + 4)  # the first layer's indexer K cache
    _m["fused_compress_quant_cache"].compress_norm_rope_store_triton(
        state_cache=state_cache, num_actual=T, token_to_req_indices=token_to_req, positions=batch.positions(),
        slot_mapping=state_slots, block_table=meta["block_table_2"], block_size=4, state_width=state_width,
        cos_sin_cache=_randn((MAX_MODEL_LEN, ROPE_DIM), torch.float32, g, dev),
        kv_cache=kv_cache, k_cache_metadata=types.SimpleNamespace(slot_mapping=k_slots),
        pdl_kwargs={"launch_pdl": False}, head_dim=128, rope_head_dim=ROPE_DIM, compress_ratio=4, overlap=True,
        use_fp4_cache=False, rms_norm_weight=_randn((128,), torch.bfloat16, g, dev), rms_norm_eps=1e-6,
        quant_block=128, token_stride=128, scale_dim=4)
    return {"indexer_k_cache": kv_cache}


def kv_block_zeroing(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    """KVBlockZeroer (v1/worker/utils.py:105) as the V2 runner builds it (gpu/model_runner.py:829) and calls it on
    the step's newly allocated blocks (model_runner.py:1295). DeepSeek-V4 needs it: its caches mix uint8 and fp32
    (kv_cache_interface.py:1652). The groups are the first C4 layer's caches, views into one block-outermost pool
    (vLLM's real specs and AttentionGroup): the main MLA cache (block 256, 584 B a token), its indexer K cache
    (64 compressed rows of 132 B), the SWA cache (block 64) and the C4 compressor state (block 4, fp32). The pool
    holds stale data (random bytes): zeroing changes every byte it reaches that is not already 0."""
    if not NEW_BLOCKS:
        return {}  # no new block in this step: the runner launches nothing (utils.py:234)
    dev, g = batch.device, _gen(batch.device, seed + 6)
    kvi, wu = _m["kv_cache_interface"], _m["utils"]
    num_blocks = max(NEW_BLOCKS) + 2
    pool = torch.randint(0, 256, (num_blocks, POOL_BYTES_PER_BLOCK), generator=g, device=dev,
                         dtype=torch.int32).to(torch.uint8)
    mla = dict(num_kv_heads=1, dtype=torch.uint8, cache_dtype_str="fp8_ds_mla", model_version="deepseek_v4")
    layout = [  # (layer name, group id, spec, view shape, dtype)
        ("layers.0.attn", 0, kvi.MLAAttentionSpec(block_size=256, head_size=584, **mla), (256, 584), torch.uint8),
        ("layers.0.attn.indexer.k_cache", 0, kvi.MLAAttentionSpec(block_size=256, head_size=132, **mla), (64, 132),
         torch.uint8),
        ("layers.0.attn.swa_cache", 1,
         kvi.SlidingWindowMLASpec(block_size=64, head_size=584, sliding_window=WINDOW, **mla), (64, 584), torch.uint8),
        ("layers.0.attn.compressor.state_cache", 2,
         kvi.SlidingWindowMLASpec(block_size=4, num_kv_heads=1, head_size=2048, dtype=torch.float32,
                                  sliding_window=WINDOW, model_version="deepseek_v4"), (4, 2048), torch.float32),
    ]
    context, groups, offset = {}, {}, 0
    for name, gid, spec, shape, dtype in layout:
        nbytes = shape[0] * shape[1] * torch.tensor([], dtype=dtype).element_size()
        view = pool[:, offset:offset + nbytes].view(dtype).view(num_blocks, *shape)
        offset += nbytes
        context[name] = types.SimpleNamespace(kv_cache=view)
        groups.setdefault(gid, wu.AttentionGroup(backend=None, layer_names=[], kv_cache_spec=spec,
                                                 kv_cache_group_id=gid))
        groups[gid].layer_names.append(name)
    zeroer = wu.KVBlockZeroer(torch.device(dev), groups.values(), BLOCK_SIZES, context, num_blocks)
    INDIRECT["_zero_kv_blocks_kernel"] = [pool]  # written through the zeroer's table of segment addresses
    zeroer.zero_block_ids(list(NEW_BLOCKS))
    return {"kv_pool_zeroed": pool}


def short_context_topk(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    """DeepseekV4Indexer.forward's short-context branch (models/deepseek_v4/attention.py:1119-1144): when every
    sequence has at most index_topk compressed tokens, every candidate is selected by
    _fill_short_context_topk_indices into the model's [max_num_batched_tokens, index_topk] int32 buffer
    (nvidia/model.py:848). The indexer is called unbound on a stand-in holding the attributes that branch reads;
    the forward context holds the indexer's metadata (num_decode_tokens, num_prefill_tokens, max_seq_len)."""
    seq_lens = [c + n for c, n in zip(batch.computed, batch.scheduled)]
    if max(seq_lens) // 4 > INDEX_TOPK:
        return {}  # long context: the indexer's top-k kernels run instead (not Triton)
    dev = batch.device
    buffer = torch.full((MAX_BATCHED, INDEX_TOPK), 7, dtype=torch.int32, device=dev)  # the previous step's indices
    decodes = sum(n for n in batch.scheduled if n <= 2)  # MTP verification counts as decode (query length <= 2)
    meta = types.SimpleNamespace(max_seq_len=max(seq_lens), num_decode_tokens=decodes,
                                 num_prefill_tokens=batch.num_tokens - decodes)
    indexer = types.SimpleNamespace(compressor=None, k_cache=types.SimpleNamespace(prefix="layers.0.attn.indexer"),
                                    compress_ratio=4, topk_tokens=INDEX_TOPK, topk_indices_buffer=buffer)
    forward_context = importlib.import_module("vllm.forward_context")
    forward_context.CURRENT.attn_metadata = {"layers.0.attn.indexer": meta}
    try:
        result = _m["attention"].DeepseekV4Indexer.forward(
            indexer, hidden_states=None, qr=None, compressed_kv_score=None, indexer_weights=None,
            positions=batch.positions(), rotary_emb=None, skip_compressor=True)
    finally:
        forward_context.CURRENT.attn_metadata = None
    assert result == (None, None, None), "the indexer took its long-context branch"
    return {"short_context_topk": buffer}


def sparse_prefill_ops(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    """The FlashMLA sparse prefill path: combine the indexer's top-k with the SWA window."""
    dev, g = batch.device, _gen(batch.device, seed + 1)
    T = batch.num_tokens
    seq_lens = batch.seq_lens()
    compress_ratio = 4
    gather_lens = torch.clamp(seq_lens, max=WINDOW + 0)
    topk = INDEX_TOPK
    # top-k over compressed positions (-1 beyond each token's compressed length), as the indexer writes them
    topk_indices = torch.randint(0, 64, (T, topk), generator=g, device=dev, dtype=torch.int32)
    topk_indices[:, topk // 2:] = -1
    N = int(gather_lens.sum()) + 0
    M = max(batch.computed[i] + batch.scheduled[i] for i in range(batch.num_reqs)) // compress_ratio + 1
    combined, lens = _m["cache_utils"].combine_topk_swa_indices(
        topk_indices, batch.query_start_loc(), seq_lens, gather_lens, WINDOW, compress_ratio, topk, M, N)
    return {"combined": combined, "combined_lens": lens}


def indexer_prefill_metadata(batch: Batch, seed: int, meta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The DSA indexer's prefill chunk metadata (BuildPrefillChunkMetadataKernel)."""
    n = batch.num_reqs
    qsl = batch.query_start_loc()
    seq_lens = batch.seq_lens()
    compressed = seq_lens // 4
    res = _m["indexer"].build_prefill_chunk_metadata(
        0, n, qsl, qsl.cpu(), seq_lens, compressed, compressed.cpu(), meta["block_table_0"], 4)
    if res is None:
        return {}
    return {k: v for k, v in vars(res).items() if isinstance(v, torch.Tensor)}


def indexer_decode_pack(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    """Decode queries of several lengths packed into a padded batch and back (DSA decode path)."""
    dev, g = batch.device, _gen(batch.device, seed + 2)
    lengths = torch.tensor(batch.scheduled, dtype=torch.int32, device=dev)
    # sparse_attn_indexer.py:834 packs the fp8 (float8_e4m3fn) indexer queries, default -inf pad; :949 unpacks the
    # int32 top-k indices [batch, padded length, top-k] the decode logits produced.
    x = _randn((batch.num_tokens, 64, 128), torch.float8_e4m3fn, g, dev)
    packed = _m["common"].pack_seq_triton(x, lengths)
    topk = torch.randint(0, MAX_MODEL_LEN, (len(batch.scheduled), max(batch.scheduled), 512), generator=g,
                         device=dev, dtype=torch.int32)
    unpacked = _m["common"].unpack_seq_triton(topk, lengths)
    return {"packed": packed, "unpacked": unpacked}


def swa_metadata(batch: Batch, seed: int, meta: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DeepseekSparseSWAMetadataBuilder.build (v1/attention/backends/mla/sparse_swa.py:581), once per step for every
    layer: token -> request map (CommonAttentionMetadata.token_to_req_indices, backend.py:496), decode SWA indices
    (sparse_swa.py:668), prefill SWA indices (:715) and the prefill gather lengths (ComputePrefillMetadata, :973),
    on vLLM's own CommonAttentionMetadata with the runner's SWA-group block table and slot mapping (block 64).

    The builder is called unbound on a stand-in holding what its __init__ (sparse_swa.py:452-540) sets for the
    default deployment: window 128, no image tokens, no DSpark, decode threshold 1 + k (backend.py:572), and
    buffers of max_num_batched_tokens rows. Its FlashMLA tile-scheduler plan (a C++ op, not Triton) is left out:
    no layer type is listed, so build_tile_scheduler returns its empty plan (sparse_swa.py:903-935)."""
    dev = batch.device
    swa, backend = _m["sparse_swa"], _m["backend"]
    T, n = batch.num_tokens, batch.num_reqs
    qsl, seq_lens = batch.query_start_loc(), batch.seq_lens()
    spec = types.SimpleNamespace(speculative_config=types.SimpleNamespace(num_speculative_tokens=1,
                                                                          parallel_drafting=False),
                                 use_v2_model_runner=True)
    threshold = backend.max_decode_query_len(spec)
    is_decode = [q <= threshold for q in batch.scheduled]
    if is_decode != sorted(is_decode, reverse=True):
        raise ValueError("the batch must be ordered decodes first, as vLLM's scheduler hands it to the builders")
    zeros = lambda *shape, dtype=torch.int32: torch.zeros(shape, dtype=dtype, device=dev)
    builder = types.SimpleNamespace(
        decode_threshold=threshold, window_size=WINDOW, block_size=BLOCK_SIZES[1],
        max_image_tokens=0, prefill_index_width=WINDOW, is_dspark=False, noncausal_index_width=0,
        decode_swa_indices_noncausal=None, max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=MAX_BATCHED,
        _layer_types=set(), token_to_req_indices=zeros(MAX_BATCHED),
        is_valid_token=zeros(MAX_BATCHED, dtype=torch.bool),
        decode_swa_indices=zeros(MAX_BATCHED, 1, WINDOW), decode_swa_lens=zeros(MAX_BATCHED),
        prefill_swa_indices=zeros(MAX_BATCHED, 1, WINDOW), prefill_swa_lens=zeros(MAX_BATCHED),
        no_replay_start=zeros(MAX_NUM_REQS + 1))
    cls = swa.DeepseekSparseSWAMetadataBuilder
    for name in ("_build_deepseek_v4_metadata", "build_tile_scheduler"):
        setattr(builder, name, types.MethodType(getattr(cls, name), builder))
    common = backend.CommonAttentionMetadata(
        query_start_loc=qsl, query_start_loc_cpu=qsl.cpu(), seq_lens=seq_lens, num_reqs=n, num_actual_tokens=T,
        max_query_len=max(batch.scheduled), max_seq_len=int(seq_lens.max()), block_table_tensor=meta["block_table_1"],
        slot_mapping=meta["slot_mappings"][1][:T], seq_lens_cpu_upper_bound=seq_lens.cpu())
    md = cls.build(builder, 0, common)
    out = {f"swa_{k}": v for k, v in vars(md).items() if isinstance(v, torch.Tensor)}
    return out


def sparse_mla_metadata(batch: Batch, seed: int, meta: dict[str, torch.Tensor],
                        swa: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """DeepseekV4SparseMLAMetadataBuilder.build (models/deepseek_v4/sparse_mla.py:185), once per step for the C4A and
    once for the C128A layers: token -> request map, compressed slot mapping (compressor_utils.py:218) and, for
    C128A, its top-k metadata (sparse_mla.py:263); then the C4A decode path's global top-k indices and lengths
    (nvidia/flashmla.py:196) from the indexer's top-k buffer and the SWA metadata's token map and validity mask.
    The builder is called unbound on a stand-in holding what its __init__ (sparse_mla.py:127-183) sets for the
    default deployment (main KV block 256, vLLM's own MLAAttentionSpec with tokens_per_state = the ratio)."""
    dev, g = batch.device, _gen(batch.device, seed + 12)
    backend, mla, kvi = _m["backend"], _m["sparse_mla"], _m["kv_cache_interface"]
    T, n = batch.num_tokens, batch.num_reqs
    qsl, seq_lens = batch.query_start_loc(), batch.seq_lens()
    out: dict[str, torch.Tensor] = {}
    c128_max = _cdiv(_cdiv(MAX_MODEL_LEN, 128), 128) * 128  # sparse_mla.py:158-164
    for ratio in (4, 128):
        spec = kvi.MLAAttentionSpec(block_size=BLOCK_SIZES[0], num_kv_heads=1, head_size=584, dtype=torch.uint8,
                                    cache_dtype_str="fp8_ds_mla", model_version="deepseek_v4", tokens_per_state=ratio)
        builder = types.SimpleNamespace(
            kv_cache_spec=spec, compress_ratio=ratio, reorder_batch_threshold=2, topk_tokens=INDEX_TOPK,
            req_id_per_token_buffer=torch.empty(MAX_BATCHED, dtype=torch.int32, device=dev),
            compressed_slot_mapping_buffer=torch.empty(MAX_BATCHED, dtype=torch.int64, device=dev),
            c128a_max_compressed=c128_max,
            c128a_global_decode_buffer=torch.empty((MAX_BATCHED, c128_max), dtype=torch.int32, device=dev),
            c128a_decode_lens_buffer=torch.empty(MAX_BATCHED, dtype=torch.int32, device=dev),
            c128a_prefill_buffer=torch.empty((MAX_BATCHED, c128_max), dtype=torch.int32, device=dev))
        builder._build_c128a_metadata = types.MethodType(mla.DeepseekV4SparseMLAMetadataBuilder._build_c128a_metadata,
                                                         builder)
        common = backend.CommonAttentionMetadata(
            query_start_loc=qsl, query_start_loc_cpu=qsl.cpu(), seq_lens=seq_lens, num_reqs=n, num_actual_tokens=T,
            max_query_len=max(batch.scheduled), max_seq_len=int(seq_lens.max()),
            block_table_tensor=meta["block_table_0"], slot_mapping=meta["slot_mappings"][0][:T],
            positions=batch.positions(), seq_lens_cpu_upper_bound=seq_lens.cpu())
        md = mla.DeepseekV4SparseMLAMetadataBuilder.build(builder, 0, common)
        out.update({f"c{ratio}a_{k}": v for k, v in vars(md).items() if isinstance(v, torch.Tensor)})
    decodes = [i for i, q in enumerate(batch.scheduled) if q <= 2]
    num_decode_tokens = sum(batch.scheduled[i] for i in decodes)
    if num_decode_tokens:
        # The indexer's top-k per decode token (DeepGEMM's top-k in a long context): distinct compressed positions
        # below the token's compressed length, -1 after (every position when there are at most index_topk)
        topk = torch.full((num_decode_tokens, INDEX_TOPK), -1, dtype=torch.int32, device=dev)
        for t, pos in enumerate(batch.positions()[:num_decode_tokens].tolist()):
            length = (pos + 1) // 4
            picked = torch.randperm(length, generator=g, device=dev)[:INDEX_TOPK] if length > INDEX_TOPK else \
                torch.arange(length, device=dev)
            topk[t, :len(picked)] = picked.to(torch.int32)
        indices, topk_lens = _m["cache_utils"].compute_global_topk_indices_and_lens(
            topk, swa["swa_token_to_req_indices"], meta["block_table_0"][:len(decodes)], BLOCK_SIZES[0] // 4,
            swa["swa_is_valid_token"][:num_decode_tokens])
        out.update(c4a_global_topk_indices=indices, c4a_topk_lens=topk_lens)
    return out


def moe_routing(batch: Batch, seed: int, padding: bool) -> dict[str, torch.Tensor]:
    """fused_topk_bias (model_executor/layers/fused_moe/router/fused_topk_bias_router.py:146), the router of every
    non-hash MoE layer and of the MTP layer: fp32 gate logits of the 256 experts (GateLinear), sqrtsoftplus scores,
    the noaux_tc correction bias, top-6 renormalized, scaled by routed_scaling_factor 1.5 (the checkpoint's
    config), indices int32 -> dsv4_topk (dsv4_topk.py:152). With VLLM_MOE_SKIP_PADDING (on by default) the router
    reads the forward context's padding mask: the V2 runner sets the step's (gpu/model_runner.py:1398), the MTP
    speculator's forward context holds none (target_dependent_ar/speculator.py:384)."""
    dev, g = batch.device, _gen(batch.device, seed + 13)
    T = batch.num_tokens
    forward_context = importlib.import_module("vllm.forward_context")
    forward_context.CURRENT.is_padding = torch.zeros(T, dtype=torch.bool, device=dev) if padding else None
    try:
        weights, ids = _m["fused_topk_bias_router"].fused_topk_bias(
            _randn((T, 4096), torch.bfloat16, g, dev), _randn((T, 256), torch.float32, g, dev), "sqrtsoftplus",
            _randn((256,), torch.float32, g, dev) * 0.1, 6, True, None,
            input_tokens=torch.randint(0, VOCAB, (T,), generator=g, device=dev, dtype=torch.int32),
            routed_scaling_factor=1.5)
    finally:
        forward_context.CURRENT.is_padding = None
    return {f"moe_topk_weights{'' if padding else '_mtp'}": weights, f"moe_topk_ids{'' if padding else '_mtp'}": ids}


# --------------------------------------------------------------------------------------------------
# MTP 1 on the V2 runner: verify the drafts of the previous step, then draft the next token
#
# A request of a verification step: (prompt length, tokens computed before the step, tokens scheduled, drafts).
# A decode with MTP 1 schedules 2 tokens (its last sampled token and its draft); a prefill chunk schedules part of
# its prompt and has no draft. Requests are listed decodes first, as the scheduler orders them.
VERIFY_EVERY_OPTION = [(30, 39, 2, 1), (250, 302, 2, 1), (1000, 1101, 2, 1), (40, 46, 2, 1)]
VERIFY_WITH_PREFILLS = [(20, 37, 2, 1), (200, 300, 2, 1), (900, 1100, 2, 1), (30, 45, 2, 1), (3000, 4000, 2, 1),
                        (60, 77, 2, 1), (100, 129, 2, 1), (30, 0, 9, 0), (31, 0, 31, 0)]


def _greedy_or_options(row: int) -> Params:
    """Every third request greedy (temperature 0), the others random with every option on, top-k and top-p too."""
    p = _every_option(row)
    if row % 3 == 0:
        p.temperature = 0.0
    else:
        p.top_k, p.top_p = 20 + 30 * row, 0.9
    return p


def _greedy_or_plain(row: int) -> Params:
    """Greedy and plain random requests (temperature 1, nothing else): no request needs its logits processed, so
    the rejection sampler verifies on the raw bf16 logits (sampler.py:239)."""
    return Params(temperature=0.0 if row % 2 else 1.0, top_k=0, top_p=1.0, min_p=0.0,
                  logprobs=3 if row % 3 == 0 else None)


def spec_decode_step(reqs: list[tuple[int, int, int, int]], device: str, seed: int,
                     params_for: Any) -> dict[str, torch.Tensor]:
    """One MTP-1 step of the V2 runner after the target model's forward, through vLLM's own code:
    prepare_inputs (gpu/model_runner.py:1388-1524: expand_idx_mapping, prepare_prefill_inputs for prefill chunks,
    prepare_pos_seq_lens, combine_sampled_and_draft_tokens), RejectionSampler.__call__ (model_runner.py:1688;
    gather_draft_sampled, the sampler's apply_sampling_params, rejection_sample, logprobs, get_num_sampled_and_
    rejected), post_update (model_runner.py:1735), then the MTP speculator's propose (model_runner.py:2308): its
    prepare_prefill_inputs (target_dependent_ar/speculator.py:226), the MTP layer's fused input RMSNorm and shared-head
    RMSNorm (models/deepseek_v4/nvidia/mtp.py:166, 294); the draft itself is a torch argmax of the MTP head's logits
    (spec_decode/speculator.py:479, no Triton), and with k = 1 propose returns after the draft prefill
    (target_dependent_ar/speculator.py:297).

    Request state is vLLM's RequestState, filled as the runner fills it (add_request, then the tokens a decode has
    already sampled); the previous step's drafts sit in req_states.draft_tokens. The target logits are unit-scale
    bf16 with half of the decodes' drafts made the argmax of their verification rows, so drafts are accepted (bonus
    token sampled) and rejected (a recovered token resampled) in the same step. (Rows r % 4 < 2: the draft's
    logit is 20, so even a random request keeps it with probability ~1 - 5e-4.)"""
    dev = torch.device(device)
    g = _gen(device, seed + 9)
    cpu = torch.Generator().manual_seed(seed)
    rs_mod, ib = _m["req_states"], _m["input_batch"]
    rs = rs_mod.RequestState(MAX_NUM_REQS, MAX_MODEL_LEN, MAX_BATCHED, 1, VOCAB, dev)
    slots: list[int] = []
    tokens_of: list[list[int]] = []
    for i, (prompt, computed, _scheduled, drafts) in enumerate(reqs):
        tokens_of.append(torch.randint(0, VOCAB, (max(prompt, computed + 1),), generator=cpu).tolist())
        # states.py:91, as a new request whose prompt the prefix cache partly holds (a chunked prefill: its first
        # chunk; a decode: half its prompt), so the admission's num_computed_tokens write changes something
        rs.add_request(f"req-{i}", prompt, tokens_of[i][:prompt], computed if computed < prompt else prompt // 2, 512)
        slots.append(rs.req_id_to_index[f"req-{i}"])
    # The step that admitted them applied their writes (states.py:120) before any later step's; staging a decode's
    # progress in the same apply would write total_len and num_computed_tokens twice at one index, and which of
    # _apply_write_kernel's programs lands last is a race (JIT against JIT differs too).
    rs.apply_staged_writes()
    for i, (prompt, computed, _scheduled, drafts) in enumerate(reqs):
        slot, tokens = slots[i], tokens_of[i]
        if computed >= prompt:  # decoding: its outputs so far (post_update's writes of earlier steps), the last one
            # not yet computed
            rs.all_token_ids.stage_write(slot, prompt, tokens[prompt:computed + 1])
            rs.total_len.stage_write_elem(slot, computed + 1)
            rs.num_computed_tokens.stage_write_elem(slot, computed)
            rs.num_computed_tokens_np[slot] = computed
            rs.last_sampled_tokens[slot, 0] = tokens[computed]
            rs.draft_tokens[slot, :drafts] = torch.randint(0, VOCAB, (drafts,), generator=cpu).to(dev)
    rs.apply_staged_writes()
    setup = _sampling_setup(slots, device, seed, params_for)
    out: dict[str, torch.Tensor] = {}

    # prepare_inputs
    n = len(reqs)
    scheduled = np.array([r[2] for r in reqs], dtype=np.int32)
    num_logits_np = np.array([r[3] for r in reqs], dtype=np.int32) + 1
    T, total_logits = int(scheduled.sum()), int(num_logits_np.sum())
    idx_mapping_np = np.array(slots, dtype=np.int64)
    idx_mapping = torch.tensor(idx_mapping_np, device=dev)
    cu_np = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(num_logits_np, out=cu_np[1:])
    cu_num_logits = torch.tensor(cu_np, device=dev)
    buffers = ib.InputBuffers(MAX_NUM_REQS, MAX_BATCHED, dev)
    qsl_np = np.full(MAX_NUM_REQS + 1, T, dtype=np.int32)
    qsl_np[0] = 0
    np.cumsum(scheduled, out=qsl_np[1:n + 1])
    buffers.query_start_loc.copy_(torch.tensor(qsl_np))
    query_start_loc = buffers.query_start_loc[:n + 1]
    expanded_idx_mapping, expanded_local_pos = ib.expand_idx_mapping(idx_mapping, total_logits, cu_num_logits, 2)
    if any(r[1] < r[0] for r in reqs):  # model_runner.py:1487 (batch_req_state.has_prefill)
        ib.prepare_prefill_inputs(buffers.input_ids, rs.next_prefill_tokens, idx_mapping, query_start_loc,
                                  rs.all_token_ids.gpu, rs.prefill_len.gpu, rs.num_computed_tokens.gpu)
    ib.prepare_pos_seq_lens(idx_mapping, query_start_loc, rs.num_computed_tokens.gpu, buffers.positions,
                            buffers.seq_lens)
    seq_lens = buffers.seq_lens[:n]
    logits_indices = ib.combine_sampled_and_draft_tokens(
        buffers.input_ids, idx_mapping, rs.last_sampled_tokens, query_start_loc, seq_lens, rs.prefill_len.gpu,
        rs.draft_tokens, cu_num_logits, total_logits, 1)
    upper = torch.tensor([r[1] + r[2] for r in reqs], dtype=torch.int32)
    batch = types.SimpleNamespace(  # the InputBatch fields RejectionSampler and the speculator read
        num_reqs=n, num_tokens=T, input_ids=buffers.input_ids[:T], positions=buffers.positions[:T],
        idx_mapping=idx_mapping, idx_mapping_np=idx_mapping_np, query_start_loc=query_start_loc, seq_lens=seq_lens,
        logits_indices=logits_indices, expanded_idx_mapping=expanded_idx_mapping,
        expanded_local_pos=expanded_local_pos, cu_num_logits=cu_num_logits, cu_num_logits_np=cu_np,
        seq_lens_cpu_upper_bound=upper)
    out.update(input_ids=batch.input_ids, positions=batch.positions, seq_lens=seq_lens, logits_indices=logits_indices,
               expanded_idx_mapping=expanded_idx_mapping, expanded_local_pos=expanded_local_pos)

    # The target model's logits rows (bf16, compute_logits) and the rejection sampler.
    logits = _randn((total_logits, VOCAB), torch.bfloat16, g, device)
    for r, (prompt, computed, _s, drafts) in enumerate(reqs):
        if drafts and r % 4 < 2:  # the draft's verification row makes it all but certain (greedy and random): accepted
            logits[int(cu_np[r]), int(rs.draft_tokens[slots[r], 0])] = 20.0
    sampler = types.SimpleNamespace(
        sampling_states=setup["states"], req_states=rs, use_fp64_gumbel=False, logprobs_mode="raw_logprobs",
        return_sampling_mask=False, compute_nans=False, needs_logits_processing=setup["needs"],
        # the native logits processors (sampler.py:71-76) with their state; thinking budget: no request sets one
        logits_processors=[types.SimpleNamespace(apply=lambda lg, ctx: _apply_processors(
            lg, ctx.expanded_idx_mapping, ctx.pos, ctx.input_ids, ctx.expanded_local_pos, setup) or lg)],
        thinking_budget_state=types.SimpleNamespace(apply=lambda lg, ctx: None))
    sampler.apply_sampling_params = types.MethodType(_m["sampler"].Sampler.apply_sampling_params, sampler)
    spec_config = types.SimpleNamespace(  # SpeculativeConfig defaults (config/speculative.py:562-660), MTP 1
        num_speculative_tokens=1, enable_adaptive_verification=False, rejection_sample_method="standard",
        fly_entropy_threshold=0.3, fly_entropy_top_k=3, fly_window_size=None, synthetic_acceptance_rates=None)
    rejection = _m["rejection_sampler"].RejectionSampler(sampler, spec_config, dev)
    result = rejection(logits, batch, None, None)  # draft logits: None (greedy MTP drafts, speculator.py:479)
    out.update(target_logits=logits, sampled=result.sampled_token_ids, num_sampled=result.num_sampled,
               num_rejected=result.num_rejected)
    if result.logprobs_tensors is not None:
        out.update(logprob_token_ids=result.logprobs_tensors.logprob_token_ids,
                   logprobs=result.logprobs_tensors.logprobs)

    # postprocess_sampled (model_runner.py:1720-1745): the penalties state's output counts, as the runner passes them
    ib.post_update(idx_mapping, rs.num_computed_tokens.gpu, rs.last_sampled_tokens, setup["output_bin_counts"],
                   result.sampled_token_ids, result.num_sampled, result.num_rejected, query_start_loc,
                   rs.all_token_ids.gpu, rs.total_len.gpu, None, rs.draft_tokens)
    out.update(num_computed=rs.num_computed_tokens.gpu, last_sampled=rs.last_sampled_tokens,
               total_len=rs.total_len.gpu)

    # The MTP speculator's propose (target_dependent_ar/speculator.py:165-300) with its own buffers (:33-50).
    sp = _m["speculator"]
    draft_buffers = ib.InputBuffers(MAX_NUM_REQS, MAX_BATCHED, dev)
    last_token_indices = torch.zeros(MAX_NUM_REQS, dtype=torch.int64, device=dev)
    current_draft_step = torch.tensor(0, dtype=torch.int64, device=dev)
    sp.prepare_prefill_inputs(last_token_indices, current_draft_step, draft_buffers, batch, result.num_sampled,
                              result.num_rejected, rs.last_sampled_tokens, rs.next_prefill_tokens, MAX_NUM_REQS)
    out.update(draft_input_ids=draft_buffers.input_ids[:T], draft_positions=draft_buffers.positions[:T],
               last_token_indices=last_token_indices)
    out.update(mtp_layer(draft_buffers.positions[:T], last_token_indices[:n], device, seed))
    return out


def mtp_layer(positions: torch.Tensor, last_token_indices: torch.Tensor, device: str,
              seed: int) -> dict[str, torch.Tensor]:
    """The MTP layer's Triton norms (models/deepseek_v4/nvidia/mtp.py): the fused input RMSNorm of the draft tokens'
    embeddings and the target's pre-hc_head residual (hc_mult 4 x hidden 4096, :166), and the shared head's RMSNorm
    of the rows the draft is sampled from (:294). Embeddings and hidden states are unit-scale bf16 stand-ins for the
    layers in between (GEMMs, MoE, FlashMLA: not Triton)."""
    g = _gen(device, seed + 11)
    mtp = _m["fused_mtp_input_rmsnorm"]
    T, hidden, hc = positions.shape[0], 4096, 4
    embeds = _randn((T, hidden), torch.bfloat16, g, device)
    previous = _randn((T, hc * hidden), torch.bfloat16, g, device).view(-1, hc, hidden)  # mtp.py:162
    e_norm, h_norm = mtp._FUSED_MTP_INPUT_RMSNORM_KERNEL(
        embeds, positions, previous, _randn((hidden,), torch.bfloat16, g, device),
        _randn((hidden,), torch.bfloat16, g, device), 1e-6, hc)
    head_in = _randn((T, hidden), torch.bfloat16, g, device)[last_token_indices].contiguous()
    head = mtp._MTP_SHARED_HEAD_RMSNORM_KERNEL(head_in, _randn((hidden,), torch.bfloat16, g, device), 1e-6)
    return {"mtp_enorm": e_norm, "mtp_hnorm": h_norm, "mtp_shared_head": head}


# --------------------------------------------------------------------------------------------------
# Sampler (V2): every option on, in the order of vLLM's Sampler (v1/worker/gpu/sample/sampler.py)

@dataclass
class Params:
    """The per-request SamplingParams fields vLLM's sampler states read (SamplingStates.add_request, states.py:41;
    PenaltiesState.add_request, penalties.py:50)."""

    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    logprobs: int | None = None


# Top-k / top-p request mixes: each gives SamplingStates.get_top_k_top_p (states.py:105) a different
# (top_k, top_p, has_topp_only_rows) and so a different path through apply_top_k_top_p_triton
# (topk_topp_triton.py:1681-1722): top-k + top-p in every row (monolithic kernel only); top-k rows and top-p-only
# rows mixed (monolithic kernel, then the split top-p pipeline with K); top-p only (top_k None: the split pipeline
# alone); top-k only (top_p None).
TOPK_TOPP_MIXES = ("k_and_p", "k_rows_and_p_only_rows", "p_only", "k_only")


def _mix_params(mix: str, row: int, g: torch.Generator) -> tuple[int, float]:
    k = int(torch.randint(5, 200, (1,), generator=g, device=g.device))
    p = float(torch.rand(1, generator=g, device=g.device)) * 0.5 + 0.4
    if mix == "k_and_p":
        return k, p
    if mix == "k_rows_and_p_only_rows":
        return (k, p) if row % 2 else (0, p)  # top_k 0: disabled (states.py:47)
    if mix == "p_only":
        return 0, p
    return k, 1.0


def sampling(idx_list: list[int], local_pos: list[int], device: str, seed: int) -> dict[str, torch.Tensor]:
    """One Sampler.__call__ (sampler.py:134) on raw logits for the tokens of idx_list (request slots, one per
    logits row; MTP verification repeats a request's slot per row, local_pos numbering them)."""
    state: dict[str, Any] = {}
    out = _site("sampler: logits processors, temperature, min-p",
                lambda: _processors(idx_list, local_pos, device, seed, state))
    if "logits" not in state:
        return out
    out.update(_site("sampler: top-k/top-p", lambda: _topk_topp(device, seed, state)))
    state.setdefault("processed", state["logits"])  # top-k/top-p raised (recorded): the later sites still run
    out.update(_site("sampler: gumbel sample", lambda: _gumbel(state)))
    if "sampled" not in state:  # gumbel raised (recorded): logprobs of some token still run
        state["sampled"] = torch.zeros(len(state["idx_np"]), dtype=torch.int64, device=device)
    out.update(_site("sampler: logprobs", lambda: _logprobs(state)))
    return out


def _processors(idx_list: list[int], local_pos_list: list[int], device: str, seed: int,
                state: dict) -> dict[str, torch.Tensor]:
    """Sampler.apply_sampling_params (sampler.py:226-268): fp32 copy of the raw logits, the logits processors
    (logit bias, penalties, bad words: sampler.py:71-76, in that order), then temperature and min-p. Every option
    is chosen so that its kernel changes values: the model's raw logits are unit-scale bf16, min-p keeps about a
    quarter of the vocabulary per row, and nothing before top-k/top-p masks a whole row."""
    setup = _sampling_setup(list(dict.fromkeys(idx_list)), device, seed, _every_option)
    g = setup["g"]
    T = len(idx_list)
    idx = torch.tensor(idx_list, dtype=torch.int64, device=device)
    idx_np = idx.cpu().numpy()
    local_pos = torch.tensor(local_pos_list, dtype=torch.int32, device=device)
    # compute_logits output: head_dtype = the model dtype (bf16, config/model.py:2521), vocab rows of 129280 (a
    # multiple of 64: no padding column, logits_processor.py:198).
    raw = _randn((T, VOCAB), torch.bfloat16, g, device)
    input_ids = torch.randint(0, VOCAB, (T,), generator=g, device=device, dtype=torch.int32)
    pos = torch.full((T,), 45, dtype=torch.int64, device=device)  # positions of the logits rows
    logits = torch.empty_like(raw, dtype=torch.float32).copy_(raw)  # sampler.py:242
    _apply_processors(logits, idx, pos, input_ids, local_pos, setup)
    states = setup["states"]
    states.apply_temperature(logits, idx, idx_np)  # sampler.py:263
    states.apply_min_p(logits, idx, idx_np)  # sampler.py:268
    state.update(logits=logits, raw=raw, idx=idx, idx_np=idx_np, pos=pos, g=g, states=states, params=setup["params"])
    return {"logits_processed": logits.clone()}


def _every_option(row: int) -> Params:
    """A request with every sampling option on, values varying by row."""
    return Params(temperature=0.6 + 0.1 * (row % 5), top_k=0, top_p=1.0, min_p=0.002 * (1 + row % 3),
                  repetition_penalty=1.1 + 0.05 * (row % 4), frequency_penalty=0.3 * (row % 3),
                  presence_penalty=0.2 * (row % 2), logprobs=5 if row % 2 == 0 else 2)


def _sampling_setup(slots: list[int], device: str, seed: int, params_for: Any) -> dict[str, Any]:
    """The sampler's per-request state for the request slots: SamplingStates (vLLM's own) filled by add_request,
    and the tensors of the logits processors' states (logit bias, penalties with the bincount their
    apply_staged_writes launches, bad words), every option on for every slot."""
    g = _gen(device, seed + 3)
    n_slots = MAX_NUM_REQS
    # Requests carry no seed (the default): add_request draws one from numpy's global RNG (states.py:54), seeded
    # here so that the JIT and the loader processes sample alike.
    np.random.seed(seed % 2**32)
    states = _m["states"].SamplingStates(n_slots, VOCAB)
    params: dict[int, Params] = {}
    needs = np.zeros(n_slots, dtype=bool)  # Sampler.needs_logits_processing (sampler.py:96-101)
    for row, slot in enumerate(slots):
        params[slot] = params_for(row)
        p = params[slot]
        # SamplingStates' answer or any logits processor's (sampler.py:96-101): penalties, with logit bias and bad
        # words, are on for a request exactly when its params set a penalty (the plain requests set none)
        needs[slot] = states.add_request(slot, p) or (p.repetition_penalty != 1.0 or p.frequency_penalty != 0.0
                                                      or p.presence_penalty != 0.0)
    states.apply_staged_writes()

    # Request state (states.py RequestState): token ids [max_num_reqs, max_model_len], prompt / prefill / total
    # lengths. Every other request was preempted and resumed: prefill_len > prompt_len, so its re-prefilled
    # output tokens are counted as output (penalties.py _bincount_kernel).
    all_token_ids = torch.randint(0, VOCAB, (n_slots, MAX_MODEL_LEN), generator=g, device=device, dtype=torch.int32)
    prompt_len = torch.full((n_slots,), 40, dtype=torch.int32, device=device)
    prefill_len = prompt_len.clone()
    slot_t = torch.tensor(slots, dtype=torch.int64, device=device)
    prefill_len[slot_t[::2]] = 52
    total_len = prefill_len + 3

    # LogitBiasState (logit_bias.py:131): logit_bias on every request (distinct token ids per row, as the dict it
    # comes from), allowed_token_ids on one, min_tokens stop ids on the others until position 50.
    lb = _m["logit_bias"]
    n_allowed, n_bias, n_stop = lb.MAX_NUM_ALLOWED_TOKEN_IDS, lb.MAX_NUM_LOGIT_BIAS_TOKENS, lb.MAX_NUM_STOP_TOKEN_IDS
    rows = torch.arange(n_slots, device=device, dtype=torch.int32)[:, None]
    distinct = lambda width, step: ((rows * 7919 + torch.arange(width, device=device, dtype=torch.int32) * step)
                                    % VOCAB).to(torch.int32)
    num_allowed = torch.zeros(n_slots, dtype=torch.int32, device=device)
    num_allowed[slots[0]] = 300
    bias_args = (num_allowed, distinct(n_allowed, 89), torch.full((n_slots,), 16, dtype=torch.int32, device=device),
                 distinct(n_bias, 97), torch.randn(n_slots, n_bias, generator=g, device=device) * 2,
                 torch.full((n_slots,), 50, dtype=torch.int32, device=device),
                 torch.full((n_slots,), 3, dtype=torch.int32, device=device),
                 torch.zeros(n_slots, dtype=torch.int32, device=device), distinct(n_stop, 101))

    # PenaltiesState: bincount at apply_staged_writes (penalties.py:66).
    pen = _m["penalties"]
    per_slot = lambda attr, default: torch.tensor([getattr(params[s], attr) if s in params else default
                                                   for s in range(n_slots)], dtype=torch.float32, device=device)
    prompt_bin_mask = torch.zeros((n_slots, (VOCAB + 31) // 32), dtype=torch.int32, device=device)
    output_bin_counts = torch.zeros((n_slots, VOCAB), dtype=torch.int32, device=device)
    pen.bincount(slot_t, all_token_ids, prompt_len, prefill_len, prompt_bin_mask, output_bin_counts,
                 int(prefill_len[slot_t].max()))
    penalty_args = (per_slot("repetition_penalty", 1.0), per_slot("frequency_penalty", 0.0),
                    per_slot("presence_penalty", 0.0), prompt_bin_mask, output_bin_counts)

    # BadWordsState (bad_words.py:79): 4 bad words per request (lengths 2, 1, 3, 2); the 1-token word is always
    # banned, the others when their prefix matches the output.
    max_bad = 4
    bad_ids = torch.randint(0, VOCAB, (n_slots, BAD_WORDS_TOTAL_TOKENS), generator=g, device=device,
                            dtype=torch.int32)
    offsets = torch.zeros((n_slots, MAX_NUM_BAD_WORDS + 1), dtype=torch.int32, device=device)
    offsets[:, :5] = torch.tensor([0, 2, 3, 6, 8], dtype=torch.int32, device=device)
    bad_args = (bad_ids, offsets, torch.full((n_slots,), max_bad, dtype=torch.int32, device=device), all_token_ids,
                prompt_len, total_len)
    return dict(g=g, states=states, params=params, needs=needs, bias_args=bias_args, penalty_args=penalty_args,
                bad_args=bad_args, max_bad=max_bad, output_bin_counts=output_bin_counts)


def _apply_processors(logits: torch.Tensor, idx: torch.Tensor, pos: torch.Tensor, input_ids: torch.Tensor,
                      local_pos: torch.Tensor, setup: dict[str, Any]) -> None:
    """The logits processors' apply, in the sampler's order (sampler.py:71-76): LogitBiasState.apply
    (logit_bias.py:131), PenaltiesState.apply (penalties.py:88), BadWordsState.apply (bad_words.py:79)."""
    _m["logit_bias"].apply_logit_bias(logits, idx, pos, *setup["bias_args"])
    _m["penalties"].apply_penalties(logits, idx, input_ids, local_pos, *setup["penalty_args"])
    _m["bad_words"].apply_bad_words(logits, idx, *setup["bad_args"], input_ids, local_pos, setup["max_bad"])


def _topk_topp(device: str, seed: int, state: dict) -> dict[str, torch.Tensor]:
    """Sampler._sample_random (sampler.py:347): apply_top_k_top_p with what SamplingStates.get_top_k_top_p gives
    for each request mix (TOPK_TOPP_MIXES), on the processed logits. The first mix's result is sampled."""
    idx, idx_np, g = state["idx"], state["idx_np"], state["g"]
    out = {}
    for mix in TOPK_TOPP_MIXES:
        states = _m["states"].SamplingStates(MAX_NUM_REQS, VOCAB)
        np.random.seed(1)
        for row, (slot, p) in enumerate(state["params"].items()):
            top_k, top_p = _mix_params(mix, row, g)
            states.add_request(slot, Params(temperature=p.temperature, top_k=top_k, top_p=top_p, min_p=p.min_p))
        states.apply_staged_writes()
        top_k, top_p, has_topp_only_rows = states.get_top_k_top_p(idx, idx_np, VOCAB)  # sampler.py:301
        result = _m["topk_topp_sampler"].apply_top_k_top_p(state["logits"].clone(), top_k, top_p,
                                                           has_topp_only_rows=has_topp_only_rows)
        out[f"topk_topp_{mix}"] = result
        if mix == TOPK_TOPP_MIXES[0]:
            state["processed"] = result
    return out


def _gumbel(state: dict) -> dict[str, torch.Tensor]:
    """Gumbel sampling (sampler.py:350) of the processed logits.

    The target's sampler, also when it verifies MTP drafts (sample/sampler.py:357: is_drafting=False); only
    probabilistic draft sampling (draft logits kept, a non-default flag) passes is_drafting=True
    (spec_decode/speculator.py:473), and with it logits_cache: not a default-deployment call."""
    states = state["states"]
    state["sampled"] = _m["gumbel"].gumbel_sample(state["processed"], state["idx"], states.temperature.gpu,
                                                  states.seeds.gpu, state["pos"], apply_temperature=False,
                                                  is_drafting=False)
    return {"sampled": state["sampled"]}


def _logprobs(state: dict) -> dict[str, torch.Tensor]:
    """Logprobs in the default raw_logprobs mode: compute_topk_scores on the raw model logits (sampler.py:171-186;
    "raw_logprobs" is not in PROCESSED_LOGPROBS_MODES, so the processed fp32 copy is not what it reads)."""
    idx_np = state["idx_np"]
    num_logprobs = state["states"].max_num_logprobs(idx_np)  # sampler.py:123 (get_logprobs_dims)
    cu = None
    if len(idx_np) != len(set(idx_np.tolist())):  # expanded rows: cu_num_logits per request (sampler.py:175)
        counts = collections.Counter(idx_np.tolist())
        cu = [0]
        for slot in dict.fromkeys(idx_np.tolist()):
            cu.append(cu[-1] + counts[slot])
    scores = _m["logprob"].compute_topk_scores(state["raw"], num_logprobs, state["sampled"], cu,
                                               max_per_req_token_ids=0, logits_mode=False)
    return {"logprob_token_ids": scores.logprob_token_ids, "logprobs": scores.logprobs,
            "ranks": scores.selected_token_ranks}


# --------------------------------------------------------------------------------------------------
# The steps

def _model_step(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    meta = _site("runner block tables", lambda: runner_metadata(batch, seed))
    out = dict(meta)
    out.update(_site("q/kv rmsnorm", lambda: attention_ops(batch, seed, meta)))
    out.update(_site("inverse rope + fp8 quant", lambda: inv_rope(batch, seed)))
    out.update(_site("MoE router", lambda: moe_routing(batch, seed, padding=True)))
    for ratio, head in ((4, HEAD_DIM), (128, HEAD_DIM), (4, 128)):  # 128: the indexer's compressor
        if "slot_mappings" in meta:
            out.update(_site(f"compressor states c{ratio}/{head}",
                             lambda: compressor_state(batch, seed, ratio, head, meta)))
    out.update(_site("KV block zeroing", lambda: kv_block_zeroing(batch, seed)))
    if "slot_mappings" in meta:
        swa = _site("SWA metadata", lambda: swa_metadata(batch, seed, meta))
        out.update(swa)
        if swa:
            out.update(_site("sparse MLA metadata", lambda: sparse_mla_metadata(batch, seed, meta, swa)))
    out.update(_site("indexer short-context top-k", lambda: short_context_topk(batch, seed)))
    if any(n > 1 for n in batch.scheduled):
        out.update(_site("combine top-k + SWA", lambda: sparse_prefill_ops(batch, seed)))
        if "block_table_0" in meta:
            out.update(_site("indexer prefill chunks", lambda: indexer_prefill_metadata(batch, seed, meta)))
    return out


def prefill(device: str, seed: int) -> dict[str, torch.Tensor]:
    return _model_step(Batch([0, 0, 0], [37, 300, 1100], device), seed)


def decode(device: str, seed: int) -> dict[str, torch.Tensor]:
    batch = Batch([37, 300, 1100, 45, 4000, 77, 129, 511], [1] * 8, device)
    out = _model_step(batch, seed)
    out.update(sampling(_slots(batch), [0] * batch.num_reqs, device, seed))
    return out


def mixed(device: str, seed: int) -> dict[str, torch.Tensor]:
    # decodes first: the scheduler's order, which the attention metadata builders rely on (sparse_swa.py:602)
    return _model_step(Batch([38, 301, 2000, 0], [1, 1, 1, 250], device), seed)


def mtp_draft_and_verify(device: str, seed: int) -> dict[str, torch.Tensor]:
    """MTP 1 on the V2 runner: every decode request verifies 1 draft token (2 query tokens). The target model's
    kernels on the verification batch, then the runner's spec-decode path twice: on that batch with every sampling
    option (greedy and random requests: the rejection kernels on processed fp32 logits), and on a later step of 9
    requests with two prefill chunks (greedy and plain random requests: on the raw bf16 logits; 16 logits rows)."""
    batch = Batch([r[1] for r in VERIFY_EVERY_OPTION], [r[2] for r in VERIFY_EVERY_OPTION], device)
    out = _model_step(batch, seed)
    out.update(indexer_decode_pack(batch, seed))
    for name, reqs, params_for in (("every option", VERIFY_EVERY_OPTION, _greedy_or_options),
                                   ("prefill chunks, raw logits", VERIFY_WITH_PREFILLS, _greedy_or_plain)):
        got = _site(f"MTP verify and draft ({name})", lambda: spec_decode_step(reqs, device, seed, params_for))
        out.update({f"{name.split()[0]}_{k}": v for k, v in got.items()})
    # the MTP layer's MoE router, in the speculator's forward context (no padding mask)
    out.update(_site("MTP layer MoE router", lambda: moe_routing(batch, seed, padding=False)))
    return out


def sampling_all_options(device: str, seed: int) -> dict[str, torch.Tensor]:
    """72 requests: above topk_topp_triton's _SPLIT_MAX_BATCH (64), so top-p runs in the monolithic kernel (the
    decode and MTP steps, 8 rows, take the split top-p pipeline)."""
    return sampling([3 + 5 * i for i in range(72)], [0] * 72, device, seed)


def _slots(batch: Batch) -> list[int]:
    return [int(s) for s in batch.idx_mapping().tolist()]


STEPS = {
    "prefill": prefill,
    "decode": decode,
    "mixed": mixed,
    "mtp_draft_and_verify": mtp_draft_and_verify,
    "sampling_all_options": sampling_all_options,
}
