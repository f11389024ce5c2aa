"""What a model tells the Humming runtime: its MoE expert layers that vLLM runs with Humming."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from nojit.aot.deployment import Deployment


@dataclass(frozen=True)
class MoeExperts:
    """One kind of routed-expert layer, before tensor parallelism."""

    hidden: int
    intermediate: int
    experts: int
    top_k: int
    weight_quant_method: str  # the quant_config vLLM converts the weights with ({"quant_method": ...})
    activation_key: str  # the QuantKey name vLLM's MoE method passes (vllm ... quant_utils), e.g. kMxfp8Dynamic
    activation: str  # MoEActivation member name
    clamp_limit: float | None  # swiglu_limit


@dataclass(frozen=True)
class HummingTables:
    experts: Callable[[Deployment], list[MoeExperts]]
