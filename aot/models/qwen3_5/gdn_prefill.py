"""The GDN layers' FlashInfer prefill (the sm_90 default, `ChunkGatedDeltaRule.forward_cuda`), through vLLM's
own `fi_chunk_gated_delta_rule`, per prefill chunk shape.

vLLM 0.33.0 reaches FlashInfer's CuTeDSL kernels from two call sites of `_forward_core`
(gdn/qwen_gdn_linear_attn.py): the prefill without checkpoints (:1823, through `forward_cuda`) and, in
prefix caching's "align" mode (which the room's block size assumes, config.py), the prefill that emits
mid-prefill states (:1846, `state_checkpoints` [n, hv, v, k] fp32 from `_checkpoint_buffer_spec` :763,
`checkpoint_cu_starts` int64 from the metadata builder's plan, every_n_tokens a multiple of the block).
Its startup warmup (`_warmup_flashinfer_prefill_variants`, :1449) asks for the same variants. q, k, v,
g and beta are `fused_post_conv_prep`'s outputs ([T, heads, dim] in the model dtype, g and beta fp32,
unsqueezed), the initial state is `ssm_state[prefill_state_indices]` (a contiguous copy in the state dtype)
and cu_seqlens the int32 query start locations. FlashInfer then chooses the kernels itself: its CP route
(four kernels) when sequences x value heads are few for the device (should_use_cp_host), else one.

Each call is plain JSON (prefill_inputs.py: the shapes and tensors shared with fla_prefill.py).
"""

from __future__ import annotations

from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.models.qwen3_5.config import gdn_facts, gdn_prefill_backend
from nojit.aot.models.qwen3_5.prefill_inputs import chunk_shapes, layer, tensors
from nojit.aot.vllm_env import import_kernel_module

SITE = "nojit.aot.models.qwen3_5.gdn_prefill:prefill"
GDN = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"


def calls(d: Deployment) -> list[dict[str, Any]]:
    """One call per (tokens, sequences, checkpoints): token counts as the room's other sites, 1-3 sequences
    and the most the chunk holds; checkpoints every block where the chunk spans one. None unless the deployment's
    GDN prefill backend is FlashInfer's (with triton: fla_prefill.py)."""
    if gdn_prefill_backend(d) != "flashinfer":
        return []
    block, facts = gdn_facts(d).block_size, layer(d)
    return [{**facts, "tokens": t, "seqs": n, "checkpoint_every": every}
            for t, n in chunk_shapes(d) for every in ((0, block) if t >= block else (0,))]


def prefill(call: dict[str, Any], device: torch.device) -> None:
    """vLLM's fi_chunk_gated_delta_rule as `_forward_core` calls it (:1823 / :1846)."""
    gdn = import_kernel_module(GDN)
    t, n, hv, k, v = (call[x] for x in ("tokens", "seqs", "hv", "k", "v"))
    x = tensors(call, device)
    initial_state = torch.empty((n, hv, v, k), dtype=getattr(torch, call["state_dtype"]), device=device)
    every = call["checkpoint_every"]
    kwargs: dict[str, Any] = {}
    if every:
        per_seq = [(t * (i + 1) // n - t * i // n) // every for i in range(n)]
        starts = [sum(per_seq[:i]) for i in range(n + 1)]
        kwargs = {"state_checkpoints": torch.empty((max(starts[-1], 1), hv, v, k), dtype=torch.float32,
                                                   device=device)[: starts[-1]],
                  "checkpoint_cu_starts": torch.tensor(starts, dtype=torch.int64, device=device),
                  "checkpoint_every_n_tokens": every}
    gdn.fi_chunk_gated_delta_rule(**x, initial_state=initial_state, output_final_state=True,
                                  use_qk_l2norm_in_kernel=False, **kwargs)
