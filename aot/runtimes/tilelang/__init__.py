"""TileLang: enumerate vLLM's mHC calls, compile them for sm_90a, read their launch schema."""

from nojit.aot.runtimes.tilelang.planner import RUNTIME, TileLangTables

__all__ = ["RUNTIME", "TileLangTables"]
