"""Humming in the build: the enumerated kernels into the plan, one kernel's compile in a worker.

A key is what Humming's `compile_many` receives: the kernel class and its constructor arguments
(enumerate.py). The worker constructs that kernel exactly as Humming does, so Humming renders its
CUDA source and compiles it with its own compiler (`NVRTCCompiler`: the `nvrtc_compile` child with the
nvidia-cuda-nvrtc wheel's libnvrtc; no GPU needed), post-processes the cubin (its `patch_cubin`) and
writes it to its own cache (under the build's cache directory, so a rebuild finds it there). Only the
registration with Humming's launcher (a GPU call) is left out. The bundle keeps, per key, the cubin and
what Humming's cache key is made of besides the machine (loader/runtimes/humming/cache.py): compiler class, code,
kernel expression, sm version, fast-math and post-processing flags.

Humming's own cache is safe for parallel workers (a file lock per key, the cubin renamed into place) but
keyed by its headers' mtimes and install paths, so reinstalling the same humming-kernels misses it; the
build's compile cache (cache_inputs: content only) finds those kernels again in the parent, with no worker.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import json
import os
import sys
from typing import Any

from nojit.aot.compile_cache import file_sha256, launch_reader
from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.faces import CompileResult, Model, Runtime, Selection, WorkerSettings
from nojit.aot.plan import Plan, PlanKernel, PlanRequest
from nojit.aot.runtimes.humming import standin
from nojit.aot.runtimes.humming.enumerate import enumerate_kernels
from nojit.aot.target import TARGET
from nojit.loader.runtimes.humming import cache as humming_cache
from nojit.loader.bundle.records.humming import HummingLaunch

NAME = "humming"

# The kernel classes Humming's MoE path constructs (humming.kernel.*): at the first forward, and in the weight
# transform at weight loading; a --kernels selection naming none skips planning.
KERNEL_CLASSES = ("humming.kernel.humming:HummingKernel", "humming.kernel.process_input:ProcessInputKernel",
                  "humming.kernel.process_input:ProcessInputScaleKernel",
                  "humming.kernel.process_mxfp4:ProcessMxfp4W4A8Kernel",
                  "humming.kernel.repack_weight:RepackWeightKernel")
_SITE_FORWARD = "vllm fused_humming_moe.py HummingIndexedExperts -> humming prepare_kernels"
_SITE_TRANSFORM = "vllm quantization/utils/humming/moe.py _prepare_and_transform_sublayer -> humming transform ops"
NVRTC_LIB_DIRS = ("cu13/lib", "cuda_nvrtc/lib")  # under the `nvidia` namespace: where the nvrtc wheels put libnvrtc


def _humming_version() -> str:
    return importlib.metadata.version("humming-kernels")


def _kernel_class(path: str) -> type:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def source_hash(kernel_class: str, headers: str) -> str:
    """The kernel class's module text plus Humming's headers: what the rendered source is made from."""
    cls = _kernel_class(kernel_class)
    with open(importlib.import_module(cls.__module__).__file__, "rb") as f:  # type: ignore[arg-type]
        text = f.read()
    return hashlib.sha256(text + b"\0" + headers.encode() + b"\0" + _humming_version().encode()).hexdigest()


def nvrtc_library_dir() -> str | None:
    """The folder of the nvidia-cuda-nvrtc wheel's libnvrtc-builtins, which the NVRTC child must find."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations if spec else []):
        for sub in NVRTC_LIB_DIRS:
            d = os.path.join(base, sub)
            if os.path.isdir(d) and any(n.startswith("libnvrtc-builtins") for n in os.listdir(d)):
                return d
    return None


def _tools() -> dict[str, Any]:
    from humming.jit.runtime import KernelRuntime

    from nojit.loader.runtimes.humming import cache as humming_cache

    compiler = KernelRuntime._get_compiler()
    return {"humming_version": _humming_version(), "compiler": compiler.__name__,
            "nvrtc": humming_cache.nvrtc_version(compiler), "headers_digest": humming_cache.headers_digest()}


def plan(p: Plan, d: Deployment, model: Model, selection: Selection) -> None:
    tables = model.tables.get(NAME)
    if tables is None or not selection.in_groups(("dsv4",)) or not any(map(selection.wants, KERNEL_CLASSES)):
        return
    layers = tables.experts(d)
    if not layers:
        return
    try:
        import humming  # noqa: F401
    except ImportError:
        raise BuildError("humming-kernels is not installed", fix="install vLLM 0.33.0's humming-kernels (0.1.19)") from None
    specs = enumerate_kernels(d, layers)
    tools = _tools()
    for spec in specs:
        if spec.kernel_class not in p.kernels:
            p.add_kernel(spec.kernel_class, PlanKernel(
                runtime=NAME, source_hash=source_hash(spec.kernel_class, tools["headers_digest"]), params=[],
                info={**tools, "site": _SITE_TRANSFORM if spec.op.startswith("transform:") else _SITE_FORWARD,
                      "device": {"name": d.platform.device_name, "sm_count": d.platform.sm_count}}))
        p.add(PlanRequest(spec.kernel_class, spec.key(), "exact", f"moe:{spec.op}"))


def prepare_worker(settings: WorkerSettings) -> None:
    os.environ["HUMMING_CACHE_DIR"] = os.path.join(settings.cache_dir, "humming")
    os.environ["HUMMING_DISABLE_PARALLEL_BUILD"] = "1"
    lib = nvrtc_library_dir()
    if lib and lib not in os.environ.get("LD_LIBRARY_PATH", "").split(":"):  # read by the NVRTC child at exec
        os.environ["LD_LIBRARY_PATH"] = ":".join(filter(None, [lib, os.environ.get("LD_LIBRARY_PATH")]))


def compile_request(request: PlanRequest, kernel_id: str, kernel: PlanKernel, settings: WorkerSettings) -> CompileResult:
    """Runs in a build worker: construct the kernel as Humming does (which compiles it), return cubin + key parts."""
    device = kernel.info.get("device") or {}
    standin.install(device.get("name", "NVIDIA H200"), (9, 0), int(device.get("sm_count", 132)))
    from humming.jit.runtime import KernelRuntime

    key = request.key
    if not (isinstance(key, dict) and key.get("class") == kernel_id and isinstance(key.get("args"), dict)):
        raise BuildError(f"Humming key {json.dumps(key)[:200]} is not {{class: {kernel_id}, args: {{...}}}}",
                         fix="rebuild the plan with `nojit build`")
    cls = _kernel_class(kernel_id)
    previous = cls.__dict__.get("register_kernel")
    cls.register_kernel = lambda self: None  # the launcher registration needs a GPU; the compile does not
    try:
        obj = cls(**key["args"])
    except Exception as exc:
        raise BuildError(f"Humming could not build {kernel_id} {json.dumps(key['args'])[:300]}: "
                         f"{type(exc).__name__}: {str(exc)[:1500]}",
                         fix="check the nvidia-cuda-nvrtc wheel (libnvrtc-builtins) and humming-kernels 0.1.19") from exc
    finally:
        if previous is None:
            del cls.register_kernel
        else:
            cls.register_kernel = previous
    with open(obj.kernel_filename, "rb") as f:
        cubin = f.read()
    compiler = KernelRuntime._get_compiler()
    launch = HummingLaunch(compiler=compiler.__name__, sm_version=obj.sm_version_str,
                           kernel_expr=getattr(obj, "kernel_expr", None), code=obj.code,
                           disable_fast_math=bool(obj.disable_fast_math), postprocessed=True,
                           kernel_name=_kernel_name(obj.kernel_filename, obj.name))
    tools = _tools()
    return CompileResult(cubin=cubin, launch=launch, source_hash=source_hash(kernel_id, tools["headers_digest"]),
                         tools={"humming-kernels": tools["humming_version"], "humming-nvrtc": tools["nvrtc"]},
                         kernel_info=tools)


def _kernel_name(cubin_path: str, name: str) -> str:
    """The mangled entry Humming's loader picks (runtime.py load_cubin: the one function whose name holds `name`)."""
    from humming.utils.cubin import get_cubin_kernel_names

    matched = [n for n in get_cubin_kernel_names(cubin_path) if name in n]
    if len(matched) != 1:
        raise BuildError(f"{cubin_path}: {len(matched)} kernels named like {name!r}", fix="report it to nojit")
    return matched[0]


def cache_inputs(request: PlanRequest, kernel: PlanKernel) -> dict[str, Any]:
    """What one kernel's cubin and launch depend on (aot/compile_cache.py): the kernel class and its arguments
    (the key), the class module's text with Humming's headers and version (the source digest, taken from the
    installed Humming, not the plan), the compiler Humming picks and its NVRTC, the device Humming is told
    (the stand-in's name and SM count), HUMMING_* settings, the target, and nojit's compile code. No mtimes and
    no paths: a reinstall of the same Humming hits."""
    device = kernel.info.get("device") or {}
    tools = _cache_tools(device.get("name", "NVIDIA H200"), int(device.get("sm_count", 132)))
    return {
        "runtime": NAME,
        "kernel": request.kernel,
        "key": request.key,
        "source_hash": source_hash(request.kernel, tools["headers_digest"]),
        "tools": tools,
        "device": kernel.info.get("device"),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("HUMMING_") and k not in (
            "HUMMING_CACHE_DIR", "HUMMING_DISABLE_PARALLEL_BUILD")},
        "target": TARGET.to_json(),
        "compiler": _compiler_code(),
    }


@functools.cache
def _cache_tools(device_name: str, sm_count: int) -> dict[str, Any]:
    """_tools() in the build's parent: Humming picks its compiler from the device, so the stand-in goes first
    (as in planning and in the worker)."""
    standin.install(device_name, (9, 0), sm_count)
    return _tools()


@functools.cache
def _compiler_code() -> str:
    return ",".join(file_sha256(m.__file__) for m in (standin, humming_cache, sys.modules[__name__]))


RUNTIME = Runtime(name=NAME, plan=plan, prepare_worker=prepare_worker, compile=compile_request,
                  cache_inputs=cache_inputs, launch_from_json=launch_reader(HummingLaunch))
