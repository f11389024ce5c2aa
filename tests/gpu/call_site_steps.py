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

import importlib
import types
from dataclasses import dataclass
from typing import Any

import torch

VOCAB = 129280
MAX_NUM_REQS = 1024
MAX_BATCHED = 8192
MAX_MODEL_LEN = 8192
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
    "vllm.models.common.ops.fused_qk_rmsnorm",
    "vllm.models.deepseek_v4.common.ops.fused_inv_rope_fp8_quant",
    "vllm.models.deepseek_v4.common.ops.save_partial_states",
    "vllm.models.deepseek_v4.common.ops.cache_utils",
    "vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache",
    "vllm.v1.attention.ops.common",
    "vllm.v1.attention.backends.mla.indexer",
)

_m: dict[str, Any] = {}
# kernel qualname -> tensors it writes through a table of device addresses (set by check_call_sites:
# its tracer counts and hashes them as that kernel's outputs).
INDIRECT: dict[str, list[torch.Tensor]] = {}
ERRORS: list[str] = []  # call sites of the current step that raised (the step goes on with the next)


def _site(name: str, call: Any) -> dict[str, torch.Tensor]:
    """Run one call site; an exception is recorded (the step fails) and the step continues."""
    try:
        return call() or {}
    except Exception as exc:  # noqa: BLE001 - reported per call site
        ERRORS.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
        return {}


def import_call_sites() -> list[Any]:
    """Import every call-site module (from the mounted vLLM copy) and return them."""
    for name in CALL_SITE_MODULES:
        _m[name.rpartition(".")[2]] = importlib.import_module(name)
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


def _randn(shape: tuple, dtype: torch.dtype, g: torch.Generator, device: str) -> torch.Tensor:
    return torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)


# --------------------------------------------------------------------------------------------------
# V2 model runner: block tables (staged writes, gather, slot mappings)

def runner_metadata(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    bt_mod = _m["block_table"]
    max_blocks = [-(-MAX_MODEL_LEN // bs) for bs in BLOCK_SIZES]
    tables = bt_mod.BlockTables(BLOCK_SIZES, MAX_NUM_REQS, MAX_BATCHED, max_blocks, torch.device(batch.device),
                                sliding_window_reach=SLIDING_WINDOW_REACH)
    INDIRECT["_apply_write_kernel"] = [t.gpu for t in tables.block_tables]
    INDIRECT["_gather_block_tables_kernel"] = list(tables.input_block_tables)
    idx = batch.idx_mapping()
    next_block = [1] * len(BLOCK_SIZES)
    for r, (c, n) in enumerate(zip(batch.computed, batch.scheduled)):
        ids = []
        for gi, bs in enumerate(BLOCK_SIZES):
            count = -(-(c + n) // bs)
            ids.append(list(range(next_block[gi], next_block[gi] + count)))
            next_block[gi] += count + 7  # other requests' blocks in between
        tables.append_block_ids(int(idx[r]), tuple(ids), overwrite=True)
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
    dev = batch.device
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


# --------------------------------------------------------------------------------------------------
# Sampler (V2): every option on

def sampling(num_tokens: int, device: str, seed: int) -> dict[str, torch.Tensor]:
    state: dict[str, Any] = {}
    out = _site("sampler: logits processors", lambda: _processors(num_tokens, device, seed, state))
    if "logits" not in state:
        return out
    out.update(_site("sampler: top-k/top-p", lambda: _topk_topp(num_tokens, device, seed, state)))
    out.update(_site("sampler: gumbel sample + logprobs", lambda: _sample(num_tokens, device, seed, state)))
    return out


def _processors(num_tokens: int, device: str, seed: int, state: dict) -> dict[str, torch.Tensor]:
    g = _gen(device, seed + 3)
    logits = _randn((num_tokens, VOCAB), torch.float32, g, device) * 4
    idx = torch.tensor([3 + 5 * (i % 8) for i in range(num_tokens)], dtype=torch.int64, device=device)
    n_slots = MAX_NUM_REQS
    temperature = torch.rand(n_slots, generator=g, device=device) + 0.5
    _m["gumbel"].apply_temperature(logits, idx, temperature)
    min_p = torch.rand(n_slots, generator=g, device=device) * 0.1
    _m["min_p"].apply_min_p(logits, idx, min_p)

    prompt_len = torch.full((n_slots,), 40, dtype=torch.int32, device=device)
    prefill_len = torch.full((n_slots,), 40, dtype=torch.int32, device=device)
    total_len = torch.full((n_slots,), 52, dtype=torch.int32, device=device)
    all_token_ids = torch.randint(0, VOCAB, (n_slots, 64), generator=g, device=device, dtype=torch.int32)
    words = (VOCAB + 31) // 32
    prompt_bin_mask = torch.zeros((n_slots, words), dtype=torch.int32, device=device)
    output_bin_counts = torch.zeros((n_slots, VOCAB), dtype=torch.int32, device=device)
    pen = _m["penalties"]
    pen.bincount(idx, all_token_ids, prompt_len, prefill_len, prompt_bin_mask, output_bin_counts, 40)
    local_pos = torch.zeros(num_tokens, dtype=torch.int32, device=device)
    rep = torch.rand(n_slots, generator=g, device=device) + 1.0
    freq = torch.rand(n_slots, generator=g, device=device)
    pres = torch.rand(n_slots, generator=g, device=device)
    pen.apply_penalties(logits, idx, all_token_ids, local_pos, rep, freq, pres, prompt_bin_mask, output_bin_counts)

    # The widths, dtypes and pos vLLM's LogitBiasState holds (logit_bias.py:20-50: int32 restore flags, 1024
    # allowed / bias token ids, 128 stop ids) and the int64 positions of the input batch.
    lb = _m["logit_bias"]
    n_allowed, n_bias, n_stop = lb.MAX_NUM_ALLOWED_TOKEN_IDS, lb.MAX_NUM_LOGIT_BIAS_TOKENS, lb.MAX_NUM_STOP_TOKEN_IDS
    ints = lambda *shape, hi=VOCAB: torch.randint(0, hi, shape, generator=g, device=device, dtype=torch.int32)
    pos = torch.full((num_tokens,), 45, dtype=torch.int64, device=device)
    lb.apply_logit_bias(
        logits, idx, pos, torch.zeros(n_slots, dtype=torch.int32, device=device), ints(n_slots, n_allowed),
        ints(n_slots, hi=8), ints(n_slots, n_bias), torch.randn(n_slots, n_bias, generator=g, device=device),
        torch.full((n_slots,), 50, dtype=torch.int32, device=device), ints(n_slots, hi=3),
        torch.zeros(n_slots, dtype=torch.int32, device=device), ints(n_slots, n_stop))

    max_bad = 4
    bad_ids = ints(n_slots, 32)
    offsets = torch.tensor([0, 2, 3, 6, 8], dtype=torch.int32, device=device).repeat(n_slots, 1)
    input_ids = ints(num_tokens)
    _m["bad_words"].apply_bad_words(logits, idx, bad_ids, offsets, torch.full((n_slots,), max_bad, dtype=torch.int32,
                                                                             device=device),
                                    all_token_ids, prompt_len, total_len, input_ids, local_pos, max_bad)
    state.update(logits=logits, idx=idx, temperature=temperature, pos=pos, g=g)
    return {"logits_processed": logits.clone()}


def _topk_topp(num_tokens: int, device: str, seed: int, state: dict) -> dict[str, torch.Tensor]:
    logits, g = state["logits"], state["g"]
    out = {}
    k = torch.randint(5, 200, (num_tokens,), generator=g, device=device, dtype=torch.int32)
    p = torch.rand(num_tokens, generator=g, device=device) * 0.5 + 0.4
    out["topk_topp"] = _m["topk_topp_triton"].apply_top_k_top_p_triton(logits.clone(), k, p)
    k_none = torch.full((num_tokens,), VOCAB, dtype=torch.int32, device=device)
    out["topk_noop_topp"] = _m["topk_topp_triton"].apply_top_k_top_p_triton(logits.clone(), k_none, p)
    out["topp_only"] = _m["topk_topp_triton"].apply_top_k_top_p_triton(logits.clone(), None, p)  # split top-p
    out["topk_only"] = _m["topk_topp_triton"].apply_top_k_top_p_triton(logits.clone(), k, None)
    return out


def _sample(num_tokens: int, device: str, seed: int, state: dict) -> dict[str, torch.Tensor]:
    logits, idx, temperature, pos, g = (state[k] for k in ("logits", "idx", "temperature", "pos", "g"))
    n_slots = MAX_NUM_REQS
    out = {}
    # The target's sampler, also when it verifies MTP drafts (sample/sampler.py:357: is_drafting=False); only
    # probabilistic draft sampling (draft logits kept, a non-default flag) passes is_drafting=True
    # (spec_decode/speculator.py:473), and with it logits_cache: not a default-deployment call.
    sampled = _m["gumbel"].gumbel_sample(
        logits, idx, temperature, torch.arange(n_slots, dtype=torch.int64, device=device), pos.to(torch.int64),
        apply_temperature=False, is_drafting=False)
    out["sampled"] = sampled
    lp = _m["logprob"]
    token_ids = torch.cat([sampled.view(-1, 1).to(torch.int64),
                           torch.randint(0, VOCAB, (num_tokens, 4), generator=g, device=device)], dim=1)
    out["token_logprobs"] = lp.compute_token_logprobs(logits, token_ids)
    return out


# --------------------------------------------------------------------------------------------------
# The steps

def _model_step(batch: Batch, seed: int) -> dict[str, torch.Tensor]:
    meta = _site("runner block tables", lambda: runner_metadata(batch, seed))
    out = dict(meta)
    out.update(_site("q/kv rmsnorm", lambda: attention_ops(batch, seed, meta)))
    out.update(_site("inverse rope + fp8 quant", lambda: inv_rope(batch, seed)))
    for ratio, head in ((4, HEAD_DIM), (128, HEAD_DIM), (4, 128)):  # 128: the indexer's compressor
        if "slot_mappings" in meta:
            out.update(_site(f"compressor states c{ratio}/{head}",
                             lambda: compressor_state(batch, seed, ratio, head, meta)))
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
    out.update(sampling(batch.num_tokens, device, seed))
    return out


def mixed(device: str, seed: int) -> dict[str, torch.Tensor]:
    return _model_step(Batch([38, 301, 0, 2000], [1, 1, 250, 1], device), seed)


def mtp_draft_and_verify(device: str, seed: int) -> dict[str, torch.Tensor]:
    """MTP 1: every decode request verifies 1 draft token (2 query tokens), then samples."""
    batch = Batch([39, 302, 1101, 46], [2, 2, 2, 2], device)
    out = _model_step(batch, seed)
    out.update(indexer_decode_pack(batch, seed))
    out.update(sampling(batch.num_tokens, device, seed))
    return out


def sampling_all_options(device: str, seed: int) -> dict[str, torch.Tensor]:
    return sampling(40, device, seed)


STEPS = {
    "prefill": prefill,
    "decode": decode,
    "mixed": mixed,
    "mtp_draft_and_verify": mtp_draft_and_verify,
    "sampling_all_options": sampling_all_options,
}
