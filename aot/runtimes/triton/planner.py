"""Triton in the build: a model's owner and derived rows into the plan, generic entries, one key's compile.

Keys come from vLLM's own warmup code and Triton's own binder (enumeration.py); a worker
compiles each key for sm_90a with the installed Triton (compiler.py) and returns its
TritonLaunch. Generic entries per (kernel, constexpr/dtype/None combination) are added here
because only Triton's keys carry the divisibility marks they relax.
"""

from __future__ import annotations

import functools
from typing import Any

from nojit.aot.compile_cache import file_sha256, launch_reader
from nojit.aot.deployment import Deployment
from nojit.aot.faces import CompileResult, Model, Runtime, Selection, WorkerSettings
from nojit.aot.plan import Plan, PlanKernel, PlanRequest
from nojit.aot.runtimes.triton import compiler as compiler_module
from nojit.aot.runtimes.triton.compiler import compile_key, install_offline_driver, offline_driver, ptxas_version
from nojit.aot.target import TARGET
from nojit.aot.runtimes.triton.autotune import merge_tuning
from nojit.aot.runtimes.triton.enumeration import (
    TritonRequest,
    dedupe,
    enumerate_derived,
    enumerate_owner,
    enumerate_site,
    record_source_parts,
    kernel_info,
)
from nojit.aot.runtimes.triton.rows import TritonTables
from nojit.aot.runtimes.triton.sources import load_source_map, resolve_kernel
from nojit.loader.resolve import jit_function_of
from nojit.loader.bundle.manifest import TritonLaunch
from nojit.loader.bundle.versions import installed_version
from nojit.loader.bundle.triton_key import generic_spec, key_from_json, key_to_json, layout_spec, runtime_params

NAME = "triton"
GENERIC_ORIGIN = "fallback"  # the stored origin of generic entries: renaming it would change every bundle's bytes


def plan(p: Plan, d: Deployment, model: Model, selection: Selection) -> None:
    tables: TritonTables | None = model.tables.get(NAME)
    if tables is None:
        return
    with offline_driver():
        vllm_config = tables.vllm_config(d)
        for row in tables.owners:
            if selection.in_groups(row.groups) and selection.wants(row.kernel):
                add_requests(p, enumerate_owner(row, d, vllm_config), row.owner, row.site)
        for derived in tables.derived:
            if selection.in_groups(derived.groups) and selection.wants(derived.kernel):
                add_requests(p, enumerate_derived(derived, d), None, derived.site)
        for site in tables.sites:
            if selection.in_groups(site.groups) and any(selection.wants(k) for k in site.kernels):
                wanted = [r for r in enumerate_site(site, d) if selection.wants(r.kernel)]
                add_requests(p, wanted, None, site.site)


def add_requests(p: Plan, requests: list[TritonRequest], owner: str | None, site: str) -> None:
    """Enumerated requests into the plan: each kernel described once, each exact key once, and each
    autotuned call's tuning key mapped to its configs in the kernel's info."""
    for r in dedupe(requests):
        if r.kernel not in p.kernels:
            info = kernel_info(jit_function_of(resolve_kernel(r.kernel, None)), owner, site)
            p.add_kernel(r.kernel, PlanKernel(NAME, info.source_hash, list(info.params), info.info))
        p.add(PlanRequest(r.kernel, key_to_json(r.key), "exact", r.origin, r.sample))
        if r.tuning is not None:  # one of an autotuned kernel's configs: the manifest maps its tuning key
            merge_tuning(p.kernels[r.kernel].info, r.tuning)


def add_generic_variants(p: Plan) -> int:
    """Generic entries per distinct (kernel, constexpr/dtype/None combination): one laid out as
    each divisibility pattern of its exact keys (bit-identical to the JIT on such calls) and one
    with no marks at all (Triton's own cubin for a call with nothing specialized)."""
    added = 0
    for r in list(p.requests):
        k = p.kernels[r.kernel]
        if k.runtime != NAME or r.variant != "exact":
            continue
        spec, options = key_from_json(r.key)
        runtime_param = runtime_params(k.info, len(spec))
        for generic in (layout_spec(spec, runtime_param), generic_spec(spec, runtime_param)):
            added += p.add(PlanRequest(r.kernel, key_to_json((generic, options)), "generic", GENERIC_ORIGIN))
    return added


def use_source_map_hashes(p: Plan, source_map_path: str) -> None:
    """With --kernel-sources the compiled source is the map's, so its digest is the one that counts."""
    source_map = load_source_map(source_map_path)
    for kid, k in p.kernels.items():
        if k.runtime == NAME:
            fn = jit_function_of(resolve_kernel(kid, source_map))
            k.source_hash = fn.cache_key
            record_source_parts(fn, k.info)


_source_map: dict[str, Any] = {}


def prepare_worker(settings: WorkerSettings) -> None:
    install_offline_driver()
    _source_map["map"] = load_source_map(settings.kernel_sources) if settings.kernel_sources else None


def compile_request(request: PlanRequest, kernel_id: str, kernel: PlanKernel, settings: WorkerSettings) -> CompileResult:
    """Runs in a build worker: compile one key."""
    fn = jit_function_of(resolve_kernel(kernel_id, _source_map.get("map")))
    compiled = compile_key(fn, key_from_json(request.key), divisibility_assumed=request.variant == "exact")
    return CompileResult(cubin=compiled.cubin, launch=compiled.launch, source_hash=fn.cache_key,
                         tools={"ptxas": compiled.ptxas_version})


def cache_inputs(request: PlanRequest, kernel: PlanKernel) -> dict[str, Any]:
    """What one key's cubin and launch depend on (aot/compile_cache.py): the kernel's source digest (Triton's
    cache_key: its source and its dependencies'), the key (specialization and options), exact or generic, the
    Triton and ptxas that compile it, the target, and nojit's compile code."""
    return {
        "runtime": NAME,
        "kernel": request.kernel,
        "source_hash": kernel.source_hash,
        "key": request.key,
        "variant": request.variant,
        "triton": installed_version("triton"),
        "ptxas": ptxas_version(),
        "target": TARGET.to_json(),
        "compiler": _compiler_code(),
        "env": _compile_env(),
    }


def _compile_env() -> dict[str, str]:
    """The environment variables Triton itself says change a compile (its own cache key takes them)."""
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return {str(k): str(v) for k, v in sorted(get_cache_invalidating_env_vars().items())}


@functools.cache
def _compiler_code() -> str:
    from nojit.loader.bundle import triton_key

    return ",".join(file_sha256(m.__file__) for m in (compiler_module, triton_key))


RUNTIME = Runtime(name=NAME, plan=plan, prepare_worker=prepare_worker, compile=compile_request,
                  add_generic=add_generic_variants, use_source_map=use_source_map_hashes,
                  cache_inputs=cache_inputs, launch_from_json=launch_reader(TritonLaunch))
