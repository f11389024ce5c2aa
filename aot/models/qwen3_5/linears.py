"""The block-FP8 linears of a Qwen3.5 / Qwen3-Next checkpoint, per TP rank: (N, K) of each GEMM vLLM runs through
DeepGEMM's fp8_gemm_nt (M >= 32) and FlashInfer's fp8_blockscale_gemm_90 (M < 32), as for DeepSeek-V4.

Read from vLLM 0.33.0: the GDN in_proj_qkvz (MergedColumnParallelLinear of [key, key, value, value],
gdn/qwen_gdn_linear_attn.py:803-827) and out_proj (RowParallelLinear, :675); the full-attention qkv_proj
(QKVParallelLinear with the query heads doubled by the output gate, models/qwen3_next.py:317-325) and o_proj
(:327); the shared expert's gate_up / down (Qwen3NextMLP, :211) or, for a dense checkpoint, the MLP's. Which of
them the checkpoint quantizes is its quantization config's choice; every one is listed, so a linear it leaves in
BF16 costs only unused entries. Left out: in_proj_ba (N = 2 * value heads, not a block multiple), the router and
shared-expert gates (N = experts, 1), lm_head and the MTP layer's fc (left in BF16 by Qwen's FP8 checkpoints:
not verified here).
"""

from __future__ import annotations

from nojit.aot.deployment import Deployment
from nojit.aot.models.qwen3_5.config import text_config
from nojit.aot.models.qwen3_5.moe import block_fp8
from nojit.aot.runtimes.deepgemm.shapes import GemmShape

GDN = "model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py"
ATTN = "model_executor/models/qwen3_next.py"


def fp8_linears(d: Deployment) -> list[GemmShape]:
    if block_fp8(d) is None:
        return []
    c, tp = text_config(d.hf_config), d.tensor_parallel_size
    hidden, heads, kv_heads = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c["num_key_value_heads"])
    head_dim = int(c.get("head_dim") or hidden // heads)
    key_dim = int(c["linear_num_key_heads"]) * int(c["linear_key_head_dim"])
    value_dim = int(c["linear_num_value_heads"]) * int(c["linear_value_head_dim"])
    gate = 2 if c.get("attn_output_gate", True) else 1
    kv_rank = max(1, kv_heads // tp)  # QKVParallelLinear replicates KV heads when tp > kv heads
    mlp = int(c["shared_expert_intermediate_size"]) if "num_experts" in c else int(c["intermediate_size"])
    return [
        GemmShape(f"linear_attn.in_proj_qkvz {GDN}:816", (2 * key_dim + 2 * value_dim) // tp, hidden),
        GemmShape(f"linear_attn.out_proj {GDN}:675", hidden, value_dim // tp),
        GemmShape(f"self_attn.qkv_proj {ATTN}:317", (gate * heads // tp + 2 * kv_rank) * head_dim, hidden),
        GemmShape(f"self_attn.o_proj {ATTN}:327", hidden, heads * head_dim // tp),
        GemmShape(f"mlp gate_up_proj {ATTN}:211", 2 * mlp // tp, hidden),
        GemmShape(f"mlp down_proj {ATTN}:211", hidden, mlp // tp),
    ]
