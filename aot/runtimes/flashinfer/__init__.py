"""FlashInfer: the JIT modules vLLM reaches, built with FlashInfer's own AOT builder, served as a jit-cache provider."""

from nojit.aot.runtimes.flashinfer.planner import RUNTIME, FlashInferTables

__all__ = ["RUNTIME", "FlashInferTables"]
