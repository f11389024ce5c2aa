"""The slice of vLLM's VllmConfig the runners' warmup-key providers read, for a Qwen3.5 / Qwen3-Next deployment.

As for DeepSeek-V4 (a real VllmConfig needs the checkpoint and the device): only the fields the providers
read, the text config as vLLM's `hf_text_config`. A provider reading a field missing here fails the build
naming it.
"""

from __future__ import annotations

from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.models.runner.config_view import ConfigView, config_view
from nojit.aot.models.qwen3_5.config import text_config


def _view(path: str, **fields: Any) -> ConfigView:
    return config_view('nojit/aot/models/qwen3_5/config_view.py', path, **fields)


def make_vllm_config(d: Deployment) -> ConfigView:
    tc = text_config(d.hf_config)
    hf = _view("vllm_config.model_config.hf_config", **{k: v for k, v in d.hf_config.items() if k != "text_config"})
    text = _view("vllm_config.model_config.hf_text_config", **tc)
    spec = None
    if d.spec_decode:
        spec = _view("vllm_config.speculative_config", method=d.speculative_method,
                     num_speculative_tokens=d.num_speculative_tokens, enable_adaptive_verification=False,
                     use_dspark=lambda: False)
    return _view(
        "vllm_config",
        model_config=_view("vllm_config.model_config", hf_config=hf, hf_text_config=text,
                           max_model_len=d.max_model_len, dtype=getattr(torch, d.dtype),
                           architectures=list(d.hf_config.get("architectures") or []),
                           get_vocab_size=lambda: int(tc["vocab_size"])),
        scheduler_config=_view("vllm_config.scheduler_config", max_num_batched_tokens=d.max_num_batched_tokens,
                               max_num_seqs=d.max_num_seqs),
        cache_config=_view("vllm_config.cache_config", block_size=d.block_size, cache_dtype=d.kv_cache_dtype),
        parallel_config=_view("vllm_config.parallel_config", tensor_parallel_size=d.tensor_parallel_size,
                              pipeline_parallel_size=1, decode_context_parallel_size=1,
                              prefill_context_parallel_size=1, cp_kv_cache_interleave_size=1),
        speculative_config=spec,
        num_speculative_tokens=d.num_speculative_tokens,
    )
