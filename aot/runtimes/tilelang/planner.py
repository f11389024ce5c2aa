"""TileLang in the build: a model's mHC calls into the plan, and one call's compile in a worker.

Enumeration (enumeration.py) and compilation (compiler.py) are TileLang's own machinery driven
the way vLLM drives it; this module translates between them and the bundle: the key in
tilelang_key's JSON form, the launch schema as a TileLangLaunch, the kernel's source digest,
and the nvcc record (with install paths replaced by placeholders, so the same environment
always yields the same manifest bytes).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nojit.aot.compile_cache import file_sha256, launch_reader
from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.faces import CompileResult, Model, Runtime, Selection, WorkerSettings
from nojit.aot.plan import Plan, PlanKernel, PlanRequest
from nojit.aot.runtimes.tilelang import compiler
from nojit.aot.runtimes.tilelang.compiler import compile_variant
from nojit.aot.runtimes.tilelang.enumeration import Register, TileLangCall, enumerate_mhc_variants, kernel_module, resolve
from nojit.loader.bundle.manifest import TileLangLaunch
from nojit.loader.bundle.tilelang_key import key_to_json, source_hash
from nojit.loader.bundle.versions import installed_version

NAME = "tilelang"


@dataclass(frozen=True)
class TileLangTables:
    """A model's TileLang rows: its warmup registrations on vLLM's mHC owners, per deployment."""

    registrations: Callable[[Deployment], Register]


def plan(p: Plan, d: Deployment, model: Model, selection: Selection) -> None:
    tables: TileLangTables | None = model.tables.get(NAME)
    if tables is None:
        return
    kernel_module()
    for v in enumerate_mhc_variants(tables.registrations(d), d.max_num_batched_tokens, d.platform.deep_gemm):
        phase1, phase2 = v.key
        if phase2 != ():
            raise BuildError(f"{v.kernel}: TileLang phase-2 key {phase2!r} is not empty; nojit cannot key it without "
                             "TileLang", fix="report this kernel to nojit")
        names = tuple(name for name, _ in v.compile_kwargs)
        if v.kernel not in p.kernels:
            jit_impl = resolve(v.kernel)
            fn = jit_impl.func.orig_func
            p.add_kernel(v.kernel, PlanKernel(
                runtime=NAME,
                source_hash=source_hash(fn),
                params=list(jit_impl.signature.parameters),
                info={"owner": v.owner, "tensor_args": sorted(jit_impl.func.tensor_args),
                      "file": os.path.basename(fn.__code__.co_filename)},
            ))
        p.add(PlanRequest(v.kernel, key_to_json(names, phase1), "exact", f"registry:{v.owner}",
                          compile_inputs={"variant": _call_to_json(v)}))


def _call_to_json(v: TileLangCall) -> dict[str, Any]:
    return {"kernel": v.kernel, "key": [list(v.key[0]), list(v.key[1])], "compile_kwargs": [list(kv) for kv in v.compile_kwargs],
            "owner": v.owner, "compile_key": [list(kv) for kv in v.compile_key], "call_args": list(v.call_args),
            "call_kwargs": list(v.call_kwargs), "defaults": [list(kv) for kv in v.defaults]}


def _call_from_json(obj: dict[str, Any]) -> TileLangCall:
    pairs = lambda items: tuple((k, v) for k, v in items)  # noqa: E731
    return TileLangCall(
        kernel=obj["kernel"], key=(tuple(obj["key"][0]), tuple(obj["key"][1])),
        compile_kwargs=pairs(obj["compile_kwargs"]), owner=obj["owner"], compile_key=pairs(obj["compile_key"]),
        call_args=tuple(obj["call_args"]), call_kwargs=tuple(obj["call_kwargs"]), defaults=pairs(obj["defaults"]),
    )


def _portable_flags(flags: list[str]) -> list[str]:
    """nvcc flags with this machine's install paths replaced by placeholders."""
    import tilelang

    roots = {os.path.dirname(os.path.abspath(tilelang.__file__)): "<tilelang>"}
    out = []
    for f in flags:
        for root, name in roots.items():
            f = f.replace(root, name)
        out.append(f)
    return out


def prepare_worker(settings: WorkerSettings) -> None:
    if settings.platform_installed:  # vLLM's mHC module must see the deployment platform before any Triton module loads
        kernel_module()


def compile_request(request: PlanRequest, kernel_id: str, kernel: PlanKernel, settings: WorkerSettings) -> CompileResult:
    """Runs in a build worker: compile one mHC call, return the bundle pieces."""
    call = _call_from_json(request.compile_inputs["variant"])
    compiled = compile_variant(call, os.path.join(settings.cache_dir, "tilelang"))
    record = compiled.compile_record
    fn = resolve(kernel_id).func.orig_func
    return CompileResult(
        cubin=compiled.cubin,
        launch=compiled.launch,
        source_hash=source_hash(fn),
        tools={"nvcc": record["nvcc_version"], "tilelang": record["tilelang_version"]},
        kernel_info={"nvcc_flags": _portable_flags(record["flags"]), "nvcc_version": record["nvcc_version"],
                     "arch": record["arch"], "lineinfo": False, "pass_configs": record["pass_configs"]},
    )


def recorded_inputs(kernel: str, key_json: dict[str, Any]) -> dict[str, Any]:
    """The compile inputs of a TileLang key recorded at serve time (NOJIT_MODE=record)."""
    args = [(name, tagged[1]) for name, tagged in key_json["args"]]
    return {"variant": {"kernel": kernel, "key": [[v for _, v in args], []], "compile_kwargs": [list(a) for a in args],
                        "owner": "recorded", "compile_key": [], "call_args": [], "call_kwargs": [n for n, _ in args],
                        "defaults": []}}


def cache_inputs(request: PlanRequest, kernel: PlanKernel) -> dict[str, Any]:
    """What one mHC variant's cubin and launch plan depend on (aot/compile_cache.py): the kernel's source digest
    and its module file's (helpers and TileLang settings live there), the call (minus who declared it), the
    TileLang, nvcc and vLLM (its TileLang pass configs) that compile it, the target, and nojit's compile code."""
    import tilelang

    call = {k: v for k, v in request.compile_inputs["variant"].items() if k != "owner"}
    return {
        "runtime": NAME,
        "kernel": request.kernel,
        "source_hash": kernel.source_hash,
        "module_sha256": file_sha256(_module_file(request.kernel)),
        "key": request.key,
        "call": call,
        "tilelang": tilelang.__version__,
        "nvcc": compiler.nvcc_version(),
        "vllm": installed_version("vllm"),
        "target": compiler.TILELANG_TARGET,
        "compiler": file_sha256(compiler.__file__),
    }


def _module_file(kernel_id: str) -> str:
    """The source file of the kernel's module, found without importing it (a --from-plan build's parent has
    no deployment platform installed, which vLLM's mHC module needs at import)."""
    import importlib.util

    package, *rest = kernel_id.partition(":")[0].split(".")
    spec = importlib.util.find_spec(package)  # a top-level package: located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"{kernel_id}: package {package} is not installed", fix="install the vLLM the plan names")
    return os.path.join(list(spec.submodule_search_locations)[0], *rest[:-1], rest[-1] + ".py")


RUNTIME = Runtime(name=NAME, plan=plan, prepare_worker=prepare_worker, compile=compile_request,
                  recorded_inputs=recorded_inputs, cache_inputs=cache_inputs,
                  launch_from_json=launch_reader(TileLangLaunch))
