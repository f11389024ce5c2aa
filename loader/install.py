"""Install a bundle into this process: the one public entry point of the loader.

`install()` opens the bundle, refuses it if it does not match this process (versions,
kernel source), puts a bundle server on every bundled Triton kernel and TileLang kernel,
and, in strict mode, closes every path to a compiler. It is safe to call more than once
(the second call returns the first installation).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.bundle_file import Bundle
from nojit.loader.errors import BundleError, BundleMismatchError, NoJitError
from nojit.loader import firewall
from nojit.loader.guards import install_strict_guards
from nojit.loader.policy import KeyRecorder, ServingPolicy
from nojit.loader.settings import Mode, settings
from nojit.loader.versions import RuntimeVersions, check_source, check_versions

log = logging.getLogger("nojit")

Resolver = Callable[[str], Any]


def resolve_object(kernel_id: str, import_module: Callable[[str], Any] = importlib.import_module) -> Any:
    """The live object named "module:qualname" (importing the module with `import_module`)."""
    module_name, _, qualname = kernel_id.partition(":")
    try:
        obj: Any = import_module(module_name)
    except ImportError as exc:
        raise BundleMismatchError(
            f"kernel {kernel_id}: module {module_name} cannot be imported ({exc})",
            fix="the installed vLLM does not have this kernel: rebuild the bundle against it with `nojit build`",
        ) from None
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise BundleMismatchError(
                f"kernel {kernel_id}: {module_name} has no {qualname}",
                fix="the installed vLLM does not have this kernel: rebuild the bundle against it with `nojit build`",
            ) from None
    return obj


def resolve_installed(kernel_id: str, packages: tuple[str, ...] = ("vllm",)) -> Any:
    """`resolve_object` for a kernel id read from a bundle: the module is imported only if it is an installed
    file of one of `packages` (the packages the bundle was built from), so bundle data never picks what runs."""
    _check_importable(kernel_id, kernel_id.partition(":")[0], packages)
    return resolve_object(kernel_id)


def _check_importable(kernel_id: str, module_name: str, packages: tuple[str, ...]) -> None:
    refuse = BundleMismatchError(
        f"kernel {kernel_id}: {module_name} is not a module of the installed {' or '.join(packages) or '(no package)'}; "
        "nojit imports nothing else a bundle names",
        fix="the bundle is not from this vLLM (or was edited): rebuild it with `nojit build`",
    )
    root = module_name.partition(".")[0]
    if root not in packages or not all(p.isidentifier() for p in module_name.split(".")):
        raise refuse
    try:
        spec = importlib.util.find_spec(module_name)  # imports the parent packages: modules of `root`
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or os.path.realpath(spec.origin) not in _distribution_files(root):
        raise refuse


_files_of: dict[str, frozenset[str]] = {}


def _distribution_files(package: str) -> frozenset[str]:
    """Absolute paths of the files the installed distribution of `package` holds (its RECORD), or its directory's."""
    files = _files_of.get(package)
    if files is None:
        found: set[str] = set()
        try:
            dist = importlib.metadata.distribution(package)
            found = {os.path.realpath(dist.locate_file(f)) for f in dist.files or () if str(f).endswith(".py")}
        except importlib.metadata.PackageNotFoundError:
            pass
        spec = importlib.util.find_spec(package)
        if not found and spec is not None and spec.submodule_search_locations:
            # an editable (development) install's RECORD lists no modules: its source tree is the package
            for base in spec.submodule_search_locations:
                for d, _, names in os.walk(base):
                    found.update(os.path.realpath(os.path.join(d, n)) for n in names if n.endswith(".py"))
        files = _files_of[package] = frozenset(found)
    return files


def jit_function_of(obj: Any) -> Any:
    """The JITFunction under autotuner/heuristics wrappers."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while not isinstance(obj, JITFunction):
        obj = getattr(obj, "fn", None)
        seen += 1
        if obj is None or seen > 8:
            return None
    return obj


@dataclass
class Installation:
    """What `install()` did; kept for introspection and tests."""

    bundle: Bundle
    policy: ServingPolicy
    mode: Mode
    triton: dict[str, Any] = field(default_factory=dict)  # kernel id -> TritonKernelServer
    tilelang: dict[str, Any] = field(default_factory=dict)  # kernel id -> TileLangKernelServer
    cutedsl: dict[str, Any] = field(default_factory=dict)  # kernel id -> CuteKernelServer (cutedsl_serving)
    deepgemm: Any = None  # DeepGemmServing (loader/deepgemm_serving.py) when the bundle has DeepGEMM entries
    flashinfer: Any = None  # FlashInferServing: FlashInfer's modules as a jit-cache provider (flashinfer_serving.py)
    allowed_differences: list[str] = field(default_factory=list)
    arguments: dict[str, Any] = field(default_factory=dict)  # install()'s arguments, defaults filled in

    def preload(self, device: int | None = None) -> int:
        """Load every bundled module on `device` (default: current). Call before CUDA-graph capture."""
        from nojit.loader.torch_cuda import current_device

        dev = current_device() if device is None else device
        return sum(s.preload(dev) for s in (*self.triton.values(), *self.tilelang.values(), *self.cutedsl.values()))

    def uninstall(self) -> None:
        """Give the kernels back their own JIT paths and lift the strict guards (tests and tools)."""
        global _current
        for server in self.triton.values():
            server.fn.__dict__.pop("run", None)
        if self.tilelang:
            from nojit.loader import tilelang_serving

            tilelang_serving.uninstall(self.tilelang)
        for server in self.cutedsl.values():
            server.uninstall()
        if self.flashinfer is not None:
            from nojit.loader import flashinfer_serving

            flashinfer_serving.uninstall()
        self.triton.clear()
        self.tilelang.clear()
        self.cutedsl.clear()
        if self.deepgemm is not None:  # vLLM's DeepGEMM entry points back (the probe answer stays in place)
            import vllm.utils.deep_gemm as vllm_dg

            for op, original in self.deepgemm.originals.items():
                setattr(vllm_dg, op, original)
            self.deepgemm = None
        from nojit.loader import guards, triton_driver

        guards.deactivate()
        if "triton" in sys.modules:
            triton_driver.restore()
        with _lock:
            if _current is self:
                _current = None


_lock = threading.Lock()
_current: Installation | None = None


def current() -> Installation | None:
    return _current


@firewall.lowered_if_raises
def install(
    bundle_path: str | None = None,
    mode: Mode | str | None = None,
    resolver: Resolver | None = None,
    allow_mismatch: frozenset[str] | None = None,
    record_file: str | None = None,
    kernels: set[str] | None = None,
) -> Installation:
    """Serve the bundle's kernels in this process.

    bundle_path / mode / allow_mismatch / record_file default to NOJIT_BUNDLE, NOJIT_MODE,
    NOJIT_ALLOW_MISMATCH and NOJIT_RECORD_FILE. resolver maps a kernel id to its live
    object (default: import module, walk qualname). kernels limits the install to those ids.
    """
    global _current
    with _lock:
        asked = {"bundle_path": bundle_path, "mode": mode, "resolver": resolver, "allow_mismatch": allow_mismatch,
                 "record_file": record_file, "kernels": kernels}
        if _current is not None:
            differs = [f"{k}={v!r} (installed: {_current.arguments.get(k)!r})" for k, v in asked.items()
                       if v is not None and v != _current.arguments.get(k)]
            if differs:
                raise BundleError(f"nojit is already installed in this process; install() was called again with "
                                  f"other arguments: {', '.join(differs)}",
                                  fix="call install() once per process, or uninstall() the first installation first")
            return _current
        path = bundle_path or settings.bundle or _installed_bundle_path()
        if not path:
            raise BundleError("no bundle given", fix="set NOJIT_BUNDLE to the bundle file built by `nojit build`, "
                              "or install a bundle wheel made by `nojit package`")
        mode = Mode(mode) if mode is not None else settings.mode
        allow = settings.allow_mismatch if allow_mismatch is None else _allowed_words(allow_mismatch)
        bundle = Bundle.open(path, expected_sha256=settings.bundle_sha256)
        if mode is Mode.STRICT:
            firewall.activate(bundle.manifest)  # before anything imports a library that looks for compilers
        allowed = check_versions(bundle.manifest, path, RuntimeVersions.of_this_process(), allow)
        recorder = None
        if mode is Mode.RECORD:
            recorder = KeyRecorder(record_file or settings.record_file or f"{os.path.abspath(path)}.keys.jsonl")
        policy = ServingPolicy(mode, path, recorder)
        inst = Installation(bundle, policy, mode, allowed_differences=allowed,
                            arguments={**asked, "bundle_path": path, "mode": mode, "allow_mismatch": allow})
        packages = ("vllm",) if bundle.manifest.producer.vllm else ()  # what the bundle was built from
        resolve = resolver or (lambda kid: resolve_installed(kid, packages))
        wanted = [k for k in bundle.kernel_ids() if kernels is None or k in kernels]
        records = bundle.manifest.kernels
        tilelang_ids = [k for k in wanted if records[k].runtime == "tilelang"]
        if tilelang_ids:
            from nojit.loader import tilelang_serving

            inst.tilelang = tilelang_serving.install(bundle, tilelang_ids, policy, allow)  # filled as vLLM decorates
        flashinfer_ids = [k for k in wanted if records[k].runtime == "flashinfer"]
        if flashinfer_ids:
            from nojit.loader import flashinfer_serving

            inst.flashinfer = flashinfer_serving.install(bundle, flashinfer_ids, policy)
        triton_ids = [k for k in wanted if records[k].runtime == "triton"]
        if triton_ids:
            _install_triton(inst, triton_ids, resolve, allow)
        cutedsl_ids = [k for k in wanted if records[k].runtime == "cutedsl"]
        if cutedsl_ids:
            from nojit.loader import cutedsl_serving

            inst.cutedsl = cutedsl_serving.install(bundle, cutedsl_ids, policy, allow, resolve)
        deepgemm_ids = [k for k in wanted if records[k].runtime == "deepgemm"]
        if deepgemm_ids:  # after firewall.activate: DeepGEMM's compiler ends at the stand-in, its probe answered
            from nojit.loader.deepgemm_serving import install_from_bundle

            inst.deepgemm = install_from_bundle(bundle, records, deepgemm_ids, mode, recorder, allow)
        from nojit.loader.cuda_launch import launcher
        from nojit.loader.versions import check_arch
        from nojit.loader.torch_cuda import device_capability

        launcher().device_check = lambda device: check_arch(bundle.manifest, path, device_capability(device), allow)
        if mode is Mode.STRICT:
            install_strict_guards()
        for line in allowed:
            log.warning("nojit: serving %s although %s (NOJIT_ALLOW_MISMATCH)", path, line)
        if not settings.quiet:
            log.info(
                "nojit: serving %d Triton and %d TileLang kernels (%d entries) from %s in %s mode",
                len(inst.triton), len(inst.tilelang), len(bundle.manifest.entries), path, mode.value,
            )
        _current = inst
        return inst


def _installed_bundle_path() -> str | None:
    """The bundle of the one installed bundle wheel, sha256-checked (installed_bundles.py)."""
    from nojit.loader.installed_bundles import verified_installed_bundle

    found = verified_installed_bundle()
    return found.path if found else None


def _allowed_words(words: Any) -> frozenset[str]:
    """install(allow_mismatch=...) takes the words NOJIT_ALLOW_MISMATCH takes, checked the same way."""
    return type(settings).allow_mismatch.parse(",".join(words))


def _install_triton(inst: Installation, kernel_ids: list[str], resolve: Resolver, allow: frozenset[str]) -> None:
    import triton
    from triton._utils import canonicalize_ptr_dtype

    from nojit.loader.triton_key import ArgSpecializer
    from nojit.loader.triton_serving import TritonKernelServer

    try:
        import torch

        tensor_cls: type | None = torch.Tensor
    except ImportError:  # pragma: no cover
        tensor_cls = None
    specializer = ArgSpecializer(canonicalize_ptr_dtype, tensor_cls)
    knobs = triton.knobs
    debug = bool(knobs.runtime.debug)
    instrumentation_mode = knobs.compilation.instrumentation_mode
    bundle = inst.bundle
    for kid in kernel_ids:
        record = bundle.manifest.kernels[kid]
        fn = jit_function_of(resolve(kid))
        if fn is None:
            raise BundleMismatchError(
                f"kernel {kid} is not a Triton JITFunction in this process",
                fix="vLLM replaced Triton with a placeholder (no GPU driver?) or the kernel changed; "
                "rebuild the bundle against the installed vLLM",
            )
        if not check_source(kid, record.source_hash, fn.cache_key, bundle.path, allow):
            inst.allowed_differences.append(f"source: {kid} changed since the bundle was built")
            log.warning("nojit: %s source differs from the bundle; serving it anyway (NOJIT_ALLOW_MISMATCH=source)", kid)
        try:
            server = TritonKernelServer(
                fn, record, bundle.entries(kid), bundle, inst.policy, specializer, debug, instrumentation_mode,
                fast_path=settings.fast_path,
            )
        except NoJitError:
            raise
        except Exception as exc:  # a malformed key in an otherwise valid manifest
            raise BundleMismatchError(f"kernel {kid}: cannot serve its bundle entries ({exc})",
                                      fix="rebuild the bundle with `nojit build`") from None
        fn.run = server.entry_point  # instance attribute: shadows JITFunction.run for this kernel only
        inst.triton[kid] = server
