"""FlashInfer in the build: the deployment's JIT modules into the plan, and one module's compile in a worker.

A FlashInfer module is one bundle entry: the kernel id is FlashInfer's gen function ("module:qualname"),
the key the module's name (the file name FlashInfer's AOT lookup asks for), the blob the .so FlashInfer's
builder made, and the source digest covers the module's sources and flags (specs.py).
Both kinds of entry (modules and TensorRT-LLM DeepGEMM cubins) go through the build's compile cache
(cache_inputs), so a rebuild runs neither ninja nor the TensorRT-LLM driver for an entry it built before.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version as package_version
from typing import Any

from nojit.aot.compile_cache import DEFAULT_CACHE_DIR, file_sha256, launch_reader
from nojit.aot.deployment import Deployment
from nojit.aot.faces import CompileResult, Model, Runtime, Selection, WorkerSettings
from nojit.aot.plan import Plan, PlanKernel, PlanRequest
from nojit.aot.runtimes.flashinfer import compiler, specs, trtllm
from nojit.aot.runtimes.flashinfer.compiler import build_root, compile_module, nvcc_release, pip_cuda_dir
from nojit.aot.runtimes.flashinfer.modules import reached_modules
from nojit.aot.runtimes.flashinfer.specs import cuda_architecture, flashinfer_target, make_spec, spec_digest
from nojit.aot.target import TARGET
from nojit.loader.bundle.records.flashinfer import FlashInferLaunch
from nojit.loader.strict.toolchain import find_tool

NAME = "flashinfer"


@dataclass(frozen=True)
class FlashInferTables:
    """A model's FlashInfer rows: the (N, K) of its block-FP8 linears per TP rank (they reach
    fp8_blockscale_gemm_90 for M < 32, and TensorRT-LLM DeepGEMM's kernels inside it)."""

    block_fp8_linears: Callable[[Deployment], list[tuple[int, int]]]


def plan(p: Plan, d: Deployment, model: Model, selection: Selection) -> None:
    tables: FlashInferTables | None = model.tables.get(NAME)
    linears = tables.block_fp8_linears(d) if tables is not None else []
    reached = [m for m in reached_modules(d) if m.name != "fp8_blockscale_gemm_90" or linears]
    if not reached:
        return
    modules = [m for m in reached if selection.wants(m.gen)]
    version = package_version("flashinfer-python")
    capability = tuple(d.platform.capability)
    with flashinfer_target(capability):  # type: ignore[arg-type]
        for m in modules:
            spec = make_spec(m.gen, m.name)
            p.add_kernel(m.gen, PlanKernel(
                runtime=NAME, source_hash=spec_digest(spec, version), params=[],
                info={"module": m.name, "use": m.use, "call_site": m.call_site, "switch": m.switch,
                      "capability": list(capability)},
            ))
            p.add(PlanRequest(m.gen, m.name, "exact", "call-site:" + m.call_site.split(":")[0]))
    if any(m.name == "fp8_blockscale_gemm_90" for m in reached) and selection.wants(trtllm.KERNEL_ID):
        _plan_trtllm(p, d, version, linears, selection.cache_dir or DEFAULT_CACHE_DIR)


def _plan_trtllm(p: Plan, d: Deployment, version: str, linears: list[tuple[int, int]], cache_dir: str) -> None:
    """TensorRT-LLM DeepGEMM's kernels inside fp8_blockscale_gemm_90: one request per (N, K, tile config), the
    configs from FlashInfer's own heuristic run by nojit's driver (built here once, trtllm.py)."""
    shapes = trtllm.shapes(linears)
    if not shapes:
        return
    digest = trtllm.headers_digest(version)
    pip_cuda = pip_cuda_dir()
    root = build_root(cache_dir, cuda_architecture(tuple(d.platform.capability)))  # type: ignore[arg-type]
    exe = trtllm.driver(root, pip_cuda, digest)
    p.add_kernel(trtllm.KERNEL_ID, PlanKernel(
        runtime=NAME, source_hash=digest, params=[],
        info={"kind": "trtllm_deepgemm", "use": "TensorRT-LLM DeepGEMM kernels of the block-FP8 GEMM for M < 32",
              "switch": "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "capability": list(d.platform.capability),
              "sm_count": d.platform.sm_count},
    ))
    for n, k in shapes:
        for key in trtllm.configs(exe, pip_cuda, n, k, d.platform.sm_count):
            p.add(PlanRequest(trtllm.KERNEL_ID, key, "exact", "derived:vllm/utils/flashinfer.py"))


def prepare_worker(settings: WorkerSettings) -> None:
    pass


def compile_request(request: PlanRequest, kernel_id: str, kernel: PlanKernel,
                    settings: WorkerSettings) -> CompileResult:
    capability = tuple(kernel.info["capability"])
    if kernel.info.get("kind") == "trtllm_deepgemm":
        return _compile_trtllm(request, kernel, settings, capability)  # type: ignore[arg-type]
    data, info = compile_module(kernel_id, request.key, capability, settings.cache_dir)  # type: ignore[arg-type]
    return CompileResult(cubin=data, launch=FlashInferLaunch(request.key), source_hash=info.pop("spec_sha256"),
                         kernel_info=info)


def _compile_trtllm(request: PlanRequest, kernel: PlanKernel, settings: WorkerSettings,
                    capability: tuple[int, int]) -> CompileResult:
    version = package_version("flashinfer-python")
    arch = cuda_architecture(capability)
    pip_cuda = pip_cuda_dir()
    digest = trtllm.headers_digest(version)
    exe = trtllm.driver(build_root(settings.cache_dir, arch), pip_cuda, digest)
    name, cubin = trtllm.compile_config(exe, pip_cuda, request.key)  # type: ignore[arg-type]
    nvcc = find_tool("nvcc")
    return CompileResult(cubin=cubin, launch=FlashInferLaunch(name, kind="trtllm_deepgemm"), source_hash=digest,
                         kernel_info={"flashinfer_version": version, "cuda_arch": arch,
                                      "nvcc": nvcc_release(nvcc) if nvcc else None})


def cache_inputs(request: PlanRequest, kernel: PlanKernel) -> dict[str, Any] | None:
    """What one entry depends on (aot/compile_cache.py): the kernel and its key (the module, or the (N, K), tile
    config and M range), the
    source digest (a module's sources and flags with FlashInfer's version, specs.py; or the TensorRT-LLM
    DeepGEMM headers and nojit's driver, trtllm.py), the kernel record's facts (capability, SM count: the tile
    config the heuristic picks), the toolchain (nvcc's release, the host compiler, the TVM-FFI headers, torch
    and the pip CUDA it pins, the FLASHINFER_* / TRTLLM_DG_* / CXX settings), the target, and nojit's
    compile code. None (not cached) where the parent finds no nvcc: the compile fails then anyway."""
    toolchain = _toolchain()
    if toolchain is None:
        return None
    return {
        "runtime": NAME,
        "kernel": request.kernel,
        "key": request.key,
        "source_hash": kernel.source_hash,
        "info": {k: v for k, v in kernel.info.items() if k in ("capability", "sm_count", "kind", "module")},
        "flashinfer": package_version("flashinfer-python"),
        "toolchain": toolchain,
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith(("FLASHINFER_", "TRTLLM_DG_")) or k == "CXX"},
        "target": TARGET.to_json(),
        "compiler": _compiler_code(),
    }


def _toolchain() -> dict[str, Any] | None:
    return compiler.toolchain()


@functools.cache
def _compiler_code() -> str:
    return ",".join(file_sha256(m.__file__) for m in (compiler, specs, trtllm, sys.modules[__name__]))


RUNTIME = Runtime(name=NAME, plan=plan, prepare_worker=prepare_worker, compile=compile_request,
                  cache_inputs=cache_inputs, launch_from_json=launch_reader(FlashInferLaunch))
