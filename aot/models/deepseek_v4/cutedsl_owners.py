"""Which CuTeDSL kernels a DeepSeek-V4 deployment registers in vLLM's JIT warmup registry (vLLM 0.33.0).

Each row names vLLM's owner object and the arguments vLLM's model code passes to its
`register_warmup` (file:line), as a function of the deployment; the keys come from the owner's
own `get_warmup_keys`. vLLM registers these only on CUDA with cutlass importable (`d.cutedsl`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.models.deepseek_v4.config import indexer_kv_block_stride, layer_compress_ratios
from nojit.aot.models.deepseek_v4.config_view import make_vllm_config
from nojit.aot.runtimes.cutedsl import CuteOwner, CuteTables

OPS = "vllm.models.deepseek_v4.nvidia.ops"
COMPRESS = f"{OPS}.sparse_attn_compress_cutedsl"


def _ratios(d: Deployment) -> set[int]:
    return set(layer_compress_ratios(d))


def _once_if(cond: Any) -> Any:
    return lambda d: [{}] if cond(d) else []


def _c128_prefix(d: Deployment) -> str:
    """The first C128 attention layer: vLLM registers the store kernel once per such layer, with its prefix."""
    return f"layers.{layer_compress_ratios(d).index(128)}.attn"


def _indexer_q(fp4: bool) -> Any:
    def registrations(d: Deployment) -> list[dict[str, Any]]:
        from vllm.v1.attention.backends.mla.indexer import dsa_indexer_uses_fp4

        return [{}] if 4 in _ratios(d) and dsa_indexer_uses_fp4(make_vllm_config(d)) == fp4 else []

    return registrations


CUTEDSL_OWNERS: tuple[CuteOwner, ...] = (
    # compressor.py:321-346: head-512 compressors on CUDA. The model's cache_dtype is always "fp8_ds_mla"
    # (config_view.py), so store_full_kv is false: C4 layers register the C4 kernel, C128 layers the
    # C128 block-8 kernel and the norm-rope-store kernel with their own prefix.
    CuteOwner(f"{COMPRESS}:_SPARSE_ATTN_COMPRESS_NORM_ROPE_STORE_C4_KERNEL", _once_if(lambda d: 4 in _ratios(d)),
              "models/deepseek_v4/compressor.py:336 (C4 layers, head 512, fp8_ds_mla)"),
    CuteOwner(f"{COMPRESS}:_SPARSE_ATTN_COMPRESS_C128_BLOCK8_KERNEL", _once_if(lambda d: 128 in _ratios(d)),
              "models/deepseek_v4/compressor.py:338 (C128 layers, head 512)"),
    CuteOwner(f"{COMPRESS}:_SPARSE_ATTN_NORM_ROPE_STORE_KERNEL",
              lambda d: [dict(k_cache_prefix=_c128_prefix(d), compress_ratio=128)] if 128 in _ratios(d) else [],
              "models/deepseek_v4/compressor.py:342 (C128 layers, fp8_ds_mla; key holds the KV cache block stride)"),
    # attention.py:458-463: FLASHMLA_SPARSE_DSV4 (the sm_90 backend) with cutlass importable
    CuteOwner(f"{OPS}.dequant_gather_k_cutedsl:_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL", _once_if(lambda d: True),
              "models/deepseek_v4/attention.py:463 (FLASHMLA_SPARSE_DSV4)"),
    # attention.py:973-987: DeepseekV4Indexer (C4 layers), MXFP4 or FP8 indexer cache
    CuteOwner(f"{OPS}.fused_indexer_q_cutedsl:_INDEXER_Q_FP8_KERNEL", _indexer_q(False),
              "models/deepseek_v4/attention.py:987 (fp8 indexer cache)"),
    CuteOwner(f"{OPS}.fused_indexer_q_cutedsl:_INDEXER_Q_MXFP4_KERNEL", _indexer_q(True),
              "models/deepseek_v4/attention.py:987 (mxfp4 indexer cache)"),
)


class _KVCacheView:
    """What `_SPARSE_ATTN_NORM_ROPE_STORE_KERNEL.get_warmup_keys` reads of a layer's allocated KV cache
    (sparse_attn_compress_cutedsl.py:1693-1721): ndim and stride(0). Every layer's block sits in one packed
    block of all layers' pages (block-outermost layout), so stride(0) is the packed block's size in bytes,
    the number config.indexer_kv_block_stride computes with vLLM's planning functions."""

    ndim = 3

    def __init__(self, block_stride: int) -> None:
        self._block_stride = block_stride

    def stride(self, dim: int) -> int:
        if dim != 0:
            raise NotImplementedError("nojit's KV cache view knows stride(0) only")
        return self._block_stride


def make_cutedsl_vllm_config(d: Deployment) -> Any:
    """config_view's VllmConfig slice plus the allocated C128 KV caches the store kernel's keys read."""
    view = make_vllm_config(d)
    forward_context: dict[str, Any] = {}
    if 128 in _ratios(d):
        kv = _KVCacheView(indexer_kv_block_stride(d))
        forward_context = {f"layers.{i}.attn": SimpleNamespace(kv_cache=kv)
                           for i, r in enumerate(layer_compress_ratios(d)) if r == 128}
    object.__setattr__(view, "compilation_config", SimpleNamespace(static_forward_context=forward_context))
    return view


CUTEDSL = CuteTables(owners=CUTEDSL_OWNERS, vllm_config=make_cutedsl_vllm_config)
