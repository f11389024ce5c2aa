"""CuTeDSL: vLLM's registered CuTeDSL owners' keys, compiled with cute.compile and exported with export_to_c."""

from nojit.aot.runtimes.cutedsl.planner import RUNTIME, CuteOwner, CuteTables

__all__ = ["RUNTIME", "CuteOwner", "CuteTables"]
