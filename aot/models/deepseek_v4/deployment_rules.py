"""What a deployment of DeepSeek-V4 must say: the serving settings vLLM 0.33.0 runs this model with on sm_90."""

from __future__ import annotations

from nojit.aot.deployment import Deployment, field_error

BLOCK_SIZE = 256  # vLLM's DeepSeek-V4 attention backends on sm_90 take this KV-cache block size only
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_ds_mla")  # all mean fp8_ds_mla for this model on sm_90
SPECULATIVE_METHODS = (None, "mtp")  # DeepSeek-V4's own draft layer, or none


def check_deployment(d: Deployment) -> None:
    """Refuse a deployment this model is not served with, naming the file and the field."""
    if d.speculative_method not in SPECULATIVE_METHODS:
        raise field_error(d.source, "speculative", "method",
                          f"= {d.speculative_method!r}: only mtp (DeepSeek-V4's own draft layer) is supported")
    if d.block_size != BLOCK_SIZE:
        raise field_error(d.source, "serving", "block_size",
                          f"= {d.block_size}: vLLM's DeepSeek-V4 backends on sm_90 accept only {BLOCK_SIZE}")
    if d.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise field_error(d.source, "serving", "kv_cache_dtype",
                          f"= {d.kv_cache_dtype!r}: sm_90 serves DeepSeek-V4 with fp8_ds_mla only (auto/fp8)")
