"""What a deployment of Qwen3.5 / Qwen3-Next must say: the serving settings vLLM 0.33.0 runs these models with on sm_90."""

from __future__ import annotations

from nojit.aot.deployment import Deployment, field_error
from nojit.aot.models.qwen3_5.config import GDN_PREFILL_BACKENDS, gdn_facts, gdn_prefill_backend
from nojit.aot.vllm_env import install_deployment_platform

SPECULATIVE_METHODS = (None, "mtp", "qwen3_next_mtp", "qwen3_5_mtp")  # the model's own MTP layer, or none
KV_CACHE_DTYPES = ("auto", "bfloat16")  # the rows lay the GDN cache out in the model dtype


def check_deployment(d: Deployment) -> None:
    """Refuse a deployment the rows do not describe, naming the file and the field."""
    if d.speculative_method not in SPECULATIVE_METHODS:
        raise field_error(d.source, "speculative", "method",
                          f"= {d.speculative_method!r}: only the model's own MTP layer (mtp) is rowed")
    if d.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise field_error(d.source, "serving", "kv_cache_dtype",
                          f"= {d.kv_cache_dtype!r}: the Qwen rows know the model-dtype cache only (auto)")
    if d.gdn_prefill_backend is not None and d.gdn_prefill_backend not in GDN_PREFILL_BACKENDS:
        raise field_error(d.source, "serving", "gdn_prefill_backend",
                          f"= {d.gdn_prefill_backend!r}: vLLM's --gdn-prefill-backend takes one of {GDN_PREFILL_BACKENDS}")
    install_deployment_platform(d.platform)  # what the build does next; gdn_facts asks vLLM for page sizes
    try:
        backend = gdn_prefill_backend(d)
    except (ValueError, RuntimeError) as exc:  # vLLM refuses sycl / aiter_flydsl off their platforms
        raise field_error(d.source, "serving", "gdn_prefill_backend", f"= {d.gdn_prefill_backend!r}: vLLM says: {exc}")
    if backend not in ("flashinfer", "triton"):
        raise field_error(d.source, "serving", "gdn_prefill_backend",
                          f"= {d.gdn_prefill_backend!r}: vLLM would run {backend!r}; the rows know flashinfer and triton")
    block = gdn_facts(d).block_size
    if d.block_size != block:
        raise field_error(d.source, "serving", "block_size",
                          f"= {d.block_size}: vLLM aligns this hybrid model's attention block to {block} tokens "
                          "(its page must cover the GDN state page; platforms/interface.py:940-1131)")
