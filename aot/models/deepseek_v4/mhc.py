"""The mHC numbers of a DeepSeek-V4 config and the warmup registrations vLLM's DeepSeek-V4 model makes.

The TileLang runtime (nojit.aot.runtimes.tilelang.enumeration) replays vLLM's own warmup after
these registrations; what is specific to DeepSeek-V4 (which owners, with which arguments) is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.runtimes.tilelang.enumeration import FUSED, HC_HEAD, POST, PRE_BIG_FUSE, PRENORM_GEMM, Register


@dataclass(frozen=True)
class MhcModelParams:
    """The model numbers vLLM's DeepSeek-V4 layers pass to the mHC registrations.

    ``attn_norm_eps``/``ffn_norm_eps`` are the layers' ``RMSNorm.variance_epsilon``; vLLM builds both
    norms with ``config.rms_norm_eps``, so they default to ``rms_eps``. ``hc_post_alpha`` is
    hard-coded to 2.0 in vLLM's layer.
    """

    hidden_size: int
    hc_mult: int
    rms_eps: float
    hc_eps: float
    sinkhorn_iters: int
    hc_post_alpha: float = 2.0
    attn_norm_eps: float | None = None
    ffn_norm_eps: float | None = None

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> MhcModelParams:
        """Read the fields of transformers' ``DeepseekV4Config`` (a parsed config.json)."""
        try:
            return cls(
                hidden_size=int(config["hidden_size"]),
                hc_mult=int(config["hc_mult"]),
                rms_eps=float(config["rms_norm_eps"]),
                hc_eps=float(config["hc_eps"]),
                sinkhorn_iters=int(config["hc_sinkhorn_iters"]),
            )
        except KeyError as exc:
            raise BuildError(f"model config lacks {exc.args[0]!r} needed by the mHC kernels") from exc

    @property
    def attn_eps(self) -> float:
        return self.rms_eps if self.attn_norm_eps is None else self.attn_norm_eps

    @property
    def ffn_eps(self) -> float:
        return self.rms_eps if self.ffn_norm_eps is None else self.ffn_norm_eps


def register_like_deepseek_v4(
    tk: Any, vllm_config: Any, model: MhcModelParams, deep_gemm: bool, pp_first_rank: bool = True,
    pp_last_rank: bool = True,
) -> None:
    """The calls of vllm/models/deepseek_v4/nvidia/model.py (decoder layer and model ``__init__``).

    Every decoder layer registers the same arguments except ``include_broadcast_splits``, true only
    for layer 0 on the first PP rank; the registry deduplicates equal registrations, so two layers
    (0 and any other) reproduce all of them. The MTP block is another decoder layer (no broadcast).
    """
    for layer_index in (0, 1):
        getattr(tk, PRE_BIG_FUSE).register_warmup(
            vllm_config,
            hidden_size=model.hidden_size,
            hc_mult=model.hc_mult,
            use_norm_weight=True,
            include_pre_gemm_splits=deep_gemm,
            include_broadcast_splits=pp_first_rank and layer_index == 0,
            rms_eps=model.rms_eps,
            hc_pre_eps=model.hc_eps,
            hc_sinkhorn_eps=model.hc_eps,
            hc_post_mult_value=model.hc_post_alpha,
            sinkhorn_repeat=model.sinkhorn_iters,
            norm_eps=(model.attn_eps, model.ffn_eps),
            broadcast_norm_eps=model.attn_eps,
        )
        if not deep_gemm:
            getattr(tk, PRENORM_GEMM).register_warmup(
                vllm_config,
                hidden_size=model.hidden_size,
                hc_mult=model.hc_mult,
                n_out=model.hc_mult * (2 + model.hc_mult),
            )
        getattr(tk, POST).register_warmup(hidden_size=model.hidden_size, hc_mult=model.hc_mult)
        getattr(tk, FUSED).register_warmup(vllm_config, hidden_size=model.hidden_size, hc_mult=model.hc_mult)
    if pp_last_rank:
        getattr(tk, HC_HEAD).register_warmup(
            hidden_size=model.hidden_size, hc_mult=model.hc_mult, rms_eps=model.rms_eps, hc_eps=model.hc_eps
        )


def registrations(d: Deployment) -> Register:
    """The registrations of deployment `d` (one PP rank that is both first and last)."""
    model = MhcModelParams.from_hf_config(d.hf_config)
    deep_gemm = d.platform.deep_gemm
    return lambda tk, vllm_config: register_like_deepseek_v4(tk, vllm_config, model, deep_gemm)
