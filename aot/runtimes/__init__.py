"""The kernel runtimes the build knows, in planning and compile order (one line per runtime)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nojit.aot.errors import BuildError
from nojit.aot.faces import Runtime
from nojit.aot.runtimes import cutedsl, deepgemm, flashinfer, flashinfer_cute, humming, tilelang, triton

RUNTIMES: dict[str, Runtime] = {
    tilelang.RUNTIME.name: tilelang.RUNTIME,  # first: its slow compiles start first, and vLLM's mHC module imports first
    triton.RUNTIME.name: triton.RUNTIME,
    cutedsl.RUNTIME.name: cutedsl.RUNTIME,  # vLLM's registered CuTeDSL owners (export_to_c objects)
    flashinfer_cute.RUNTIME.name: flashinfer_cute.RUNTIME,  # FlashInfer's cached_compile keys (GDN prefill), likewise
    deepgemm.RUNTIME.name: deepgemm.RUNTIME,  # nvcc per entry (~40 s each); a rebuild takes them from the cache
    flashinfer.RUNTIME.name: flashinfer.RUNTIME,  # nvcc builds of FlashInfer's JIT modules (FlashInfer's AOT builder)
    humming.RUNTIME.name: humming.RUNTIME,  # Humming's MXFP4 MoE kernels, compiled by Humming's NVRTC child (~7 s each)
}


def runtime(name: str) -> Runtime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise BuildError(f"unknown runtime {name!r}", fix=f"use one of {', '.join(RUNTIMES)}") from None


@contextlib.contextmanager
def registered(rt: Runtime) -> Iterator[Runtime]:
    """`rt` built for the scope of the with block (a runtime outside the package, e.g. a test's; the build's
    workers must then run in this process, as `BuildOptions.executor` allows)."""
    if rt.name in RUNTIMES:
        raise BuildError(f"runtime {rt.name!r} is already registered", fix="give the runtime another name")
    RUNTIMES[rt.name] = rt
    try:
        yield rt
    finally:
        del RUNTIMES[rt.name]
