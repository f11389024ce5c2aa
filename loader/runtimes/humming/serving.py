"""Humming's MoE kernels served from the bundle through Humming's own cache lookup.

vLLM's Humming experts ask Humming for their kernels at the first forward: `HummingKernel.prepare_kernels`
and `ProcessInputKernel.prepare_kernels` construct one kernel object per tuning interval through
`KernelRuntime.compile_many` (humming/jit/runtime.py), and each object's `prepare()` calls
`Compiler.compile(code, ...)`, which returns `$HUMMING_CACHE_DIR/<key>/kernel.cubin` when it exists and otherwise
starts the NVRTC child. Humming's key holds this machine's header mtimes, install paths and NVRTC version, so
the bundle carries what the key is made of and the seed (loader/runtimes/humming/cache.py) lets this process's Humming
compute it and write its own layout with the bundled cubin. Humming then finds every bundled kernel by its
own lookup: no process, no compile.

When is it seeded: once `humming.jit.runtime` is imported (at install when it already is). The cache is a
folder of nojit's per bundle (`NOJIT_HUMMING_DIR`, default `<runtime dir>/humming/<digest>`), which
`HUMMING_CACHE_DIR` points at, so Humming's lookups see bundled kernels only; it and Humming's tmp folder
(`HUMMING_TMP_DIR`, default beside it, with the `module/` folder Humming imports from) are folders only this
user can write (loader/private_dir.py).

A kernel the bundle lacks is caught where Humming is about to construct it (`KernelRuntime.__new__` gets the
kernel class and its arguments, the bundle's key, whether `compile_many` constructs it at the first forward or
the weight transform's ops construct it directly at weight loading): strict mode raises KernelNotInBundleError
naming the kernel, its shape and configuration and how to add it; record mode records the key (for
`nojit build --add-keys`) and lets Humming compile. Humming's compile step stays guarded in strict mode (loader/strict/guards.py) behind this.
"""

from __future__ import annotations

import enum
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.bundle.records.humming import COMPILERS, HummingLaunch  # noqa: F401 (the runtime's record)
from nojit.loader.errors import BundleCorruptError, BundleMismatchError
from nojit.loader.private_dir import open_private

log = logging.getLogger("nojit")

NAME = "humming"
RUNTIME_MODULE = "humming.jit.runtime"


# ------------------------------------------------------------------------------------------------ keys
def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def json_value(value: Any) -> Any:
    """Humming's constructor arguments as JSON: enums by value, dtypes by name, tuples as lists."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # humming.dtypes.DataType: its name, which Humming's constructors parse back


def kernel_key(cls: type, args: dict[str, Any]) -> dict[str, Any]:
    """The bundle key of a kernel Humming constructs: its class and its arguments."""
    return {"class": class_path(cls), "args": json_value(dict(args))}


def canonical(key: Any) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"))


def describe(key: dict[str, Any]) -> str:
    """Shape and configuration of a key, for messages."""
    a = key.get("args", {})
    cls = str(key.get("class", "?")).rpartition(":")[2]
    if "shape_n" in a:
        shape = f"N={a.get('shape_n')} K={a.get('shape_k')} experts={a.get('num_experts')} " \
                f"{a.get('a_dtype')}x{a.get('b_dtype')} {a.get('gemm_type')}"
        config = f"block {a.get('block_shape')} warp {a.get('warp_shape')} stages {a.get('num_stages')} " \
                 f"stream_k {a.get('use_stream_k')} warp_spec {a.get('use_warp_spec')}"
    elif "hidden_size" not in a:  # the weight transform's kernels (RepackWeightKernel, ProcessMxfp4W4A8Kernel)
        return f"{cls} {json.dumps(a, sort_keys=True)[:300]}"
    else:
        shape = f"hidden={a.get('hidden_size')} {a.get('input_dtype')}->{a.get('quant_dtype')} " \
                f"group {a.get('quant_group_size')} activation {a.get('activation_type')} layout {a.get('layout')}"
        config = f"threads {a.get('threads_per_task')} values {a.get('values_per_thread')} " \
                 f"tokens {a.get('tokens_per_block')} phase {a.get('quantization_phase')}"
    return f"{cls} {shape}; config {config}"


# ------------------------------------------------------------------------------------------------ serving
@dataclass
class HummingServing:
    """What install() did: the cache folder, the bundled keys, what was seeded and what Humming asked for."""

    cache_dir: str
    entries: dict[str, Any]  # canonical key -> Entry
    headers_digest: str
    nvrtc: str
    bundle_path: str
    source_hashes: dict[str, str]  # kernel class -> the bundle's source digest (recorded keys carry it)
    seeded: list[str] = field(default_factory=list)  # paths Humming will find
    hits: int = 0
    misses: list[str] = field(default_factory=list)
    checked: set[str] = field(default_factory=set)  # keys already served or handed to the policy


_current: HummingServing | None = None
_state: dict[str, Any] = {"policy": None, "bundle": None, "hook": False, "original": None}
_lock = threading.Lock()


def installed_version() -> str | None:
    try:
        return importlib.metadata.version("humming-kernels")
    except importlib.metadata.PackageNotFoundError:
        return None


def default_base() -> str:
    """NOJIT_HUMMING_DIR, else <runtime dir>/humming: a folder only this user can write (private_dir)."""
    base = os.environ.get("NOJIT_HUMMING_DIR")
    if not base:
        from nojit.loader.strict.firewall import runtime_dir

        base = os.path.join(runtime_dir(), "humming")
    return os.path.abspath(base)


def _cache_dir(entries: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(sorted(e.blob for e in entries.values())).encode()).hexdigest()[:16]
    return os.path.join(default_base(), digest)


def _private_folders(cache_dir: str) -> str:
    """Humming's cache and its tmp folder (HUMMING_TMP_DIR, default beside the cache) with the `module/` folder
    Humming puts on sys.path and imports from, and its `lock/` folder: each made or opened as a folder only
    this user can write (loader/private_dir.py), so nothing another user plants there is loaded or imported.
    Returns the tmp folder."""
    tmp = os.environ.get("HUMMING_TMP_DIR") or os.path.join(os.path.dirname(cache_dir), "tmp")
    open_private(cache_dir).close()
    with open_private(tmp) as folder:
        folder.child("module").close()
        folder.child("lock").close()
    return os.path.abspath(tmp)


def install(bundle: Any, kernel_ids: list[str], policy: Any) -> HummingServing | None:
    """Point Humming's cache at a folder of nojit's, seeded (now, or when Humming's runtime is imported) with the
    bundle's kernels under the keys this process's Humming computes. None where Humming is not installed."""
    global _current
    records = [bundle.index.kernels[k] for k in kernel_ids]
    built = {(r.info.get("humming_version"), r.info.get("headers_digest"), r.info.get("nvrtc")) for r in records}
    if len(built) != 1 or None in next(iter(built)):
        raise BundleCorruptError(f"{bundle.path}: Humming kernels disagree on (or lack) the humming-kernels version, "
                                 f"headers digest or NVRTC version they were built with", fix="rebuild with `nojit build`")
    version, headers, nvrtc = built.pop()
    here = installed_version()
    if here is None or importlib.util.find_spec("humming") is None:
        log.info("nojit: humming-kernels is not installed here; the bundle's Humming entries are not needed")
        return None
    if here != version:
        raise BundleMismatchError(f"{bundle.path}: its Humming kernels were built by humming-kernels {version}, this "
                                  f"process has {here}",
                                  fix=f"install humming-kernels=={version} (what vLLM requires), or rebuild the bundle")
    entries = {canonical(e.key): e for k in sorted(kernel_ids) for e in bundle.entries(k)}
    serving = HummingServing(_cache_dir(entries), entries, headers, nvrtc, bundle.path,
                             {r.id: r.source_hash for r in records})
    previous = os.environ.get("HUMMING_CACHE_DIR")
    if previous and os.path.abspath(previous) != os.path.abspath(serving.cache_dir):
        log.warning("nojit: HUMMING_CACHE_DIR=%s replaced by %s, where the bundle's %d Humming kernels are", previous,
                    serving.cache_dir, len(entries))
    tmp = _private_folders(serving.cache_dir)
    os.environ["HUMMING_CACHE_DIR"] = serving.cache_dir
    os.environ["HUMMING_TMP_DIR"] = tmp
    with _lock:
        _current = serving
        _state.update(policy=policy, bundle=bundle)
    if RUNTIME_MODULE in sys.modules:
        activate()
    elif not _state["hook"]:
        from nojit.loader.strict.guards import RunAfterImport

        sys.meta_path.insert(0, RunAfterImport(lambda name: name == RUNTIME_MODULE, activate))
        _state["hook"] = True
    return serving


def current() -> HummingServing | None:
    return _current


def activate() -> None:
    """Humming's runtime is loaded: check headers and NVRTC, seed every bundled kernel, watch its construction."""
    serving, bundle = _current, _state["bundle"]
    if serving is None or bundle is None or serving.seeded:
        return
    from humming.jit import compiler as compilers
    from humming.jit.runtime import KernelRuntime
    from humming.utils import jit as jit_utils

    from nojit.loader.runtimes.humming import cache as humming_cache

    for cached in ("get_humming_cache_dir", "get_humming_tmp_dir", "get_humming_module_dir", "get_humming_lock_dir",
                   "get_humming_lock_filename"):
        getattr(jit_utils, cached).cache_clear()  # read the variables install() set, even if Humming looked before
    from nojit.loader.settings import Mode

    if _state["policy"] is not None and _state["policy"].mode is Mode.STRICT:
        _no_nvcc_probe()
    chosen = KernelRuntime._get_compiler()
    humming_cache.check_compatible(serving.headers_digest, serving.nvrtc, chosen, bundle.path)
    for key, e in serving.entries.items():
        launch = e.launch
        if launch.compiler != chosen.__name__:
            raise BundleMismatchError(f"{bundle.path}: Humming kernel {describe(e.key)} was compiled by "
                                      f"{launch.compiler}; this process's Humming uses {chosen.__name__}",
                                      fix="unset HUMMING_COMPILER (the bundle is built with Humming's NVRTC path)")
        cubin = bundle.read_blob(e.blob)
        path = humming_cache.seed(getattr(compilers, launch.compiler), launch.code, launch.sm_version,
                                  launch.kernel_expr, launch.disable_fast_math, launch.postprocessed, cubin, e.blob)
        serving.seeded.append(path)
    _watch_construction(KernelRuntime)


class _NoProcess:
    """humming.utils.cuda's `subprocess` in strict mode: its only use is `nvcc -V` on each system CUDA folder."""

    @staticmethod
    def check_output(cmd: Any, *args: Any, **kwargs: Any) -> bytes:
        raise OSError(f"nojit strict mode: {cmd!r} not run (Humming's CUDA version probe)")


def _no_nvcc_probe() -> None:
    """Humming's key holds the CUDA include folders it finds (NVRTCCompiler.get_flags -> filter_cuda_paths), and
    finding them runs `nvcc -V` per system CUDA folder (humming/utils/cuda.py `_read_cuda_system_version`). In strict
    mode nothing compiles, so the folders only need to be the same at seeding and at lookup: the probe fails in
    process (Humming then reads the version from version.json / the folder name, as it does without nvcc), and no
    process starts. Permissive and record modes keep Humming's probe: a miss is compiled with those folders."""
    cuda = importlib.import_module("humming.utils.cuda")
    if cuda.__dict__.get("subprocess") is not _NoProcess:
        cuda.subprocess = _NoProcess
        cuda.find_all_cuda_paths.cache_clear()


def _watch_construction(runtime_cls: Any) -> None:
    """Check every kernel Humming constructs, before it compiles: `KernelRuntime.__new__` receives the class and
    the arguments of both ways Humming builds kernels, `compile_many` (prepare_kernels at the first forward) and
    direct construction (the weight transform's ops at weight loading: `RepackWeightKernel(...)`)."""
    if _state["original"] is not None:
        return
    original = runtime_cls.__dict__["__new__"]
    original_fn = original.__func__ if isinstance(original, staticmethod) else original

    def __new__(cls: type, *args: Any, **kwargs: Any) -> Any:
        _check(cls, args, kwargs)
        return original_fn(cls, *args, **kwargs)

    __new__.__wrapped__ = original_fn  # type: ignore[attr-defined]
    runtime_cls.__new__ = staticmethod(__new__)
    _state["original"] = (runtime_cls, original)


def _check(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Before Humming constructs this kernel: a bundled key is a cache hit; any other goes to the policy (each key
    once: Humming keeps one object per key, and vLLM's loader transforms every layer with the same kernels)."""
    serving, policy = _current, _state["policy"]
    if serving is None or policy is None:
        return
    key = kernel_key(cls, kwargs)
    if args:  # Humming passes keyword arguments only; a positional one makes a key no build wrote
        key["args"]["*positional"] = json_value(list(args))
    text = canonical(key)
    if text in serving.checked:
        return
    entry = serving.entries.get(text)
    if entry is not None:
        serving.checked.add(text)
        serving.hits += 1
        policy.served(entry.kernel, NAME, lambda key=key: key, "hit", serving.source_hashes[entry.kernel])
        return
    serving.misses.append(describe(key))
    policy.miss(key["class"], NAME, key, describe(key), serving.source_hashes.get(key["class"], ""),
                reason="Humming was about to compile it: add it with NOJIT_MODE=record, then "
                       "`nojit build --add-keys FILE`")
    serving.checked.add(text)  # record/permissive: recorded once, then Humming's own object answers


def uninstall() -> None:
    """Tests: put KernelRuntime.__new__ back and forget the installation (the seeded folder stays)."""
    global _current
    with _lock:
        if _state["original"] is not None:
            cls, original = _state["original"]
            cls.__new__ = original
        _state.update(policy=None, bundle=None, original=None)
        _current = None
