"""The GDN prefill's call shapes and inputs, the same for both backends' rows (gdn_prefill.py: FlashInfer's,
fla_prefill.py: FLA's Triton chunk path): vLLM feeds both from `fused_post_conv_prep` in `_forward_core`.

Each call is plain JSON (the layer facts it needs with it), so a build worker can make it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.models.qwen3_5.call_sites import token_counts
from nojit.aot.models.qwen3_5.config import gdn_facts

# one sequence, a few, and (below) the most a chunk of that size holds; FlashInfer's CP choice turns on the
# sequence count (H200, 32 heads: CP for 1 and 2)
SEQS = (1, 2, 3)


def layer(d: Deployment) -> dict[str, Any]:
    """The GDN layer facts a prefill call carries: head counts and dims, the model and state dtypes."""
    f = gdn_facts(d)
    return {"h": f.h, "hv": f.hv, "k": f.k, "v": f.v, "dtype": d.dtype,
            "state_dtype": str(f.state_dtype).removeprefix("torch.")}


def chunk_shapes(d: Deployment) -> Iterator[tuple[int, int]]:
    """(tokens, sequences) of every prefill chunk class: the room's token counts, 1-3 sequences and the most the
    chunk holds."""
    for t in token_counts(d):
        for n in sorted({s for s in (*SEQS, min(t, d.max_num_seqs)) if s <= t}):
            yield t, n


def tensors(call: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    """q, k, v ([1, T, heads, dim] in the model dtype), g and beta ([1, T, hv] fp32) as `fused_post_conv_prep`
    returns them unsqueezed, and the int32 query start locations of `seqs` even sequences."""
    t, n, h, hv, k, v = (call[x] for x in ("tokens", "seqs", "h", "hv", "k", "v"))
    dtype = getattr(torch, call["dtype"])
    q, key = (torch.empty((t, h, k), dtype=dtype, device=device).unsqueeze(0) for _ in range(2))
    value = torch.empty((t, hv, v), dtype=dtype, device=device).unsqueeze(0)
    g, beta = (torch.empty((t, hv), dtype=torch.float32, device=device).unsqueeze(0) for _ in range(2))
    cu_seqlens = torch.tensor([t * i // n for i in range(n + 1)], dtype=torch.int32, device=device)
    return {"q": q, "k": key, "v": value, "g": g, "beta": beta, "cu_seqlens": cu_seqlens}
