"""The kernel runtimes the loader serves, in install order (one line per runtime).

Install order matters where one runtime's install changes what another's sees: TileLang's stand-in module
goes in before anything imports vLLM's mHC module, and DeepGEMM's install comes after the firewall (its
compiler ends at the stand-in). Tests add a runtime for one scope with `registered`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nojit.loader.bundle.manifest import RUNTIMES as MANIFEST_RUNTIMES
from nojit.loader.bundle.manifest import registered as registered_launch
from nojit.loader.faces import Runtime
from nojit.loader.runtimes import cutedsl, deepgemm, flashinfer, flashinfer_cute, humming, tilelang, triton

RUNTIMES: dict[str, Runtime] = {
    tilelang.RUNTIME.name: tilelang.RUNTIME,  # first: vLLM's mHC module looks for tilelang_jit when imported
    flashinfer.RUNTIME.name: flashinfer.RUNTIME,  # the jit-cache provider, before FlashInfer is imported
    humming.RUNTIME.name: humming.RUNTIME,  # Humming's cache seeded from the bundle
    triton.RUNTIME.name: triton.RUNTIME,  # a server on each bundled JITFunction
    cutedsl.RUNTIME.name: cutedsl.RUNTIME,  # each owner's compile answered from the bundle
    flashinfer_cute.RUNTIME.name: flashinfer_cute.RUNTIME,  # FlashInfer's cached_compile lookups answered from the bundle
    deepgemm.RUNTIME.name: deepgemm.RUNTIME,  # last: after firewall.activate, DeepGEMM's probe answered
}


@contextlib.contextmanager
def registered(runtime: Runtime) -> Iterator[Runtime]:
    """`runtime` served for the scope of the with block (a runtime outside the package, e.g. a test's), its
    launch record with it."""
    if runtime.name in RUNTIMES:
        raise ValueError(f"runtime {runtime.name!r} is already registered")
    with contextlib.ExitStack() as stack:
        if runtime.launch is not None:
            stack.enter_context(registered_launch(runtime.name, runtime.launch))
        RUNTIMES[runtime.name] = runtime
        try:
            yield runtime
        finally:
            del RUNTIMES[runtime.name]


def in_manifest_order() -> list[Runtime]:
    """The registered runtimes in the order the manifest lists runtimes (startup line, unserved table)."""
    return [RUNTIMES[name] for name in MANIFEST_RUNTIMES if name in RUNTIMES]
