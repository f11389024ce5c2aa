"""Registered warmup owners of vLLM's model runners (V2 and V1), for any model served through them.

Rows as in a model room's owners: vLLM's own owner, the JITFunction it launches, and the
`register_warmup` arguments of its registration site (vLLM 0.33.0 file:line) as a function
of the deployment and its KV-cache groups. Unregistered runner kernels are derived in derived.py.
"""

from __future__ import annotations

import math
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.models.runner import KVCacheGroup, KVGroups
from nojit.aot.runtimes.triton.rows import TritonOwner
from nojit.aot.runtimes.triton.rows import once as _once

TOPK = "vllm.v1.sample.ops.topk_topp_triton"
V1_RS = "vllm.v1.sample.rejection_sampler"
V1_BT = "vllm.v1.worker.block_table"


# _topk_topp_kernel and _topp_sb_mask_kernel take MASK_VALUE=float("-inf") as a constexpr; keys
# carry it tagged as "-inf" (loader/key_values.tag).
def _masking(d: Deployment) -> list[dict[str, Any]]:
    return [{}]


def _v1_spec(d: Deployment) -> list[dict[str, Any]]:
    return [{}] if d.spec_decode and "v1" in d.model_runners else []


def _v1_block_tables(d: Deployment, groups: tuple[KVCacheGroup, ...]) -> list[dict[str, Any]]:
    """ComputeSlotMappingKernel.register_warmup per V1 BlockTable (v1/worker/block_table.py:105).

    V1 builds one BlockTable per KV cache group: first a placeholder with
    cache_config.block_size (gpu_model_runner.py:704-726, inside the captured __init__),
    then one per group of the final KV cache config (gpu_model_runner.py:6846-6898), with
    the group's block size (the model room's KV-cache groups). Width: cdiv(max_model_len, bs)
    aligned to 128 tokens (block_table.py:29-41, 236-245); DCP 1, interleave 1 (TP only).
    """
    if "v1" not in d.model_runners:
        return []
    sizes = [d.block_size, *(g.block_size for g in groups)]  # the placeholder, then each group
    out = []
    for bs in dict.fromkeys(sizes):
        blocks = -(-d.max_model_len // bs)
        align = 128 // math.gcd(128, bs)
        width = -(-blocks // align) * align
        out.append(dict(kv_cache_block_size=bs, total_cp_world_size=1, total_cp_rank=0,
                        cp_kv_cache_interleave_size=1, block_table_stride=width))
    return out


def runner_owners(kv_groups: KVGroups) -> tuple[TritonOwner, ...]:
    """The runners' registered owners for a model whose deployments have `kv_groups`."""
    return (
        # Top-k/top-p. Registered on V2 CUDA only with spec decode (gpu/model_runner.py:466-479)
        # and on V1 by every TopKTopPSampler (topk_topp_sampler.py:290). Reached on V2 without
        # spec decode too (gpu/sample/sampler.py:340-344, when FlashInfer's fused sampler is not
        # eligible: a greedy or seeded request in the batch), so nojit takes the keys whenever
        # either runner is deployed. Keys from vllm_config (vocab, max_num_seqs*(k+1), SM count).
        TritonOwner(f"{TOPK}:_topk_topp", f"{TOPK}:_topk_topp_kernel", _masking,
                    "v1/sample/ops/topk_topp_sampler.py:32", ("runner", "runner-v2", "runner-v1")),
        TritonOwner(f"{TOPK}:_topp_split_stats", f"{TOPK}:_topp_sb_stats_kernel", _once,
                    "v1/sample/ops/topk_topp_sampler.py:34", ("runner", "runner-v2", "runner-v1")),
        TritonOwner(f"{TOPK}:_topp_split_step", f"{TOPK}:_topp_sb_step_kernel", _once,
                    "v1/sample/ops/topk_topp_sampler.py:35", ("runner", "runner-v2", "runner-v1")),
        TritonOwner(f"{TOPK}:_topp_split_mask", f"{TOPK}:_topp_sb_mask_kernel", _masking,
                    "v1/sample/ops/topk_topp_sampler.py:36", ("runner", "runner-v2", "runner-v1")),
        # V1 runner only (VLLM_USE_V2_MODEL_RUNNER=0).
        TritonOwner(f"{V1_BT}:_COMPUTE_SLOT_MAPPING_KERNEL", f"{V1_BT}:ComputeSlotMappingKernel.kernel",
                    lambda d: _v1_block_tables(d, kv_groups(d)), "v1/worker/block_table.py:105",
                    ("runner", "runner-v1")),
        # V1 RejectionSampler (gpu_model_runner.py:666), standard method: synthetic_mode False,
        # use_fp64_gumbel = model_config.use_fp64_gumbel (default False).
        TritonOwner(f"{V1_RS}:_rejection_greedy_sample", f"{V1_RS}:rejection_greedy_sample_kernel",
                    lambda d: [dict(synthetic_mode=False)] if _v1_spec(d) else [],
                    "v1/sample/rejection_sampler.py:116", ("runner", "runner-v1", "spec-v1")),
        TritonOwner(f"{V1_RS}:_rejection_random_sample", f"{V1_RS}:rejection_random_sample_kernel",
                    lambda d: [dict(synthetic_mode=False)] if _v1_spec(d) else [],
                    "v1/sample/rejection_sampler.py:117", ("runner", "runner-v1", "spec-v1")),
        TritonOwner(f"{V1_RS}:_expand", f"{V1_RS}:expand_kernel", _v1_spec,
                    "v1/sample/rejection_sampler.py:120", ("runner", "runner-v1", "spec-v1")),
        TritonOwner(f"{V1_RS}:_sample_recovered_tokens", f"{V1_RS}:sample_recovered_tokens_kernel",
                    lambda d: [dict(use_fp64_gumbel=False)] if _v1_spec(d) else [],
                    "v1/sample/rejection_sampler.py:121", ("runner", "runner-v1", "spec-v1")),
    )
