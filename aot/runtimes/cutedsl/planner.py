"""CuTeDSL in the build: vLLM's registered CuTeDSL owners' keys into the plan, one key's compile in a worker.

A model names vLLM's owner objects (`VllmCuTeDSLJitKernel` instances, e.g.
`..dequant_gather_k_cutedsl:_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL`) and the arguments its code
passes to `register_warmup`; the keys are what the owner's own `get_warmup_keys` returns, exactly
as `JitWarmupRegistry.warmup()` expands them in the serving process. The kernel id is the owner
object's (it holds `_compiled_cache`), the source digest the sha256 of its module's text.
Compiled keys go through the build's compile cache (cache_inputs), so a rebuild compiles only new keys.
"""

from __future__ import annotations

import functools
import inspect
import os
import platform
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib.metadata import version as package_version
from typing import Any

from nojit.aot.compile_cache import file_sha256, launch_reader
from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.faces import CompileResult, Model, Runtime, Selection, WorkerSettings
from nojit.aot.plan import Plan, PlanKernel, PlanRequest
from nojit.aot.runtimes.cutedsl import compiler
from nojit.aot.runtimes.cutedsl.compiler import compile_and_export, key_class, set_arch
from nojit.aot.target import TARGET
from nojit.aot.vllm_env import import_kernel_module
from nojit.loader.bundle.cutedsl_key import key_to_json, source_hash
from nojit.loader.errors import BundleMismatchError, NoJitError
from nojit.loader.bundle import cutedsl_key
from nojit.loader.resolve import resolve_object
from nojit.loader.bundle.manifest import CuteLaunch
from nojit.loader.settings import TOOL_FACTS

NAME = "cutedsl"


@dataclass(frozen=True)
class CuteOwner:
    owner: str  # "module:attribute" of vLLM's VllmCuTeDSLJitKernel object
    registrations: Callable[[Deployment], list[dict[str, Any]]]  # register_warmup kwargs per call site; [] = not reached
    site: str  # where vLLM registers it
    sources: tuple[str, ...] = ()  # vLLM modules besides the owner's that its kernel body is built from
    groups: tuple[str, ...] = ("dsv4",)
    origin: str = "registry"  # registry (JitWarmupRegistry), warmup (another vLLM warmup), derived (nojit's)


@dataclass(frozen=True)
class CuteTables:
    owners: tuple[CuteOwner, ...]
    vllm_config: Callable[[Deployment], Any]  # the slice of VllmConfig the owners' get_warmup_keys read


_FLASH_ATTN = "vllm.vllm_flash_attn"


def _import_owner_module(name: str) -> Any:
    """import_kernel_module, except that on a box without libcuda `vllm.vllm_flash_attn`'s __init__ (which
    loads its CUDA extensions) is skipped: the indexer-q module needs only its pure-Python `cute.utils`."""
    try:
        return import_kernel_module(name)
    except ImportError as exc:
        if _FLASH_ATTN not in str(exc) or _FLASH_ATTN in sys.modules:
            raise
    import importlib.machinery
    import importlib.util
    import types

    spec = importlib.util.find_spec(_FLASH_ATTN)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"{_FLASH_ATTN} is not installed", fix="install vLLM 0.33.0 with its flash-attention package")
    shell = types.ModuleType(_FLASH_ATTN)
    shell.__path__ = list(spec.submodule_search_locations)
    shell.__spec__ = importlib.machinery.ModuleSpec(_FLASH_ATTN, None, is_package=True)
    shell.__spec__.submodule_search_locations = shell.__path__
    sys.modules[_FLASH_ATTN] = shell
    return import_kernel_module(name)


def resolve_owner(path: str) -> Any:
    try:
        return resolve_object(path, import_module=_import_owner_module)
    except BundleMismatchError as exc:
        raise BuildError(f"vLLM has no CuTeDSL warmup owner {path}: {exc.message}",
                         fix="this nojit's CuTeDSL table is for vLLM 0.33.0; install that version") from None


def warmup_keys(owner: Any, registration: dict[str, Any], vllm_config: Any) -> list[Any]:
    """`JitWarmupRegistry.warmup()`'s rule: vllm_config is passed when the provider takes it."""
    kwargs = dict(registration)
    if "vllm_config" in inspect.signature(owner.get_warmup_keys).parameters:
        kwargs.setdefault("vllm_config", vllm_config)
    return list(owner.get_warmup_keys(**kwargs))


def _modules(names: list[str]) -> list[Any]:
    return [_import_owner_module(name) for name in names]


def tool_versions() -> dict[str, str]:
    """The packages that shape a CuTeDSL object file and load it; the loader compares them."""
    return {tool: package_version(tool) for tool in TOOL_FACTS["cutedsl"]}


def plan(p: Plan, d: Deployment, model: Model, selection: Selection) -> None:
    tables: CuteTables | None = model.tables.get(NAME)
    if tables is None or not d.cutedsl:
        return
    set_arch()
    vllm_config = tables.vllm_config(d)
    for row in tables.owners:
        if not selection.in_groups(row.groups):
            continue
        registrations = row.registrations(d)
        if not registrations:
            continue
        owner = resolve_owner(row.owner)
        keys: list[Any] = []
        for registration in registrations:
            try:
                keys += warmup_keys(owner, registration, vllm_config)
            except NoJitError:
                raise
            except Exception as exc:
                raise BuildError(f"vLLM's get_warmup_keys for {row.owner} failed with {registration or 'no arguments'}: "
                                 f"{type(exc).__name__}: {exc}", fix="check the deployment values") from exc
        if row.owner not in p.kernels:
            module = sys.modules[type(owner).__module__]
            sources = [module.__name__, *row.sources]
            cls = key_class(owner)
            p.add_kernel(row.owner, PlanKernel(
                runtime=NAME, source_hash=source_hash(_modules(sources)),
                params=[f.name for f in fields(cls)] if cls is not None else [],
                info={"owner_class": f"{type(owner).__module__}:{type(owner).__qualname__}", "site": row.site,
                      "sources": sources,
                      "file": os.path.basename(module.__file__), **tool_versions()},
            ))
        for key in keys:
            try:
                key_json = key_to_json(key)
            except ValueError as exc:
                raise BuildError(f"{row.owner}: {exc}", fix="this key cannot be bundled yet; report it to nojit") from None
            p.add(PlanRequest(row.owner, key_json, "exact", f"{row.origin}:{row.owner}"))


def prepare_worker(settings: WorkerSettings) -> None:
    set_arch()
    os.environ.setdefault("CUTE_DSL_CACHE_DIR", os.path.join(settings.cache_dir, "cutedsl"))


def compile_request(request: PlanRequest, kernel_id: str, kernel: PlanKernel, settings: WorkerSettings) -> CompileResult:
    """Runs in a build worker: compile one key with vLLM's owner, export it, return the bundle pieces."""
    owner = resolve_owner(kernel_id)
    data, symbol, options = compile_and_export(owner, kernel_id, request.key)
    sources = kernel.info.get("sources") or [type(owner).__module__]
    return CompileResult(cubin=data, launch=CuteLaunch(symbol, options), source_hash=source_hash(_modules(sources)),
                         kernel_info=tool_versions())


def cache_inputs(request: PlanRequest, kernel: PlanKernel) -> dict[str, Any]:
    """What one key's object file and launch depend on (aot/compile_cache.py): the owner and its key (the
    exported symbol is named after both), the digest of the vLLM modules its kernel body is built from and
    the kernel record's facts (owner class, sources), vLLM itself (the helpers those modules import and the
    compile options), the CuTeDSL, TVM-FFI, quack and torch that compile it, Python (CuTeDSL traces Python),
    the target, and nojit's compile code (this planner, the compiler, the key codec)."""
    return {
        "runtime": NAME,
        "kernel": request.kernel,
        "key": request.key,
        "source_hash": kernel.source_hash,
        "info": {k: kernel.info.get(k) for k in ("owner_class", "sources", "file")},
        "tools": tool_versions(),
        "vllm": package_version("vllm"),
        "torch": package_version("torch"),
        "python": platform.python_version(),
        "target": TARGET.to_json(),
        "compiler": _compiler_code(),
    }


@functools.cache
def _compiler_code() -> str:
    return ",".join(file_sha256(m.__file__) for m in (compiler, cutedsl_key, sys.modules[__name__]))


RUNTIME = Runtime(name=NAME, plan=plan, prepare_worker=prepare_worker, compile=compile_request,
                  cache_inputs=cache_inputs, launch_from_json=launch_reader(CuteLaunch))
