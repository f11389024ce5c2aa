"""DeepGEMM (vLLM's vendored 2.8.1): enumerate its cache entries with its own code, compile them with nvcc."""

from nojit.aot.runtimes.deepgemm.planner import RUNTIME, DeepGemmTables

__all__ = ["RUNTIME", "DeepGemmTables"]
