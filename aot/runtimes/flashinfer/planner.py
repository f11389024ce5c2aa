"""FlashInfer in the build: the deployment's JIT modules into the plan, and one module's compile in a worker.

A FlashInfer module is one bundle entry: the kernel id is FlashInfer's gen function ("module:qualname"),
the key the module's name (the file name FlashInfer's AOT lookup asks for), the blob the .so FlashInfer's
builder made, and the source digest covers the module's sources and flags (specs.py).
"""

from __future__ import annotations

from importlib.metadata import version as package_version

from nojit.aot.deployment import Deployment
from nojit.aot.faces import CompileResult, Model, Runtime, Selection, WorkerSettings
from nojit.aot.plan import Plan, PlanKernel, PlanRequest
from nojit.aot.runtimes.flashinfer.compiler import compile_module
from nojit.aot.runtimes.flashinfer.modules import reached_modules
from nojit.aot.runtimes.flashinfer.specs import flashinfer_target, make_spec, spec_digest
from nojit.loader.flashinfer_serving import FlashInferLaunch

NAME = "flashinfer"


def plan(p: Plan, d: Deployment, model: Model, selection: Selection) -> None:
    modules = [m for m in reached_modules(d) if selection.wants(m.gen)]
    if not modules:
        return
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


def prepare_worker(settings: WorkerSettings) -> None:
    pass


def compile_request(request: PlanRequest, kernel_id: str, kernel: PlanKernel,
                    settings: WorkerSettings) -> CompileResult:
    capability = tuple(kernel.info["capability"])
    data, info = compile_module(kernel_id, request.key, capability, settings.cache_dir)  # type: ignore[arg-type]
    return CompileResult(cubin=data, launch=FlashInferLaunch(request.key), source_hash=info.pop("spec_sha256"),
                         kernel_info=info)


RUNTIME = Runtime(name=NAME, plan=plan, prepare_worker=prepare_worker, compile=compile_request)
