"""The slice of vLLM's VllmConfig that vLLM's warmup-key providers read, built from a deployment.

A real VllmConfig cannot be built on a GPU-less box without the checkpoint (it loads the
model's files and probes the device). The providers only read a handful of fields; this
view holds exactly those, with the HF config being transformers' own DeepseekV4Config.
A provider that reads a field missing here fails the build with an error naming it.
"""

from __future__ import annotations

from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.models.runner.config_view import ConfigView, config_view


def _view(path: str, **fields: Any) -> ConfigView:
    return config_view('nojit/aot/models/deepseek_v4/config_view.py', path, **fields)


def make_vllm_config(d: Deployment) -> ConfigView:
    import torch
    from transformers import DeepseekV4Config

    hf = DeepseekV4Config(**d.hf_config)
    dtype = getattr(torch, d.dtype)
    spec = None
    if d.spec_decode:
        spec = _view(
            "vllm_config.speculative_config",
            method=d.speculative_method,
            num_speculative_tokens=d.num_speculative_tokens,
            enable_adaptive_verification=False,
            use_dspark=lambda: False,
        )
    return _view(
        "vllm_config",
        model_config=_view(
            "vllm_config.model_config",
            hf_config=hf,
            hf_text_config=hf,
            max_model_len=d.max_model_len,
            dtype=dtype,
            architectures=list(d.hf_config.get("architectures") or ["DeepseekV4ForCausalLM"]),
            get_vocab_size=lambda: int(hf.vocab_size),
        ),
        scheduler_config=_view(
            "vllm_config.scheduler_config",
            max_num_batched_tokens=d.max_num_batched_tokens,
            max_num_seqs=d.max_num_seqs,
        ),
        # The DeepSeek-V4 attention layer writes the canonical "fp8_ds_mla" back onto
        # cache_config at construction (models/deepseek_v4/attention.py:116-120), before
        # the registry expands keys; every kv_cache_dtype a deployment accepts maps to it.
        cache_config=_view("vllm_config.cache_config", block_size=d.block_size, cache_dtype="fp8_ds_mla"),
        # indexer_kv_dtype "auto" (the default) resolves to the caller's default, fp8
        # (config/attention.py:198-204; read by dsa_indexer_uses_fp4, indexer.py:60-68).
        attention_config=_view(
            "vllm_config.attention_config",
            indexer_kv_dtype="auto",
            resolve_indexer_kv_dtype=lambda default: default,
        ),
        parallel_config=_view(
            "vllm_config.parallel_config",
            tensor_parallel_size=d.tensor_parallel_size,
            pipeline_parallel_size=1,
            decode_context_parallel_size=1,
            prefill_context_parallel_size=1,
            cp_kv_cache_interleave_size=1,
        ),
        speculative_config=spec,
        num_speculative_tokens=d.num_speculative_tokens,  # VllmConfig property (top-k/top-p warmup batch)
    )
