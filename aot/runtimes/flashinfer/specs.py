"""FlashInfer's own JitSpec for a module, made for the deployment's GPU, and its source digest.

The spec comes from FlashInfer's gen_*_module function (modules.py names it); FlashInfer picks the
nvcc -gencode flags from its compilation context, which reads FLASHINFER_CUDA_ARCH_LIST when it is
set (compilation_context.py:112-125), so the build sets it from the deployment's capability and
refreshes the context in place (jit/core.py:108-119) instead of probing a GPU.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
from collections.abc import Iterator
from typing import Any

from nojit.aot.errors import BuildError


def arch_list(capability: tuple[int, int]) -> str:
    """FlashInfer's spelling of the target (9.0 -> "9.0a": Hopper kernels need the arch-specific target)."""
    major, minor = capability
    return f"{major}.{minor}a" if major >= 9 else f"{major}.{minor}"


def cuda_architecture(capability: tuple[int, int]) -> str:
    """The name FlashInfer's AOT lookup compares providers by (jit/env.py:245-249): "sm90a"."""
    return "sm" + arch_list(capability).replace(".", "")


@contextlib.contextmanager
def flashinfer_target(capability: tuple[int, int]) -> Iterator[None]:
    old = os.environ.get("FLASHINFER_CUDA_ARCH_LIST")
    os.environ["FLASHINFER_CUDA_ARCH_LIST"] = arch_list(capability)
    from flashinfer.jit.core import refresh_current_compilation_context

    refresh_current_compilation_context()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FLASHINFER_CUDA_ARCH_LIST", None)
        else:
            os.environ["FLASHINFER_CUDA_ARCH_LIST"] = old
        refresh_current_compilation_context()


def make_spec(gen: str, name: str) -> Any:
    """Call FlashInfer's gen function; the module name it gives must be the one the table expects."""
    module_name, _, qualname = gen.partition(":")
    try:
        spec = getattr(importlib.import_module(module_name), qualname)()
    except (ImportError, AttributeError) as exc:
        raise BuildError(f"FlashInfer has no {gen} ({exc})",
                         fix="install the FlashInfer vLLM 0.33.0 requires (0.7.2.post1) or update "
                             "aot/runtimes/flashinfer/modules.py") from None
    if spec.name != name:
        raise BuildError(f"{gen}() makes module {spec.name!r}, the table expects {name!r}",
                         fix="update aot/runtimes/flashinfer/modules.py for the installed FlashInfer")
    return spec


def _portable(value: Any, root: str) -> Any:
    text = str(value)
    return text.replace(root, "<flashinfer>") if root else text


def spec_digest(spec: Any, version: str) -> str:
    """sha256 of what the module is compiled from: FlashInfer's version, the module name, each source file's
    bytes and every flag FlashInfer passes (install paths replaced, so the digest is the same anywhere)."""
    import flashinfer

    root = os.path.dirname(os.path.abspath(flashinfer.__file__))
    h = hashlib.sha256()
    sources = []
    for src in spec.sources:
        with open(src, "rb") as f:
            sources.append([_portable(src, root), hashlib.sha256(f.read()).hexdigest()])
    facts = {
        "flashinfer": version, "name": spec.name, "sources": sources,
        "cflags": [_portable(x, root) for x in spec.extra_cflags or []],
        "cuda_cflags": [_portable(x, root) for x in spec.extra_cuda_cflags or []],
        "ldflags": [_portable(x, root) for x in spec.extra_ldflags or []],
        "include_dirs": [_portable(x, root) for x in spec.extra_include_dirs or []],
        "device_linking": bool(spec.needs_device_linking),
    }
    h.update(json.dumps(facts, sort_keys=True).encode())
    return h.hexdigest()
