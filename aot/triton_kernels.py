"""Which Triton kernels a DeepSeek-V4 deployment reaches, and how vLLM declares their keys.

Each row names vLLM's own warmup owner (a VllmTritonJitKernel or a
triton_kernel_dispatcher_with_warmup object), the JITFunction it launches, and the
arguments vLLM's model code passes to `register_warmup` (file:line in vLLM 0.33.0), as a
function of the deployment. The keys then come from the owner's `get_warmup_keys`, run by
vLLM itself. Rows are tagged with the group they belong to, so a build can select them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nojit.aot.deployment import Deployment

Registrations = Callable[[Deployment], list[dict[str, Any]]]


@dataclass(frozen=True)
class TritonOwner:
    owner: str  # "module:attribute" of vLLM's warmup owner object
    kernel: str  # "module:qualname" of the JITFunction it launches
    registrations: Registrations  # register_warmup kwargs per call site; [] = not reached
    site: str  # where vLLM registers it
    groups: tuple[str, ...] = ("dsv4",)


def _once(d: Deployment) -> list[dict[str, Any]]:
    return [{}]


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

ALL_OWNERS: tuple[TritonOwner, ...] = REPORT_KERNELS


def select_owners(groups: set[str] | None) -> list[TritonOwner]:
    """Owners in any of `groups` (all when None)."""
    return [o for o in ALL_OWNERS if groups is None or groups & set(o.groups)]
