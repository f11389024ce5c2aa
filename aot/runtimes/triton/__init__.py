"""Triton: enumerate keys with vLLM's warmup code and Triton's binder, compile them for sm_90a offline."""

from nojit.aot.runtimes.triton.planner import RUNTIME
from nojit.aot.runtimes.triton.rows import DerivedKernel, Tensor, TritonOwner, TritonSite, TritonTables

__all__ = ["RUNTIME", "DerivedKernel", "Tensor", "TritonOwner", "TritonSite", "TritonTables"]
