"""vLLM's JIT warmup registry, resolved to the bundle: preflight, warmup and preload in one pass.

vLLM collects `register_warmup` calls while its model runner builds the model, attention
backends and KV cache, then `kernel_warmup` runs `JitWarmupRegistry.warmup()` once per worker,
before its warm-up runs and CUDA-graph capture (model_executor/warmup/kernel_warmup.py;
v1/worker/gpu_worker.py `_compile_or_warm_up_model`). nojit wraps that method:

1. Triton's driver questions are answered from torch (triton_driver), so deriving keys with
   an empty TRITON_CACHE_DIR builds no `cuda_utils`.
2. vLLM's own warmup runs unchanged. With nojit installed a bundled Triton key resolves to its
   cubin (`JITFunction.run(warmup=True)` returns the bundle entry), a bundled TileLang key to
   its entry (`JITImpl.compile`) and a bundled CuTeDSL key to its exported object, loaded into
   the owner's `_compiled_cache` (cutedsl_serving); nothing compiles.
3. In strict mode it is also the preflight: every declared key is tried and every one the
   bundle does not serve is collected (a key the bundle lacks, a kernel it does not hold, and
   every key of a JIT nojit does not serve yet, and every CuTeDSL key of an owner the bundle
   lacks, which is not compiled at all),
   and the start fails with one message listing them all.
4. Every bundled module is then loaded on the worker's device, so that CUDA-graph capture,
   which follows, loads nothing.

The registry's constructor is wrapped too: the model runner builds it before loading the model, with the
final VllmConfig, so strict mode refuses there a start whose compilation config would run Inductor
(loader/inductor.py); the other modes print one line saying Inductor will compile.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from nojit.loader.errors import NoJitError, PreflightError
from nojit.loader.settings import Mode, settings


@dataclass(frozen=True)
class Unserved:
    backend: str
    owner: str
    key: str
    reason: str


@dataclass
class WarmupReport:
    """What the last wrapped `JitWarmupRegistry.warmup()` did in this process (tests, logs)."""

    keys: dict[str, int]  # backend -> keys vLLM asked to compile
    unserved: list[Unserved]
    seconds: float
    preloaded: int


last_report: WarmupReport | None = None
_original_warmup: Any = None
_original_init: Any = None


def backend_of(kernel: Any) -> str:
    """Which JIT a registered warmup owner compiles with (by vLLM's owner base classes)."""
    for cls in type(kernel).__mro__:
        name = f"{cls.__module__}:{cls.__qualname__}"
        if name == "vllm.model_executor.warmup.jit_warmup_triton_helper:VllmTritonJitKernel":
            return "Triton"
        if name == "vllm.model_executor.warmup.jit_warmup_tilelang_helper:VllmTileLangJitKernel":
            return "TileLang"
        if name == "vllm.model_executor.warmup.jit_warmup_cutedsl_helper:VllmCuTeDSLJitKernel":
            return "CuTeDSL"
    return type(kernel).__name__


def owner_name(kernel: Any) -> str:
    name = getattr(kernel, "__qualname__", None) or type(kernel).__qualname__
    module = getattr(kernel, "__module__", None) or type(kernel).__module__
    return f"{module}:{name}"


def _short(key: Any, limit: int = 160) -> str:
    if type(key).__name__ == "TritonCompileKey":  # process-local ids; the reason names the kernel and the key
        return "(Triton key)"
    text = repr(key)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _registered_kernels(registry: Any) -> list[Any]:
    regs = getattr(registry, "_registrations", None)
    if not isinstance(regs, dict):
        raise NoJitError("vLLM's JitWarmupRegistry has no _registrations dict: this vLLM is not the one nojit supports",
                         fix="install vLLM 0.33.0, or run with NOJIT_MODE=permissive")
    return list(regs)


def warmup_through_bundle(registry: Any) -> None:
    """The wrapped `JitWarmupRegistry.warmup` (see the module docstring)."""
    global last_report
    from nojit.loader.install import current
    from nojit.loader.runtimes.triton.driver import answer_from_torch

    inst = current()
    if inst is None:  # nojit is not serving in this process
        return _original_warmup(registry)
    from nojit.loader.announce import announce

    announce(inst)  # a forked worker did not run the plugin itself
    start = time.perf_counter()
    if "triton" in sys.modules:
        answer_from_torch()
    strict = inst.mode is Mode.STRICT
    keys: dict[str, int] = {}
    unserved: list[Unserved] = []
    wrapped = []
    cute_owners = {id(s.owner) for s in inst.servers("cutedsl").values()}  # owners served from the bundle
    for kernel in _registered_kernels(registry):
        backend, owner = backend_of(kernel), owner_name(kernel)
        served_here = backend in ("Triton", "TileLang") or id(kernel) in cute_owners
        original = kernel.compile
        own = kernel.__dict__.get("compile")  # a server's instance attribute (CuTeDSL), put back below

        def compile_one(key: Any, _orig: Any = original, _b: str = backend, _o: str = owner,
                        _served: bool = served_here) -> None:
            keys[_b] = keys.get(_b, 0) + 1
            if not strict:
                return _orig(key)
            if not _served:  # never compiled in strict mode: listed, refused below
                reason = ("CuTeDSL owner not in the bundle" if _b == "CuTeDSL" else
                          "nojit does not serve this JIT yet")
                unserved.append(Unserved(_b, _o, _short(key), reason))
                return None
            try:
                return _orig(key)
            except NoJitError as exc:  # a key the bundle lacks, or a compile the guards refused
                unserved.append(Unserved(_b, _o, _short(key), exc.message))
                return None

        kernel.compile = compile_one  # instance attribute, removed again below
        wrapped.append((kernel, own))
    try:
        _original_warmup(registry)
    except NoJitError as exc:  # a path that does not go through compile() (e.g. TileLang par_compile)
        if not strict:
            raise
        unserved.append(Unserved("?", "?", "?", exc.message))
    finally:
        for kernel, own in wrapped:
            kernel.__dict__.pop("compile", None)
            if own is not None:
                kernel.compile = own
    if unserved:
        last_report = WarmupReport(keys, unserved, time.perf_counter() - start, 0)
        raise PreflightError(_preflight_message(unserved, sum(keys.values()), inst.bundle.path), fix=_PREFLIGHT_FIX)
    preloaded = inst.preload()
    last_report = WarmupReport(keys, unserved, time.perf_counter() - start, preloaded)
    if not settings.quiet:
        counts = ", ".join(f"{n} {b}" for b, n in sorted(keys.items())) or "no"
        print(f"nojit[pid {os.getpid()}]: vLLM's JIT warmup registry: {counts} keys resolved to {inst.bundle.path} in "
              f"{last_report.seconds:.2f} s ({inst.mode.value}); {preloaded} bundled modules loaded before CUDA-graph "
              "capture", file=sys.stderr, flush=True)
    return None


_PREFLIGHT_FIX = (
    "add the missing Triton/TileLang keys to the bundle (run once with NOJIT_MODE=record, then `nojit build "
    "--add-keys`), switch off the unserved JITs where vLLM has a switch (README, 'Use with vLLM'), or start with "
    "NOJIT_MODE=permissive to let them compile"
)


def _preflight_message(unserved: list[Unserved], declared: int, bundle: str) -> str:
    lines = [f"strict mode: vLLM's JIT warmup registry declares {declared} keys; {len(unserved)} of them are not "
             f"served by {bundle}, so the start is refused before anything compiles:"]
    for u in unserved:
        lines.append(f"  {u.backend:8} {u.owner} {u.key}: {u.reason}")
    return "\n".join(lines)


def check_inductor(vllm_config: Any) -> None:
    """Strict mode: refuse a config that would run Inductor (PreflightError); other modes: say it will compile."""
    from nojit.loader import inductor
    from nojit.loader.install import current

    inst = current()
    what = inductor.would_compile(vllm_config) if inst is not None else None
    if what is None:
        return
    if inst.mode is Mode.STRICT:
        inductor.check(vllm_config)
    elif not settings.quiet:
        print(f"nojit[pid {os.getpid()}]: {what}; {inst.mode.value} mode lets it compile in this process "
              f"(strict mode refuses the start; avoid with {inductor.SWITCH})", file=sys.stderr, flush=True)


def hook() -> None:
    """Route `JitWarmupRegistry.warmup` through the bundle and check the compilation config at the
    registry's construction (idempotent; class-wide, so forked workers inherit it)."""
    global _original_warmup, _original_init
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    if getattr(JitWarmupRegistry.warmup, "__nojit__", False):
        return
    _original_warmup = JitWarmupRegistry.warmup
    _original_init = JitWarmupRegistry.__init__

    def init(self: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> None:
        check_inductor(vllm_config)
        _original_init(self, vllm_config, *args, **kwargs)

    init.__nojit__ = True  # type: ignore[attr-defined]
    JitWarmupRegistry.__init__ = init  # type: ignore[method-assign]

    def warmup(self: Any) -> None:
        return warmup_through_bundle(self)

    warmup.__nojit__ = True  # type: ignore[attr-defined]
    warmup.__doc__ = _original_warmup.__doc__
    JitWarmupRegistry.warmup = warmup  # type: ignore[method-assign]


def unhook() -> None:
    global _original_warmup, _original_init
    if _original_warmup is None:
        return
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    JitWarmupRegistry.warmup = _original_warmup  # type: ignore[method-assign]
    JitWarmupRegistry.__init__ = _original_init  # type: ignore[method-assign]
    _original_warmup = _original_init = None
