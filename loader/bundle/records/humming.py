"""Humming's launch record: what a bundle entry of runtime "humming" stores (the format's, read by the manifest
and written by the build side; loader/runtimes/humming/serving.py seeds Humming's cache with what it names)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

COMPILERS = ("NVRTCCompiler", "NVCCCompiler")
_SM = re.compile(r"^\d{2,3}a?$")


@dataclass(frozen=True)
class HummingLaunch:
    """One Humming kernel: Humming loads and launches it itself after finding it in its cache; these are the
    parts of Humming's cache key that belong to the kernel (the rest is computed on the serving machine)."""

    compiler: str  # humming.jit.compiler class that compiled it
    sm_version: str  # "90a"
    kernel_expr: str | None
    code: str  # the CUDA source Humming rendered
    disable_fast_math: bool
    postprocessed: bool  # compiled with a postprocess_cubin step (part of Humming's key)
    kernel_name: str  # the mangled entry Humming's loader picks

    def to_json(self) -> dict[str, Any]:
        return {"compiler": self.compiler, "sm_version": self.sm_version, "kernel_expr": self.kernel_expr,
                "code": self.code, "disable_fast_math": self.disable_fast_math, "postprocessed": self.postprocessed,
                "kernel_name": self.kernel_name}

    @classmethod
    def from_json(cls, f: Any) -> HummingLaunch:
        compiler = f.str("compiler", max_len=64)
        if compiler not in COMPILERS:
            raise f._bad("compiler", f"= {compiler!r:.40} is not one of {COMPILERS}")
        sm = f.str("sm_version", max_len=8)
        if not _SM.match(sm):
            raise f._bad("sm_version", f"= {sm!r:.20} is not an sm version like 90a")
        expr = f.get("kernel_expr", (str, type(None)))
        code = f.get("code", str)
        if len(code) > 1 << 20 or "\0" in code or (expr is not None and (len(expr) > 1 << 14 or "\0" in expr)):
            raise f._bad("code", "is not a Humming kernel source (too long or holds NUL)")
        name = f.str("kernel_name", max_len=4096)
        return cls(compiler, sm, expr, code, f.get("disable_fast_math", bool), f.get("postprocessed", bool), name)
