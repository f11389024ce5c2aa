"""FlashInfer's CuTeDSL kernels (the sm_90 gated-delta-rule prefill): the keys its `cached_compile` looks up,
compiled with FlashInfer's own path and exported with export_to_c."""

from nojit.aot.runtimes.flashinfer_cute.planner import RUNTIME, FiCuteSite, FlashInferCuteTables

__all__ = ["RUNTIME", "FiCuteSite", "FlashInferCuteTables"]
