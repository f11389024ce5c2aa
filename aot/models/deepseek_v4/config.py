"""Facts about a DeepSeek-V4 deployment's layers that decide kernel keys (vLLM 0.33.0).

`layer_compress_ratios` lists the attention layers vLLM builds; `indexer_kv_block_stride`
computes the byte stride between KV blocks of the indexer K cache, which vLLM passes as
the KV_BLOCK_STRIDE constexpr of the indexer compressor kernel. That stride is not a page
size: the DeepSeek-V4 indexer takes block-outermost layouts only (v1/attention/backends/
mla/indexer.py:348-352), where every layer's block b sits inside one packed block of all
layers' pages, `bytes_per_block` apart (v1/core/kv_cache_planning.py:574-605, 676, 711-722;
v1/kv_cache_interface.py:1480-1485). It is computed here by vLLM's own planning functions
over the per-layer specs vLLM's own `get_kv_cache_spec` methods return; only the list of
layers (which cache modules each attention layer builds, in construction order) is
stated here, with the lines it was read from.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace as NS
from typing import Any

import torch

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.models.runner import KVCacheGroup
from nojit.aot.vllm_env import import_kernel_module


def hf_config(d: Deployment) -> Any:
    from transformers import DeepseekV4Config

    return DeepseekV4Config(**d.hf_config)


def layer_compress_ratios(d: Deployment) -> list[int]:
    """Compress ratio of every attention layer vLLM builds: the target's layers, then the
    MTP draft layers when MTP is on (models/deepseek_v4/attention.py:238-242: max(1, rate)
    for layers < num_hidden_layers, 1 for the MTP layers; nvidia/mtp.py:236-243 builds
    num_nextn_predict_layers of them)."""
    hf = hf_config(d)
    main = [max(1, int(hf.compress_rates.get(t, 0))) for t in hf.layer_types[: hf.num_hidden_layers]]
    mtp = [1] * int(hf.num_nextn_predict_layers) if d.speculative_method == "mtp" else []
    return main + mtp


def kv_cache_groups(d: Deployment) -> tuple[KVCacheGroup, ...]:
    """The KV-cache groups vLLM builds for DeepSeek-V4, as the runners' block tables see them: the main MLA
    and indexer caches with the deployment's block_size (attention.py:868, 914), the SWA cache 64
    (sparse_swa.py:85), the C4 / C128 compressor states 4 / 8 (compressor.py:160-173) where layers compress
    so; SWA and compressor states are sliding-window specs keeping tokens (gpu/model_runner.py:658)."""
    ratios = set(layer_compress_ratios(d))
    states = [KVCacheGroup(4, True)] * (4 in ratios) + [KVCacheGroup(8, True)] * (128 in ratios)
    return (KVCacheGroup(d.block_size, False), KVCacheGroup(64, True), *states)


def indexer_kv_block_stride(d: Deployment) -> int:
    """`kv_cache.stride(0)` of the indexer K cache view, in bytes (the view is uint8).

    Per attention layer, in the order its constructor registers cache modules in the
    static forward context (get_layers_from_vllm_config iterates it): for a C4 layer the
    indexer (attention.py:310) registers its K cache (:1030) then its compressor's state
    cache (:1037, compressor.py:282); then the SWA cache (attention.py:349), the layer
    itself (:363) and its own compressor (:370). MTP layers follow the target's.
    """
    att = import_kernel_module("vllm.models.deepseek_v4.attention")
    comp = import_kernel_module("vllm.models.deepseek_v4.compressor")
    swa = import_kernel_module("vllm.v1.attention.backends.mla.sparse_swa")
    idx = import_kernel_module("vllm.v1.attention.backends.mla.indexer")
    mla = import_kernel_module("vllm.models.deepseek_v4.sparse_mla")
    plan = import_kernel_module("vllm.v1.core.kv_cache_planning")
    worker = import_kernel_module("vllm.v1.worker.utils")
    backend_utils = import_kernel_module("vllm.v1.attention.backends.utils")

    hf = hf_config(d)
    # Backends: nvidia/flashmla.py:54-55 (FlashMLA sparse + its SWA backend, which only
    # overrides the builder), compressor.py:197, attention.py:929.
    mla_backend, swa_backend = mla.DeepseekV4FlashMLABackend, swa.DeepseekSparseSWABackend
    comp_backend, idx_backend = comp.CompressorBackend, idx.DeepseekV4IndexerBackend
    layout = backend_utils.get_supported_kv_cache_layouts([mla_backend, swa_backend, comp_backend, idx_backend])[0]
    if not layout.is_block_outermost:
        raise BuildError(f"vLLM resolved KV cache layout {layout.name} for DeepSeek-V4, not block-outermost",
                         fix="this nojit's KV layout derivation is for vLLM 0.33.0; report this")
    cache_config = NS(block_size=d.block_size, cache_dtype="fp8_ds_mla", kv_cache_layout=layout.name,
                      get_resolved_kv_cache_layout=lambda: layout)
    cfg = NS(cache_config=cache_config, scheduler_config=NS(disable_hybrid_kv_cache_manager=False),
             attention_config=NS(hisparse_config=None), model_config=NS(supports_kv_cache_grouping=False))
    kv_dtype = torch.uint8  # fp8_ds_mla (attention.py:94-125)
    head_dim, index_head_dim = int(hf.head_dim), int(hf.index_head_dim)
    specs: dict[str, Any] = {}

    def add(name: str, spec: Any, backend: Any, draft: bool) -> None:
        if spec is None:
            return
        spec = worker.customize_attention_spec(backend, spec)  # v1/worker/gpu/attn_utils.py:148-151
        specs[name] = replace(spec, is_draft=True) if draft else spec

    def state_cache(ratio: int, dim: int) -> NS:  # compressor.py:282-287 and :140-173
        coff = 1 + (ratio == 4)
        return NS(state_dim=2 * coff * dim, dtype=torch.float32, sliding_window=coff * ratio,
                  block_size=4 if ratio == 4 else 8)

    ratios = layer_compress_ratios(d)
    for i, r in enumerate(ratios):
        draft, p = i >= hf.num_hidden_layers, f"layers.{i}.attn"
        if r == 4:
            # DeepseekV4Indexer: K cache head = 128 fp8 + 4 B scale (attention.py:1024-1036)
            k_cache = NS(cache_config=cache_config, head_dim=index_head_dim + index_head_dim // 128 * 4,
                         dtype=torch.uint8, compress_ratio=r)
            add(f"{p}.indexer.k_cache", att.DeepseekV4IndexerCache.get_kv_cache_spec(k_cache, cfg), idx_backend, draft)
            add(f"{p}.indexer.compressor.state_cache",
                comp.CompressorStateCache.get_kv_cache_spec(state_cache(r, index_head_dim), cfg), comp_backend, draft)
        # DeepseekV4SWACache defaults: block 64, 584 B/token, 576 B pages (sparse_swa.py:76-91)
        swa_cache = NS(cache_config=cache_config, bounded_replay=False, block_size=64, head_dim=head_dim,
                       dtype=kv_dtype, window_size=int(hf.sliding_window), packed_bytes_per_token=584,
                       packed_page_alignment=576, packed_block_stride_alignment=None)
        add(f"{p}.swa_cache", swa.DeepseekV4SWACache.get_kv_cache_spec(swa_cache, cfg), swa_backend, draft)
        layer = NS(compress_ratio=r, kv_cache_dtype="fp8_ds_mla", head_dim=head_dim, kv_cache_torch_dtype=kv_dtype)
        add(p, att.DeepseekV4Attention.get_kv_cache_spec(layer, cfg), mla_backend, draft)
        if r > 1:
            add(f"{p}.compressor.state_cache",
                comp.CompressorStateCache.get_kv_cache_spec(state_cache(r, head_dim), cfg), comp_backend, draft)
    groups = plan.get_kv_cache_groups(cfg, specs)
    return int(plan._get_kv_cache_bytes_per_block(groups, layout))
