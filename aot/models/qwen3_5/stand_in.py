"""A GDN layer and a model runner as vLLM's launch code sees them, with torch.empty CPU tensors.

The layer carries what `qwen_triton_warmup._qwen_gdn_warmup_config` reads (head counts, TP size, the
bound cache, norm, A_log, dt_bias) and vLLM's own methods the call sites use (`rearrange_mixed_qkv`,
`_rms_norm_gated_cuda`), bound to it. The cache is laid out as vLLM's runner lays out a Mamba group:
one padded page per block (the attention page, config.gdn_facts), the conv state first and the
recurrent state after it, each viewed with the page as its block stride (v1/core/kv_cache_planning.py:
706-735 for a layer-outermost layout). The layout is LBNHC: FlashAttention declares no layouts
(v1/attention/backend.py:372), so vLLM takes its default preference, LBNHC first
(v1/attention/backends/utils.py:227-235); the GDN and attention specs' mixed shapes keep only block-compact
layouts (:332-342), which LBNHC is (v1/kv_cache_layout.py:50-53). SD conv layout (mamba/mamba_utils.py:28-45).
"""

from __future__ import annotations

import types
from types import SimpleNamespace

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.models.qwen3_5.config import GdnFacts as GDN
from nojit.aot.models.qwen3_5.config import gdn_facts, text_config
from nojit.aot.vllm_env import import_kernel_module

NUM_BLOCKS = 4  # any count: no key depends on it
GDN_MODULE = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"


def gdn_cache(f: GDN, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(conv cache [blocks, state_len, conv_dim], recurrent state [blocks, hv, v, k]) as the runner views them."""
    raw = torch.empty((NUM_BLOCKS * f.page_bytes,), dtype=torch.uint8, device=device)
    csize, ssize = f.conv_dtype.itemsize, f.state_dtype.itemsize
    conv = raw.view(f.conv_dtype).as_strided((NUM_BLOCKS, f.conv_state_len, f.conv_dim),
                                             (f.page_bytes // csize, f.conv_dim, 1), 0)
    conv_bytes = f.conv_state_len * f.conv_dim * csize
    ssm = raw.view(f.state_dtype).as_strided((NUM_BLOCKS, f.hv, f.v, f.k),
                                             (f.page_bytes // ssize, f.v * f.k, f.k, 1), conv_bytes // ssize)
    return conv, ssm


def gdn_layer(d: Deployment, device: torch.device) -> SimpleNamespace:
    f = gdn_facts(d)
    tc = text_config(d.hf_config)
    tp = d.tensor_parallel_size
    dtype = getattr(torch, d.dtype)
    conv, ssm = gdn_cache(f, device)
    activation = tc.get("output_gate_type", "silu")
    layer = SimpleNamespace(
        facts=f, dtype=dtype, tp_size=tp,
        num_k_heads=f.h * tp, num_v_heads=f.hv * tp, head_k_dim=f.k, head_v_dim=f.v,
        key_dim=f.h * tp * f.k, value_dim=f.hv * tp * f.v, conv_kernel_size=f.conv_kernel_size,
        kv_cache=[conv, ssm], conv_state=conv.transpose(-1, -2), ssm_state=ssm,
        # conv1d.weight [conv_dim, 1, width] viewed [conv_dim, width] (:1624); A_log fp32, dt_bias and the
        # norm weight in the model dtype (:646-672, created under vLLM's default dtype)
        conv_weights=torch.empty((f.conv_dim, 1, f.conv_kernel_size), dtype=dtype, device=device).view(
            f.conv_dim, f.conv_kernel_size),
        A_log=torch.empty((f.hv,), dtype=torch.float32, device=device),
        dt_bias=torch.empty((f.hv,), dtype=dtype, device=device),
        norm=SimpleNamespace(weight=torch.empty((f.v,), dtype=dtype, device=device), bias=None,
                             eps=float(tc.get("rms_norm_eps", 1e-6)), group_size=None, norm_before_gate=True,
                             activation="silu" if activation == "swish" else activation),
        enable_fused_gdn_spec_decode=d.spec_decode,
    )
    cls = import_kernel_module(GDN_MODULE).QwenGatedDeltaNetAttention
    layer.rearrange_mixed_qkv = types.MethodType(cls.rearrange_mixed_qkv, layer)
    layer.rms_norm_gated = types.MethodType(cls._rms_norm_gated_cuda, layer)
    return layer


def runner(d: Deployment, device: torch.device) -> tuple[SimpleNamespace, SimpleNamespace]:
    """(model runner, model config) with what qwen_triton_warmup reads (warmup/qwen_triton_warmup.py:382-420)."""
    tc = text_config(d.hf_config)
    spec = SimpleNamespace(num_speculative_tokens=d.num_speculative_tokens) if d.spec_decode else None
    r = SimpleNamespace(
        device=device, max_num_tokens=d.max_num_batched_tokens, max_num_reqs=d.max_num_seqs,
        is_pooling_model=False, speculative_config=spec,
        compilation_config=SimpleNamespace(static_forward_context={"model.layers.0.linear_attn": gdn_layer(d, device)}),
    )
    model_config = SimpleNamespace(hf_text_config=SimpleNamespace(model_type=tc.get("model_type", "")),
                                   hf_config=SimpleNamespace(model_type=d.hf_config.get("model_type", "")),
                                   dtype=getattr(torch, d.dtype))
    return r, model_config


def qwen_warmup(d: Deployment, device: torch.device) -> None:
    """vLLM's own `qwen_triton_warmup` (kernel_warmup.py:197), its real launches, on the stand-in runner."""
    w = import_kernel_module("vllm.model_executor.warmup.qwen_triton_warmup")
    r, model_config = runner(d, device)
    w.qwen_triton_warmup(r, model_config)
