"""Humming: the MXFP4 MoE kernels vLLM's Humming experts reach, compiled with Humming's own NVRTC path."""

from nojit.aot.runtimes.humming.tables import HummingTables, MoeExperts
from nojit.aot.runtimes.humming.planner import RUNTIME

__all__ = ["RUNTIME", "HummingTables", "MoeExperts"]
