"""FlashInfer's CuTeDSL kernels in the build: the keys FlashInfer's own `cached_compile` looks up, planned by
running vLLM's call site and FlashInfer's wrappers on the stand-in GPU, and compiled by the same path.

A model names call sites (`FiCuteSite`: a "module:function" that makes one call the way vLLM's layer makes
it, and the calls its deployment reaches, e.g. one per prefill chunk shape). Planning runs each call with
FlashInfer's compile cache answered (stand_in.cache_answered): every lookup FlashInfer makes is recorded as
a key (loader/bundle/fi_cute_key.py) and answered with a function that launches nothing, so the wrapper
goes on to its next kernel (the CP path looks up four). Compiling one key runs the call that reached it
again with that key's lookup answered "absent", so FlashInfer's own `cached_compile` runs `cute.compile`
with the arguments its wrapper builds; the compiled function is caught when FlashInfer stores it (nothing
is launched) and CuTeDSL's `export_to_c` writes it as an object file with the sm_90a cubin, which the
loader reads back with `cute.runtime.load_module` (the cutedsl room's format, CuteLaunch).
"""

from __future__ import annotations

import functools
import importlib
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version as package_version
from typing import Any

import torch

from nojit.aot.compile_cache import file_sha256, launch_reader
from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.faces import CompileResult, Model, Runtime, Selection, WorkerSettings
from nojit.aot.plan import Plan, PlanKernel, PlanRequest
from nojit.aot.runtimes.flashinfer_cute import stand_in
from nojit.aot.target import TARGET, check_cute_arch, cute_object, set_cute_arch
from nojit.aot.vllm_env import PlatformFacts, installed_platform
from nojit.loader.bundle import fi_cute_key
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.cutedsl_key import source_hash_of_files
from nojit.loader.bundle.manifest import CuteLaunch
from nojit.loader.errors import NoJitError
from nojit.loader.settings import TOOL_FACTS

NAME = "flashinfer_cute"
OPTIONS = "--enable-tvm-ffi"  # FlashInfer's sm_90 options: (cute.EnableTVMFFI(True), cute.GPUArch("sm_90a"))
# The modules the sm_90 GDN kernel bodies are built from besides their classes' own (delta_rule_dsl/*.py)
DSL = "flashinfer.gdn_kernels.delta_rule_dsl"
HELPERS = tuple(f"{DSL}.{m}" for m in ("alpha", "collective_inverse_hmma", "collective_store_tma", "helpers",
                                        "schedule", "varlen_helper", "custom_compile_cache"))


@dataclass(frozen=True)
class FiCuteSite:
    site: str  # "module:function(call, device)": one call made as vLLM's layer makes it
    calls: Callable[[Deployment], list[dict[str, Any]]]  # the calls the deployment reaches (JSON values)
    groups: tuple[str, ...] = ("qwen3_5",)


@dataclass(frozen=True)
class FlashInferCuteTables:
    sites: tuple[FiCuteSite, ...]


def _function(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _facts() -> PlatformFacts:
    facts = installed_platform()
    if facts is None:
        raise BuildError("FlashInfer's CuTeDSL keys are planned on the stand-in GPU, which is not installed",
                         fix="plan through `nojit build` (it installs the deployment's platform first)")
    return facts


def _run(site: str, call: dict[str, Any], on_get: Callable[[Any], Any], on_set: Callable[[Any, Any], None]) -> None:
    fn = _function(site)
    with stand_in.flashinfer_on_stand_in(_facts()), stand_in.cache_answered(on_get, on_set), torch.inference_mode():
        fn(call, torch.device("cpu"))


def keys_of_call(site: str, call: dict[str, Any]) -> list[list[Any]]:
    """The keys FlashInfer's own code looks up for one call, in order."""
    seen: list[Any] = []

    def on_get(key: Any) -> Any:
        seen.append(key)
        return stand_in.no_launch

    try:
        _run(site, call, on_get, lambda k, v: None)
    except NoJitError:
        raise
    except Exception as exc:
        raise BuildError(f"{site}({call}) failed on the stand-in GPU: {type(exc).__name__}: {exc}",
                         fix="check the deployment values; if they are right, report this to nojit") from exc
    try:
        return [fi_cute_key.key_to_json(k) for k in seen]
    except ValueError as exc:
        raise BuildError(f"{site}({call}): FlashInfer looked up a key nojit cannot write: {exc}",
                         fix="report it to nojit with the FlashInfer version") from None


def source_modules(kernel_id: str) -> list[str]:
    """The kernel class's module and those of its FlashInfer bases, then the DSL helpers (the record's sources)."""
    module, _, qualname = kernel_id.partition(":")
    cls = getattr(importlib.import_module(module), qualname)
    own = [c.__module__ for c in cls.__mro__ if c.__module__.startswith("flashinfer.")]
    return list(dict.fromkeys([*own, *HELPERS]))


def source_hash(modules: list[str]) -> str:
    for m in modules:
        importlib.import_module(m)
    return source_hash_of_files([(m, sys.modules[m].__file__) for m in modules])


def tool_versions() -> dict[str, str]:
    return {tool: package_version(tool) for tool in TOOL_FACTS[NAME]}


def plan(p: Plan, d: Deployment, model: Model, selection: Selection) -> None:
    tables: FlashInferCuteTables | None = model.tables.get(NAME)
    if tables is None or not d.cutedsl:
        return
    set_cute_arch()
    for row in tables.sites:
        if not selection.in_groups(row.groups):
            continue
        for call in row.calls(d):
            for key in keys_of_call(row.site, call):
                kid = fi_cute_key.kernel_of(key)
                if not selection.wants(kid):
                    continue
                if kid not in p.kernels:
                    sources = source_modules(kid)
                    p.add_kernel(kid, PlanKernel(runtime=NAME, source_hash=source_hash(sources), params=[],
                                                 info={"sources": sources, "site": row.site, **tool_versions()}))
                p.add(PlanRequest(kid, key, "exact", f"call:{row.site}",
                                  compile_inputs={"site": row.site, "call": call}))


def prepare_worker(settings: WorkerSettings) -> None:
    set_cute_arch()
    os.environ.setdefault("CUTE_DSL_CACHE_DIR", os.path.join(settings.cache_dir, "cutedsl"))


def export_symbol(key_json: Any) -> str:
    import hashlib

    return "nojit_fi_cute_" + hashlib.sha256(canonical_json(key_json)).hexdigest()[:24]


class _Caught(Exception):
    """Raised where FlashInfer stores the compiled function, so the wrapper launches nothing."""


def compile_key(site: str, call: dict[str, Any], key_json: Any) -> Any:
    """FlashInfer's own cached_compile of `key_json`, reached by `call`: the compiled function (not launched)."""
    check_cute_arch()
    want = canonical_json(key_json)
    caught: dict[str, Any] = {}

    def on_get(key: Any) -> Any:
        return None if canonical_json(fi_cute_key.key_to_json(key)) == want else stand_in.no_launch

    def on_set(key: Any, fn: Any) -> None:
        caught["fn"] = fn
        raise _Caught

    try:
        _run(site, call, on_get, on_set)
    except _Caught:
        return caught["fn"]
    except NoJitError:
        raise
    except Exception as exc:
        raise BuildError(f"cute.compile of {fi_cute_key.key_text(key_json)} failed: {type(exc).__name__}: {exc}",
                         fix="check that nvidia-cutlass-dsl is the version FlashInfer needs") from exc
    raise BuildError(f"{site}({call}) did not compile {fi_cute_key.key_text(key_json)}",
                     fix="FlashInfer's wrapper differs from the plan's; rebuild the plan") from None


def compile_request(request: PlanRequest, kernel_id: str, kernel: PlanKernel, settings: WorkerSettings) -> CompileResult:
    """Runs in a build worker: compile one key through FlashInfer's own path, export it, return the bundle pieces."""
    inputs = request.compile_inputs
    if not isinstance(inputs.get("site"), str) or not isinstance(inputs.get("call"), dict):
        raise BuildError(f"{kernel_id} key {fi_cute_key.key_text(request.key)} has no call that reaches it (a key "
                         "recorded at serve time, or a plan from another nojit)",
                         fix="build from the deployment: `nojit build --deployment <file> --runtime flashinfer_cute`")
    fn = compile_key(inputs["site"], inputs["call"], request.key)
    symbol = export_symbol(request.key)
    data = cute_object(fn, symbol, f"{kernel_id} key {fi_cute_key.key_text(request.key)}")
    return CompileResult(cubin=data, launch=CuteLaunch(symbol, OPTIONS),
                         source_hash=source_hash(kernel.info["sources"]), kernel_info=tool_versions())


def cache_inputs(request: PlanRequest, kernel: PlanKernel) -> dict[str, Any]:
    """What one key's object depends on: the key and the call that reaches it, the FlashInfer sources and the
    tools (CuTeDSL, TVM-FFI, FlashInfer, vLLM's call site, torch, Python), the target and nojit's code."""
    return {"runtime": NAME, "kernel": request.kernel, "key": request.key, "inputs": request.compile_inputs,
            "source_hash": kernel.source_hash, "tools": tool_versions(), "vllm": package_version("vllm"),
            "torch": package_version("torch"), "python": platform.python_version(), "target": TARGET.to_json(),
            "compiler": _compiler_code()}


@functools.cache
def _compiler_code() -> str:
    return ",".join(file_sha256(m.__file__) for m in (stand_in, fi_cute_key, sys.modules[__name__]))


RUNTIME = Runtime(name=NAME, plan=plan, prepare_worker=prepare_worker, compile=compile_request,
                  cache_inputs=cache_inputs, launch_from_json=launch_reader(CuteLaunch))
