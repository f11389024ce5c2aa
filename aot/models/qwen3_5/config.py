"""Facts about a Qwen3.5 / Qwen3-Next deployment's layers that decide kernel keys (vLLM 0.33.0).

Qwen3.5 checkpoints nest the language model under `text_config` (vLLM reads `hf_text_config`,
config/model.py); Qwen3-Next's config is flat. `text_config` returns the dict vLLM's layers read.

The Mamba (gated-delta-net) cache decides strides the GDN kernels specialize on: vLLM sizes one
page per GDN layer (conv state + recurrent state, mamba/mamba_utils.py:272-293 shapes, :98-110
dtypes, the Qwen3.5 `mamba_ssm_dtype` taking over `auto`, models/config.py:953-978), grows the
attention block until an attention page covers it and pads the Mamba page to exactly the
attention page (platforms/interface.py:940-1131). Page sizes come from vLLM's own spec classes
(`MambaSpec`, `FullAttentionSpec`); the alignment rule is restated with its lines.

Which GDN prefill the server runs (`gdn_prefill_backend`: FlashInfer's CuTeDSL kernel or FLA's Triton chunk
kernels) is vLLM's own `_resolve_gdn_prefill_backend` on the deployment's setting, asked here only; it decides
the prefill rows (gdn_prefill.py, fla_prefill.py) and, through the checkpoint alignment, the block size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.models.qwen3_5.fla_host import import_fla
from nojit.aot.models.runner import KVCacheGroup
from nojit.aot.vllm_env import import_kernel_module

# FlashAttention's smallest kernel block on sm_90 (v1/attention/backends/flash_attn.py:357: MultipleOf(16))
FLASH_ATTN_KERNEL_BLOCK = 16
# Prefix caching is on by default for generate models (engine/arg_utils.py:3075, config/model.py:2239), which sets
# mamba_cache_mode "align" (models/config.py:763-779) and, with FlashInfer's GDN prefill (the sm_90 default),
# a 64-token checkpoint alignment (v1/attention/backends/gdn_attn.py:34; gdn/qwen_gdn_linear_attn.py:692-702).
FLASHINFER_GDN_CHECKPOINT_ALIGNMENT = 64
GDN = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
# vLLM's --gdn-prefill-backend choices (engine/arg_utils.py:1948-1952) and additional_config's default
GDN_PREFILL_BACKENDS = ("auto", "flashinfer", "triton", "cutedsl", "aiter_flydsl", "sycl")
DEFAULT_BLOCK_SIZE = 16  # CacheConfig.DEFAULT_BLOCK_SIZE, FlashAttention's preferred size


def text_config(hf: dict[str, Any]) -> dict[str, Any]:
    """The language model's config: `text_config` when the checkpoint nests it (Qwen3.5), else the config itself."""
    inner = hf.get("text_config")
    return inner if isinstance(inner, dict) else hf


@dataclass(frozen=True)
class GdnFacts:
    """One tensor-parallel rank's gated-delta-net layer, as vLLM builds it."""

    h: int  # key heads per rank
    hv: int  # value heads per rank
    k: int  # head_k_dim
    v: int  # head_v_dim
    conv_kernel_size: int
    conv_dtype: torch.dtype
    state_dtype: torch.dtype
    conv_state_len: int  # conv_kernel_size - 1 + num_speculative_tokens
    page_bytes: int  # the padded Mamba page (equals the attention page)
    block_size: int  # the attention block size vLLM aligns to

    @property
    def conv_dim(self) -> int:
        return 2 * self.h * self.k + self.hv * self.v


def _torch_dtype(name: str | None, default: torch.dtype) -> torch.dtype:
    if name in (None, "auto"):
        return default
    return getattr(torch, str(name).removeprefix("torch."))


def gdn_prefill_backend(d: Deployment) -> str:
    """The GDN prefill backend the server runs: vLLM's `_resolve_gdn_prefill_backend` (gdn/qwen_gdn_linear_attn.py:
    148-270) on the deployment's platform with `additional_config = {"gdn_prefill_backend": ...}` as
    `--gdn-prefill-backend` sets it (engine/arg_utils.py:2865); unset is vLLM's "auto" (FlashInfer on sm_90).
    Needs the deployment platform installed (the deployment rules install it)."""
    import_fla(d.platform, check=False)  # the GDN layer's module imports FLA: first with the GPU's answers (fla_host.py)
    additional = {} if d.gdn_prefill_backend is None else {"gdn_prefill_backend": d.gdn_prefill_backend}
    tc = text_config(d.hf_config)
    config = SimpleNamespace(additional_config=additional, model_config=SimpleNamespace(
        dtype=getattr(torch, d.dtype),
        hf_text_config=SimpleNamespace(linear_key_head_dim=tc.get("linear_key_head_dim"),
                                       linear_value_head_dim=tc.get("linear_value_head_dim"))))
    backend = str(import_kernel_module(GDN)._resolve_gdn_prefill_backend(config)[1])
    if backend == "triton":  # FLA's autotuned kernels are planned: their config lists must be the H200's
        import_fla(d.platform)
    return backend


def gdn_facts(d: Deployment) -> GdnFacts:
    tc = text_config(d.hf_config)
    tp = d.tensor_parallel_size
    try:
        nk, nv = int(tc["linear_num_key_heads"]), int(tc["linear_num_value_heads"])
        k, v, width = int(tc["linear_key_head_dim"]), int(tc["linear_value_head_dim"]), int(tc["linear_conv_kernel_dim"])
        kv_heads, head_dim = int(tc["num_key_value_heads"]), int(tc.get("head_dim") or tc["hidden_size"] // tc["num_attention_heads"])
    except KeyError as exc:
        raise BuildError(f"{d.hf_config_source}: the text config has no {exc.args[0]!r}",
                         fix="point [model] hf_config at a Qwen3.5 / Qwen3-Next config.json") from None
    if nk % tp or nv % tp:
        raise BuildError(f"{d.source}: tensor_parallel_size {tp} does not divide the GDN heads ({nk} key, {nv} value)",
                         fix="choose a tensor_parallel_size that divides linear_num_key_heads")
    model_dtype = getattr(torch, d.dtype)
    conv_dtype = model_dtype if d.kv_cache_dtype == "auto" else _torch_dtype(d.kv_cache_dtype, model_dtype)
    state_dtype = _torch_dtype(tc.get("mamba_ssm_dtype"), conv_dtype)
    num_spec = d.num_speculative_tokens if d.spec_decode else 0

    mu = import_kernel_module("vllm.model_executor.layers.mamba.mamba_utils")
    kvi = import_kernel_module("vllm.v1.kv_cache_interface")
    shapes = mu.MambaStateShapeCalculator.gated_delta_net_state_shape(tp, nk, nv, k, v, width, num_spec)
    mamba_page = kvi.MambaSpec(shapes=shapes, dtypes=(conv_dtype, state_dtype), block_size=-1).page_size_bytes
    kv_dtype = model_dtype if d.kv_cache_dtype == "auto" else _torch_dtype(d.kv_cache_dtype, model_dtype)
    attn_1 = kvi.FullAttentionSpec(block_size=1, num_kv_heads=max(1, kv_heads // tp), head_size=head_dim,
                                   dtype=kv_dtype).page_size_bytes
    # platforms/interface.py:1066-1102: kernel alignment max(min kernel block, block size), lcm'd with the
    # checkpoint alignment in "align" mode; the smallest multiple whose page covers the Mamba page. Only
    # FlashInfer's prefill declares a checkpoint alignment (gdn/qwen_gdn_linear_attn.py:691-702); with FLA's
    # (triton) the layers declare none and vLLM lcm's with 1 (mamba/abstract.py:98-113).
    checkpoint = FLASHINFER_GDN_CHECKPOINT_ALIGNMENT if gdn_prefill_backend(d) == "flashinfer" else 1
    align = math.lcm(max(FLASH_ATTN_KERNEL_BLOCK, DEFAULT_BLOCK_SIZE), checkpoint)
    block = align * -(-mamba_page // (align * attn_1))
    block = FLASH_ATTN_KERNEL_BLOCK * -(-block // FLASH_ATTN_KERNEL_BLOCK)
    return GdnFacts(h=nk // tp, hv=nv // tp, k=k, v=v, conv_kernel_size=width, conv_dtype=conv_dtype,
                    state_dtype=state_dtype, conv_state_len=width - 1 + num_spec, page_bytes=block * attn_1,
                    block_size=block)


def kv_cache_groups(d: Deployment) -> tuple[KVCacheGroup, ...]:
    """The KV-cache groups vLLM builds for a hybrid GDN model, as the runners' block tables see them.

    Layers of one spec are grouped in groups of equal size (v1/core/kv_cache_planning.py:416-526: the smallest
    bucket's size, or the largest's when it is under 1.5 times the smallest): the full-attention layers (every
    `full_attention_interval`-th, plus the MTP layers) and the GDN layers, each in ceil(n / group size) groups. Every group has the aligned block size ("align" mode: mamba_block_size =
    block_size, models/config.py:776-777); none is a sliding window.
    """
    tc = text_config(d.hf_config)
    layers = int(tc["num_hidden_layers"])
    interval = int(tc.get("full_attention_interval", 4))
    types = tc.get("layer_types") or ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
                                      for i in range(layers)]
    n_full = sum(t == "full_attention" for t in types)
    if d.spec_decode:
        n_full += int(tc.get("mtp_num_hidden_layers", tc.get("num_nextn_predict_layers", 1)))
    n_gdn = len(types) - sum(t == "full_attention" for t in types)
    group = min(n_full, n_gdn) or max(n_full, n_gdn)
    if max(n_full, n_gdn) < 1.5 * group:
        group = max(n_full, n_gdn)
    bs = gdn_facts(d).block_size
    # MambaSpec.num_speculative_blocks = num_speculative_tokens (mamba/abstract.py:86-90, no ReplaySSM)
    spec_blocks = d.num_speculative_tokens if d.spec_decode else 0
    attention = [KVCacheGroup(bs, False)] * -(-n_full // group)
    return (*attention, *[KVCacheGroup(bs, False, mamba=True, speculative_blocks=spec_blocks)] * -(-n_gdn // group))
