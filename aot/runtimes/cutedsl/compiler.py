"""Compile one CuTeDSL key in a build worker, the way vLLM compiles it, and export it ahead of time.

The owner's own `compile(key)` runs (vLLM's `compile_cutedsl`: `cute.compile(kernel(key),
*warmup_inputs(key), fake stream, options="--enable-tvm-ffi")`), so the executor is exactly the
one vLLM would put into `_compiled_cache[key]`; CuTeDSL's own AOT path then writes it as an
object file (`export_to_c`: host code and the embedded cubin), which the loader reads back with
`cute.runtime.load_module`. No GPU is needed: CuTeDSL compiles for the arch it is told
(`CUTE_DSL_ARCH`, aot/target.py), and without one it would guess sm_100a, so the arch is set before cutlass
is imported and checked again before every compile.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Any

from nojit.aot.errors import BuildError
from nojit.aot.target import check_cute_arch, cute_object, set_cute_arch
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.cutedsl_key import cache_slot, key_from_json

set_arch = set_cute_arch  # before cutlass is imported (aot/target.py)


@contextlib.contextmanager
def _placeholder_stream() -> Iterator[None]:
    """The router GEMM compiles with `CUstream(current_stream().cuda_stream)` as its stream argument
    (_ll_router_common.py:46-50): a typed placeholder for cute.compile (its value is not compiled in), which
    torch cannot give without a GPU; stream 0 stands in for it here (build process only)."""
    import torch
    import vllm.utils.torch_utils as torch_utils

    if torch.cuda.is_available():
        yield
        return
    original = torch_utils.current_stream
    torch_utils.current_stream = lambda: type("Stream", (), {"cuda_stream": 0})()
    try:
        yield
    finally:
        torch_utils.current_stream = original


def export_symbol(kernel_id: str, key_json: Any) -> str:
    """The exported function's name: unique per kernel and key, the same in every build."""
    return "nojit_cute_" + hashlib.sha256(kernel_id.encode() + b"\0" + canonical_json(key_json)).hexdigest()[:24]


def key_class(owner: Any) -> type | None:
    return getattr(owner, "CompileKey", None)


def compile_and_export(owner: Any, kernel_id: str, key_json: Any) -> tuple[bytes, str, str]:
    """(object file bytes, exported symbol, compile options) of one key."""
    from vllm.model_executor.warmup.jit_warmup_cutedsl_helper import DEFAULT_CUTEDSL_COMPILE_OPTIONS

    check_cute_arch()
    key = key_from_json(key_json, key_class(owner))
    cache, slot = cache_slot(owner, key)
    cache.pop(slot, None)
    with _placeholder_stream():
        owner.compile(key)  # vLLM's own compile path
    executor = cache.get(slot)
    if executor is None or not hasattr(executor, "export_to_c"):
        raise BuildError(f"{kernel_id}.compile({key!r}) left no exportable executor in _compiled_cache",
                         fix="this vLLM's CuTeDSL owner differs from 0.33.0's; report it to nojit")
    symbol = export_symbol(kernel_id, key_json)
    return cute_object(executor, symbol, f"{kernel_id} key {key!r}"), symbol, DEFAULT_CUTEDSL_COMPILE_OPTIONS
