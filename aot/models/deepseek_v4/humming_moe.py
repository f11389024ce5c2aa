"""DeepSeek-V4's routed experts as Humming sees them (vLLM 0.33.0, sm_90, no expert parallelism).

MXFP4 checkpoints (expert_dtype "fp4"): DeepseekV4FP8Config.get_quant_method returns
Mxfp4MoEMethod(activation_key=kMxfp8Dynamic) (models/deepseek_v4/quant_config.py), whose weights are converted
for Humming with quant_config {"quant_method": "mxfp4"} (fused_moe/oracle/mxfp4.py:1625-1634). FusedMoE's
activation is SiLU, clamped by the config's swiglu_limit (models/deepseek_v4/nvidia/model.py:442).
"""

from __future__ import annotations

from nojit.aot.deployment import Deployment
from nojit.aot.runtimes.humming import MoeExperts


def routed_experts(d: Deployment) -> list[MoeExperts]:
    cfg = d.hf_config
    if cfg.get("expert_dtype", "fp4") != "fp4":
        return []  # FP8 experts (Flash-Base) go to Fp8MoEMethod, not Humming's MXFP4 path
    limit = cfg.get("swiglu_limit")
    return [MoeExperts(hidden=cfg["hidden_size"], intermediate=cfg["moe_intermediate_size"],
                       experts=cfg["n_routed_experts"], top_k=cfg["num_experts_per_tok"],
                       weight_quant_method="mxfp4", activation_key="kMxfp8Dynamic", activation="SILU",
                       clamp_limit=None if limit is None else float(limit))]
