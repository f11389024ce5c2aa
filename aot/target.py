"""The GPU target every cubin of a bundle is built for: sm_90a (Hopper, compute capability 9.0).

The one home of these numbers on the build side; the Triton and TileLang compilers and the
manifest's target all read them from here.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from nojit.aot.errors import BuildError
from nojit.loader.bundle.manifest import Target

TARGET = Target(backend="cuda", capability=90, arch="sm_90a", warp_size=32)

# CuTeDSL (the cutedsl and flashinfer_cute rooms) reads its target from CUTE_DSL_ARCH (base_dsl/env_manager.py)
# and, told nothing, would guess sm_100a on a box without a GPU.
CUTE_ARCH_VAR = "CUTE_DSL_ARCH"


def set_cute_arch() -> None:
    """Before cutlass is imported."""
    os.environ[CUTE_ARCH_VAR] = TARGET.arch


def check_cute_arch() -> None:
    from cutlass.cutlass_dsl.cutlass import CuTeDSL

    arch = str(CuTeDSL._get_dsl().envar.arch)
    if arch != TARGET.arch:
        raise BuildError(f"CuTeDSL targets {arch}, the bundle is for {TARGET.arch}",
                         fix=f"set {CUTE_ARCH_VAR}={TARGET.arch} before cutlass is imported (the build does this)")


def cute_object(executor: Any, symbol: str, what: str) -> bytes:
    """A CuTeDSL compiled function as the object file its `export_to_c` writes (host code and the embedded cubin),
    checked to hold a cubin for the target."""
    with tempfile.TemporaryDirectory(prefix="nojit-cute-") as tmp:
        path = os.path.join(tmp, f"{symbol}.o")
        executor.export_to_c(path, function_name=symbol)
        with open(path, "rb") as f:
            data = f.read()
    if TARGET.arch.encode() not in data:
        raise BuildError(f"{what}: the exported object holds no {TARGET.arch} cubin",
                         fix=f"CuTeDSL compiled for another arch; set {CUTE_ARCH_VAR}={TARGET.arch}")
    return data
