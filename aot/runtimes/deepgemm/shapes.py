"""The shapes of DeepSeek-V4-Flash that reach DeepGEMM, per TP rank: the block-FP8 GEMMs (N, K), the mHC
pre-norm GEMM, and the sparse-attention indexer's MQA logits (N = index heads, K = index head dim).

Read from vLLM 0.33.0 (paths under vllm/models/deepseek_v4/): each linear's (input, output) sizes
and its parallel style; the sizes come from the deployment's HF config, the split from its TP size
(column-parallel splits N, each merged output separately; row-parallel splits K; replicated splits
nothing). Which linears are block-FP8 is decided by the checkpoint's quantization config; every
linear below is listed, so a shape the checkpoint leaves in BF16 costs only unused entries.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError


@dataclass(frozen=True)
class GemmShape:
    name: str      # the vLLM module it serves, with the line it was read from
    n: int
    k: int
    groups: int = 1            # fp8_einsum: the batch of grouped GEMMs (h in "bhr,hdr->bhd")
    splits: str | None = None  # tf32_hc_prenorm_gemm: the vLLM function that picks num_splits from M
    m_limit: int | None = None  # the largest M the op sees when it is not max_num_batched_tokens
    indexer: dict[str, int] | None = None  # MQA logits ops: next_n, block_kv, max_context_len, num_slots


def fp8_gemm_nt_shapes(d: Deployment) -> list[GemmShape]:
    c, tp = d.hf_config, d.tensor_parallel_size
    hidden, q_lora, head_dim = c["hidden_size"], c["q_lora_rank"], c["head_dim"]
    heads, groups, o_lora = c["num_attention_heads"], c["o_groups"], c["o_lora_rank"]
    shared_inter = c["moe_intermediate_size"] * c["n_shared_experts"]
    shapes = [
        # attention.py:252 MergedColumnParallelLinear(hidden, [q_lora_rank, head_dim])
        GemmShape("attention.fused_wqa_wkv", (q_lora + head_dim) // tp, hidden),
        # attention.py:261 ColumnParallelLinear(q_lora_rank, n_heads * head_dim)
        GemmShape("attention.wq_b", heads * head_dim // tp, q_lora),
        # attention.py:281 RowParallelLinear(n_groups * o_lora_rank, hidden)
        GemmShape("attention.wo_b", hidden, groups * o_lora // tp),
        # attention.py:990 indexer ReplicatedLinear(q_lora_rank, index_head_dim * index_n_heads)
        GemmShape("indexer.wq_b", c["index_head_dim"] * c["index_n_heads"], q_lora),
        # nvidia/model.py:153 shared expert MergedColumnParallelLinear(hidden, [inter] * 2)
        GemmShape("shared_expert.gate_up_proj", 2 * shared_inter // tp, hidden),
        # nvidia/model.py:161 shared expert RowParallelLinear(inter, hidden)
        GemmShape("shared_expert.down_proj", hidden, shared_inter // tp),
    ]
    if d.speculative_method == "mtp":
        # nvidia/mtp.py:103, 111 ReplicatedLinear(hidden, hidden): e_proj, h_proj
        shapes.append(GemmShape("mtp.e_proj/h_proj", hidden, hidden))
    return shapes


def fp8_einsum_shapes(d: Deployment) -> list[GemmShape]:
    c, tp = d.hf_config, d.tensor_parallel_size
    groups = c["o_groups"]
    # attention.py:271 wo_a ColumnParallelLinear(n_heads * head_dim // n_groups, n_groups * o_lora_rank), a bmm over
    # the local groups; nvidia/ops/o_proj.py:89 fp8_einsum("bhr,hdr->bhd") with recipe (1, 128, 128) on sm90
    return [GemmShape("attention.wo_a (o_proj fp8_einsum)", c["o_lora_rank"],
                      c["num_attention_heads"] * c["head_dim"] // groups, groups=groups // tp)]


def tf32_hc_prenorm_gemm_shapes(d: Deployment) -> list[GemmShape]:
    """model_executor/kernels/mhc/tilelang.py's DeepGEMM calls: N = hc_mult * (hc_mult + 2) mixes over
    K = hc_mult * hidden (the residual streams) or K = hidden (the broadcast pre of the first layer), with
    num_splits from compute_num_split (mhc_pre, fused post-pre, broadcast) or its bucketed form
    compute_mhc_pre_num_splits (the delayed variants)."""
    c = d.hf_config
    hc, hidden = c["hc_mult"], c["hidden_size"]
    mix = hc * (hc + 2)
    return [
        GemmShape("mhc.pre (tilelang.py:611/940 mhc_pre, fused_post_pre)", mix, hc * hidden, splits="compute_num_split"),
        GemmShape("mhc.pre_delayed (tilelang.py:160/410 the delayed variants)", mix, hc * hidden,
                  splits="compute_mhc_pre_num_splits"),
        GemmShape("mhc.pre_broadcast (tilelang.py:745)", mix, hidden, splits="compute_num_split"),
    ]


@contextlib.contextmanager
def _capability_family(d: Deployment) -> Iterator[None]:
    """vLLM's current_platform answers is_device_capability_family for the deployment's GPU meanwhile."""
    from vllm.platforms import current_platform

    major = d.platform.capability[0]
    current_platform.is_device_capability_family = lambda capability, device_id=0: capability // 10 == major
    try:
        yield
    finally:
        del current_platform.is_device_capability_family


def indexer_decode_next_ns(d: Deployment) -> list[int]:
    """The Q rows per request the paged logits kernel gets (next_n = max_decode_len of a step): 1..1 +
    num_speculative_tokens where vLLM passes them natively (v1/attention/backends/mla/indexer.py:1631-1641
    use_native, with vLLM's own native_next_n_supported for the deployment's capability), else flattened
    to 1 (indexer.py:1178-1250)."""
    from vllm.utils.deep_gemm import native_next_n_supported

    with _capability_family(d):
        return sorted({n if native_next_n_supported(n) else 1 for n in range(1, d.num_speculative_tokens + 2)})


def _schedule_slots(d: Deployment, next_n: int) -> int:
    """vLLM's get_paged_mqa_logits_metadata passes DeepGEMM this many scheduler slots, not the SM count."""
    from vllm.utils.deep_gemm import _paged_mqa_logits_schedule_slots

    with _capability_family(d):
        return _paged_mqa_logits_schedule_slots(d.platform.sm_count, next_n)


def indexer_shapes(d: Deployment) -> dict[str, list[GemmShape]]:
    """The sparse-attention indexer's DeepGEMM calls (model_executor/layers/sparse_attn_indexer.py, FP8 K cache
    on sm_90: dsa_indexer_uses_fp4 is false off sm_10x), replicated on every rank. Read from vLLM 0.33.0:
    models/deepseek_v4/attention.py:962-1058 (index_n_heads x index_head_dim, K cache compressed by the CSA
    ratio, max_model_len // ratio), v1/attention/backends/mla/indexer.py (block_kv = the cache's states per
    block, block_size // ratio; the metadata's SM count is the device's; decode batches up to max_num_seqs).
    M is the Q rows of a prefill chunk (fp8_fp4_mqa_logits, up to max_num_batched_tokens; the worker gives it
    M rows of K) or the decode batch (the paged logits and their schedule metadata, up to max_num_seqs)."""
    c = d.hf_config
    ratio = c["compress_rates"]["compressed_sparse_attention"]
    heads, head_dim = c["index_n_heads"], c["index_head_dim"]
    block_kv = d.block_size // ratio
    max_context = d.max_model_len // ratio
    prefill = GemmShape("indexer.prefill (sparse_attn_indexer.py:728)", heads, head_dim, indexer={})
    paged, metadata = [], []
    for next_n in indexer_decode_next_ns(d):
        slots = _schedule_slots(d, next_n)
        paged.append(GemmShape(f"indexer.decode next_n={next_n} (sparse_attn_indexer.py:880)", heads, head_dim,
                               m_limit=d.max_num_seqs, indexer={"next_n": next_n, "block_kv": block_kv,
                                                                "max_context_len": max_context, "num_slots": slots}))
        # the schedule metadata sees no heads: its N is next_n and its K the block size in states
        metadata.append(GemmShape(f"indexer.schedule next_n={next_n} (indexer.py:1747)", next_n, block_kv,
                                  m_limit=d.max_num_seqs, indexer={"next_n": next_n, "block_kv": block_kv,
                                                                   "num_slots": slots, "heads": heads,
                                                                   "head_dim": head_dim}))
    return {"fp8_fp4_mqa_logits": [prefill], "fp8_fp4_paged_mqa_logits": paged,
            "get_paged_mqa_logits_metadata": metadata}


def deepgemm_shapes(d: Deployment) -> dict[str, list[GemmShape]]:
    """Per vLLM DeepGEMM entry point, the shapes of this model it enumerates (DeepGemmTables.shapes)."""
    return {"fp8_gemm_nt": fp8_gemm_nt_shapes(d), "fp8_einsum": fp8_einsum_shapes(d),
            "tf32_hc_prenorm_gemm": tf32_hc_prenorm_gemm_shapes(d), **indexer_shapes(d)}


def shape_ms(shape: GemmShape, ms: list[int]) -> list[int]:
    """The M of `ms` this shape's op can see (its own limit, e.g. the decode batch, else all)."""
    return [m for m in ms if shape.m_limit is None or m <= shape.m_limit]


def op_row(op: str, shape: GemmShape, ms: list[int], sm_count: int) -> dict[str, Any]:
    """One row of the enumeration worker's spec; the mHC split count per M from vLLM's own functions,
    their device query answered with the deployment's SM count for the time of the call."""
    ms = shape_ms(shape, ms)
    row: dict[str, Any] = {"op": op, "name": shape.name, "n": shape.n, "k": shape.k, "ms": ms, "groups": shape.groups}
    if shape.indexer is not None:
        row.update(shape.indexer)
    if shape.splits is not None:
        import torch
        from vllm.model_executor.kernels.mhc import tilelang_kernels, warmup
        from vllm.utils.math_utils import cdiv

        rules = {"compute_num_split": lambda m: tilelang_kernels.compute_num_split(64, shape.k, cdiv(m, 64)),
                 "compute_mhc_pre_num_splits": lambda m: warmup.compute_mhc_pre_num_splits(shape.k, m)}
        if shape.splits not in rules:
            raise BuildError(f"unknown mHC split rule {shape.splits!r}", fix="a nojit bug: see shapes.py")
        saved = torch.cuda.get_device_properties
        torch.cuda.get_device_properties = lambda device=None: SimpleNamespace(multi_processor_count=sm_count)
        try:
            row["splits"] = [rules[shape.splits](m) for m in ms]
        finally:
            torch.cuda.get_device_properties = saved
    return row
