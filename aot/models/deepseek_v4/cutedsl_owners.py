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
LL = "vllm.model_executor.kernels.linear.cute_dsl"
CUTE_UTILS = ("vllm.cute_utils",)
LL_SOURCES = (f"{LL}._ll_router_common", f"{LL}._ll_bf16_dotprod", f"{LL}._ll_bf16_splitk")


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
              "models/deepseek_v4/compressor.py:336 (C4 layers, head 512, fp8_ds_mla)", CUTE_UTILS),
    CuteOwner(f"{COMPRESS}:_SPARSE_ATTN_COMPRESS_C128_BLOCK8_KERNEL", _once_if(lambda d: 128 in _ratios(d)),
              "models/deepseek_v4/compressor.py:338 (C128 layers, head 512)", CUTE_UTILS),
    CuteOwner(f"{COMPRESS}:_SPARSE_ATTN_NORM_ROPE_STORE_KERNEL",
              lambda d: [dict(k_cache_prefix=_c128_prefix(d), compress_ratio=128)] if 128 in _ratios(d) else [],
              "models/deepseek_v4/compressor.py:342 (C128 layers, fp8_ds_mla; key holds the KV cache block stride)",
              CUTE_UTILS),
    # attention.py:458-463: FLASHMLA_SPARSE_DSV4 (the sm_90 backend) with cutlass importable
    CuteOwner(f"{OPS}.dequant_gather_k_cutedsl:_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL", _once_if(lambda d: True),
              "models/deepseek_v4/attention.py:463 (FLASHMLA_SPARSE_DSV4)"),
    # attention.py:973-987: DeepseekV4Indexer (C4 layers), MXFP4 or FP8 indexer cache
    CuteOwner(f"{OPS}.fused_indexer_q_cutedsl:_INDEXER_Q_FP8_KERNEL", _indexer_q(False),
              "models/deepseek_v4/attention.py:987 (fp8 indexer cache)",
              (*CUTE_UTILS, "vllm.vllm_flash_attn.cute.utils")),
    CuteOwner(f"{OPS}.fused_indexer_q_cutedsl:_INDEXER_Q_MXFP4_KERNEL", _indexer_q(True),
              "models/deepseek_v4/attention.py:987 (mxfp4 indexer cache)",
              (*CUTE_UTILS, "vllm.vllm_flash_attn.cute.utils")),
    # The MoE router GEMM (not in the registry). GateLinear (nvidia/model.py:268: hidden_size -> n_routed_experts,
    # no bias, fp32 out, weight in the model dtype) takes tier 1, ll_bf16_gemm, for M <= 16 on sm_90
    # (gate_linear.py:187-205, 282-293). kernel_warmup.py:216-217 warms `ll_bf16_gemm_kernel` for M 1..16 over the
    # bf16 GateLinear shapes (k, n) (kernel_warmup.py:59-79); at run time M == 1 goes to `ll_bf16_gemm_c1_pdl_kernel`
    # instead (ll_bf16.py:336-350), which no warmup compiles: nojit bundles its one key too.
    CuteOwner(f"{LL}.ll_bf16:ll_bf16_gemm_kernel", lambda d: _router(d, range(1, 17)),
              "model_executor/warmup/kernel_warmup.py:217 (router warmup, M 1..16)", LL_SOURCES, origin="warmup"),
    CuteOwner(f"{LL}.ll_bf16:ll_bf16_gemm_c1_pdl_kernel", lambda d: _router(d, (1,)),
              "model_executor/kernels/linear/cute_dsl/ll_bf16.py:343 (M == 1 at run time; derived, not warmed)",
              LL_SOURCES, origin="derived"),
)


def _router(d: Deployment, m_values: Any) -> list[dict[str, Any]]:
    """ll_bf16's get_warmup_keys arguments: the bf16 gate's (k, n) = (hidden_size, n_routed_experts)."""
    hf = d.hf_config
    if d.dtype != "bfloat16" or d.platform.capability != (9, 0) or int(hf["hidden_size"]) % 8:
        return []
    return [dict(shapes=((int(hf["hidden_size"]), int(hf["n_routed_experts"])),), m_values=tuple(m_values))]


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
