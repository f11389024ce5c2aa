"""FlashInfer's JIT modules served from the bundle through FlashInfer's own AOT lookup.

FlashInfer 0.7.2.post1 loads a module from an AOT provider before it would build it: at import,
flashinfer/jit/env.py asks the `flashinfer_jit_cache` package for its providers (env.py:190-242:
`get_jit_cache_providers()`, each with a `jit_cache_dir`, its CUDA architectures and module names,
version-checked against FlashInfer's), and for every module `get_aot_artifacts(name)` (env.py:296-328)
takes `<jit_cache_dir>/<name>/<name>.so` from a provider that lists the module and whose architecture
runs on the GPU; `JitSpecNvcc.try_load` (jit/core.py:536-570) then loads it with tvm_ffi and
`build_and_load` (jit/core.py:337-358) never reaches `build()`, ninja or nvcc.

nojit is that provider. install() writes the bundle's .so files once into a directory in that layout
(named by the digest of its entries, under NOJIT_FLASHINFER_DIR or <runtime dir>/flashinfer, a folder only
this user can write; each file sha256-checked against the bundle on its descriptor every time, left
read-only), and puts a `flashinfer_jit_cache` module into sys.modules whose only provider is that
directory (plus the providers of a real flashinfer-jit-cache package, if one is installed). FlashInfer
finds it with its own `importlib.util.find_spec` when it is imported later; if FlashInfer was imported
first, its own `_get_aot_providers()` is run again. Nothing of FlashInfer is imported at install.

A module the bundle does not hold goes to `JitSpecNvcc.build` (jit/core.py:577): patched when
FlashInfer's core module loads, it raises KernelNotInBundleError in strict mode (naming the module and
how to add it), and records it in record mode before FlashInfer builds it.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import sys
import threading
import types
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.bundle.records.flashinfer import KINDS, FlashInferLaunch  # noqa: F401 (the runtime's record)
from nojit.loader.errors import BundleCorruptError, BundleError, BundleMismatchError, KernelNotInBundleError
from nojit.loader.private_dir import PrivateDir, open_private
from nojit.loader.settings import Mode

log = logging.getLogger("nojit")

SHIM = "flashinfer_jit_cache"
TRTLLM = "tensorrt_llm"
PROVIDER_ID = "nojit"


@dataclass
class FlashInferServing:
    """What install() did: the provider directory, the modules it holds and the builds it saw."""

    root: str
    modules: dict[str, str]  # module name -> kernel id (FlashInfer's gen function)
    version: str
    architecture: str
    cuda_release: str | None  # "13.0": what `nvcc --version` said on the build box
    gpu_archs: tuple[str, ...] | None  # what `nvcc --list-gpu-arch` said there
    trtllm: dict[str, str] = field(default_factory=dict)  # TensorRT-LLM DeepGEMM cache entry -> kernel id
    builds: list[str] = field(default_factory=list)  # modules FlashInfer went to build (refused in strict mode)


_lock = threading.Lock()
_current: FlashInferServing | None = None


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return None


def install(bundle: Any, kernel_ids: list[str], policy: Any) -> FlashInferServing | None:
    """Seed the provider directory, register it with FlashInfer and watch FlashInfer's build path. None where
    FlashInfer is not installed: nothing in the process can reach its modules."""
    global _current
    records = [bundle.index.kernels[k] for k in kernel_ids]
    versions = {r.info.get("flashinfer_version") for r in records}
    arches = {r.info.get("cuda_arch") for r in records}
    if len(versions) != 1 or len(arches) != 1 or None in versions | arches:
        raise BundleCorruptError(f"{bundle.path}: FlashInfer modules disagree on (or lack) the FlashInfer version or "
                                 f"the architecture they were built for ({sorted(map(str, versions | arches))})",
                                 fix="rebuild the bundle with `nojit build`")
    version, arch = versions.pop(), arches.pop()
    release = re.search(r"release (\d+\.\d+),", " ".join(str(r.info.get("nvcc", "")) for r in records))
    here = installed_version()
    if here is None:
        log.info("nojit: FlashInfer is not installed here; the bundle's %d FlashInfer entries are not needed",
                 len(kernel_ids))
        return None
    if here != version:
        raise BundleMismatchError(
            f"{bundle.path}: its FlashInfer modules were built by FlashInfer {version}, this process has "
            f"{here}",
            fix=f"install flashinfer-python=={version} (what vLLM requires), or rebuild the bundle against the "
                "installed FlashInfer with `nojit build`")
    wanted = set(kernel_ids)
    entries = {e.launch.module: e for k in sorted(wanted) for e in bundle.entries(k)}
    root = seed(bundle, entries)
    modules = {n: e.kernel for n, e in entries.items() if e.launch.kind == "module"}
    cubins = {n: e.kernel for n, e in entries.items() if e.launch.kind == "trtllm_deepgemm"}
    if cubins:
        # TensorRT-LLM DeepGEMM reads the variable once, when fp8_blockscale_gemm_90 loads (compiler.cuh:65-79)
        before = os.environ.get("TRTLLM_DG_CACHE_DIR")
        os.environ["TRTLLM_DG_CACHE_DIR"] = os.path.join(root, TRTLLM)
        if before and before != os.environ["TRTLLM_DG_CACHE_DIR"]:
            log.warning("nojit: TRTLLM_DG_CACHE_DIR=%s replaced by %s, where the bundle's %d TensorRT-LLM DeepGEMM "
                        "kernels are", before, os.environ["TRTLLM_DG_CACHE_DIR"], len(cubins))
    elif "fp8_blockscale_gemm_90" in modules:
        # Loading that module creates TensorRT-LLM DeepGEMM's cache folders (its Compiler singleton, built at
        # static initialization: compiler.cuh:476-482), under $HOME unless TRTLLM_DG_CACHE_DIR is set; a
        # read-only HOME would abort the process there.
        # An operator's TRTLLM_DG_CACHE_DIR must pass the same checks: TensorRT-LLM loads cubins from it.
        trtllm_dir = os.environ.get("TRTLLM_DG_CACHE_DIR") or os.path.join(os.path.dirname(root), TRTLLM)
        open_private(trtllm_dir).close()
        os.environ["TRTLLM_DG_CACHE_DIR"] = os.path.abspath(trtllm_dir)
    archs = next((tuple(r.info["nvcc_gpu_archs"]) for r in records if isinstance(r.info.get("nvcc_gpu_archs"), list)),
                 None)
    serving = FlashInferServing(root, modules, version, arch, release.group(1) if release else None, archs, cubins)
    with _lock:
        _register_provider(serving, bundle.path)
        _current = serving
    watch_builds(policy)
    return serving


def current() -> FlashInferServing | None:
    return _current


# ------------------------------------------------------------------------------------------------ seeding
def default_base() -> str:
    """NOJIT_FLASHINFER_DIR, else <runtime dir>/flashinfer: a folder only this user can write (private_dir)."""
    given = os.environ.get("NOJIT_FLASHINFER_DIR")
    if given:
        return os.path.abspath(given)
    from nojit.loader.strict.firewall import runtime_dir

    return os.path.join(runtime_dir(), "flashinfer")


def _root_for(entries: dict[str, Any], base: str | None) -> str:
    digest = hashlib.sha256(json.dumps(sorted((n, e.blob) for n, e in entries.items())).encode()).hexdigest()
    return os.path.join(os.path.abspath(base) if base else default_base(), digest[:24])


def seed(bundle: Any, entries: dict[str, Any], base: str | None = None) -> str:
    """Every entry where FlashInfer looks for it: <root>/<module>/<module>.so, and TensorRT-LLM DeepGEMM's
    <root>/tensorrt_llm/cache/<name>/nvcc_kernel.cubin. Every folder on the way is one only this user can
    write, and each file is written (O_EXCL temporary, then rename) and checked against the bundle's digest
    on its descriptor every time (loader/private_dir.py), so what FlashInfer's dlopen and TensorRT-LLM's
    read find by path is what was checked; files 0444, their folders 0555. Idempotent across ranks."""
    root = _root_for(entries, base)
    with open_private(root) as top:
        for name, entry in sorted(entries.items()):
            if entry.launch.kind == "module":
                _place(bundle, entry, name, top, name, f"{name}.so", root)
            else:
                _place(bundle, entry, name, top, f"{TRTLLM}/cache/{name}", "nvcc_kernel.cubin", root)
        if any(e.launch.kind == "trtllm_deepgemm" for e in entries.values()):
            top.descend(f"{TRTLLM}/tmp").close()  # its Compiler creates it at load anyway
    return root


def _place(bundle: Any, entry: Any, name: str, top: PrivateDir, folder_rel: str, file_name: str, root: str) -> None:
    path = os.path.join(root, folder_rel, file_name)
    try:
        with top.descend(folder_rel) as folder:
            found = folder.sha256(file_name)
            if found == entry.blob:
                return
            if found is not None:
                raise BundleCorruptError(f"{path} is not the FlashInfer entry {name} of {bundle.path} (sha256 differs)",
                                         fix=f"delete {root} (nojit writes it again at the next start)")
            data = bundle.read_blob(entry.blob)  # checked against its sha256 by the bundle reader
            if folder.write(file_name, data, 0o444) != entry.blob:
                raise BundleCorruptError(f"{path}: written, but it does not read back as the bundle's entry {name}",
                                         fix=f"check the disk under {root}")
            folder.chmod(0o555)
    except OSError as exc:
        raise BundleError(f"cannot write FlashInfer entry {name} to {path}: {exc.strerror}",
                          fix="set NOJIT_FLASHINFER_DIR to a writable directory (or delete a stale one)") from None


# ------------------------------------------------------------------------------------------------ provider
def _register_provider(serving: FlashInferServing, bundle_path: str) -> None:
    ours = types.SimpleNamespace(
        provider_id=PROVIDER_ID, distribution=f"nojit bundle {os.path.basename(bundle_path)}", version=serving.version,
        jit_cache_dir=serving.root, cuda_architectures=(serving.architecture,), modules=tuple(sorted(serving.modules)))
    real = None
    present = sys.modules.get(SHIM)
    if present is not None and getattr(present, "__nojit__", False):
        real = present.__nojit_real__
    elif present is not None:
        real = present
    elif importlib.util.find_spec(SHIM) is not None:  # a flashinfer-jit-cache package is installed too
        real = importlib.import_module(SHIM)
    shim = types.ModuleType(SHIM, "nojit: FlashInfer modules served from a nojit bundle (loader/runtimes/flashinfer/serving.py)")
    shim.__spec__ = importlib.machinery.ModuleSpec(SHIM, None, origin=f"nojit bundle {bundle_path}")
    shim.__version__ = getattr(real, "__version__", serving.version)
    if real is not None:
        ours.version = shim.__version__  # FlashInfer wants provider and shim versions equal (env.py:174-187)
    shim.__nojit__ = True
    shim.__nojit_real__ = real
    shim.get_jit_cache_providers = lambda: [*(real.get_jit_cache_providers() if real is not None else ()), ours]
    sys.modules[SHIM] = shim
    env = sys.modules.get("flashinfer.jit.env")
    if env is not None:  # FlashInfer was imported before nojit: let it discover its providers again
        env.FLASHINFER_AOT_PROVIDERS = env._get_aot_providers()
        env.FLASHINFER_AOT_DIRS = (env.FLASHINFER_AOT_DIR,) + tuple(
            p.jit_cache_dir for p in env.FLASHINFER_AOT_PROVIDERS)


def uninstall() -> None:
    """Tests: take the provider away (FlashInfer keeps what it already discovered)."""
    global _current
    with _lock:
        shim = sys.modules.get(SHIM)
        if shim is not None and getattr(shim, "__nojit__", False):
            if shim.__nojit_real__ is not None:
                sys.modules[SHIM] = shim.__nojit_real__
            else:
                del sys.modules[SHIM]
        _current = None
    _watch["policy"] = None


# ------------------------------------------------------------------------------------------------ builds
_watch: dict[str, Any] = {"policy": None, "patched": False, "hook": False}
CORE = "flashinfer.jit.core"


def _fix(name: str) -> str:
    return (f"FlashInfer module {name} is not in the bundle: if the deployment reaches it, add a row for it to "
            "aot/runtimes/flashinfer/modules.py and rebuild (`nojit build`); or switch the vLLM path off "
            "(VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER=0, VLLM_ALLREDUCE_USE_FLASHINFER=0, VLLM_USE_FLASHINFER_SAMPLER=0); "
            "or run NOJIT_MODE=record / permissive to let FlashInfer build it")


def _on_build(spec: Any) -> None:
    """Called where FlashInfer is about to build `spec` (its module is not served from the bundle)."""
    policy = _watch["policy"]
    serving = _current
    if policy is None or serving is None:
        return
    name = str(getattr(spec, "name", spec))
    serving.builds.append(name)
    kernel = serving.modules.get(name, f"flashinfer.jit:{name}")
    policy.counts[(kernel, "miss")] += 1
    if policy.recorder is not None:
        policy.recorder.record(kernel, "flashinfer", name, "miss", "")
    if policy.mode is Mode.STRICT:
        why = ("the bundle holds it, but FlashInfer did not load it (see FlashInfer's warning above: the .so did "
               "not load on this machine)") if name in serving.modules else "the bundle does not hold it"
        raise KernelNotInBundleError(kernel, f"{name} ({why}; FlashInfer was about to compile it)",
                                     policy.bundle_path, fix=_fix(name))


def _patch_core() -> None:
    if _watch["patched"]:
        return
    core = sys.modules[CORE]
    _answer_cuda_version(sys.modules["flashinfer.jit.cpp_ext"])
    cls = core.JitSpecNvcc
    original = cls.build

    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        _on_build(self)
        return original(self, *args, **kwargs)

    build.__wrapped__ = original  # type: ignore[attr-defined]
    cls.build = build
    _watch["patched"] = True


def _answer_cuda_version(cpp_ext: Any) -> None:
    """FlashInfer's gen functions ask nvcc, in a process, even when the module then loads from the bundle:
    `nvcc --version` for the CUDA release (is_cuda_version_at_least, e.g. jit/gemm/fp8_blockscale.py:16) and
    `nvcc --list-gpu-arch` (compilation_context.py:55-68, via get_nvcc_flags_list for the comm modules). The
    answers are the bundle's: what the nvcc that built the modules printed."""
    serving = _current
    if serving is None:
        return
    if serving.cuda_release is not None:
        from packaging.version import Version

        release = Version(serving.cuda_release)
        cpp_ext.get_cuda_version = lambda: release
    context = sys.modules.get("flashinfer.compilation_context")
    if serving.gpu_archs is not None and context is not None:
        supports_sm107 = "compute_107" in serving.gpu_archs
        context._nvcc_supports_sm107 = lambda: supports_sm107


def watch_builds(policy: Any) -> None:
    _watch["policy"] = policy
    if CORE in sys.modules:
        _patch_core()
    elif not _watch["hook"]:
        from nojit.loader.strict.guards import RunAfterImport  # patches FlashInfer's build path when jit.core loads

        sys.meta_path.insert(0, RunAfterImport(lambda name: name == CORE and not _watch["patched"], _patch_core))
        _watch["hook"] = True
