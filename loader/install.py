"""Install a bundle into this process: the one public entry point of the loader.

`install()` opens the bundle (header and index), refuses it if it does not match this
process (versions), puts a bundle server on every bundled Triton kernel and TileLang kernel,
and, in strict mode, closes every path to a compiler. It is safe to call more than once
(the second call returns the first installation).

It pays only for what every process needs (the API server runs no kernel): each kernel's
source hash, its section of the bundle and its launch tables are checked and built at the
kernel's first use (`prepare`). In a vLLM worker that is the warmup registry's preflight,
which tries every declared key, and the preload that follows, which prepares every kernel,
so all of it is checked at startup, before serving; `Installation.prepare()` does it on demand.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.bundle_file import Bundle
from nojit.loader.errors import BundleError, BundleMismatchError
from nojit.loader import firewall, landlock
from nojit.loader.driver_floor import check_driver
from nojit.loader.guards import install_strict_guards
from nojit.loader.policy import KeyRecorder, ServingPolicy
from nojit.loader.resolve import jit_function_of, resolve_installed
from nojit.loader.settings import Mode, settings
from nojit.loader.versions import RuntimeVersions, check_versions

log = logging.getLogger("nojit")

Resolver = Callable[[str], Any]


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
    humming: Any = None  # HummingServing: Humming's cache seeded from the bundle (humming_serving.py)
    allowed_differences: list[str] = field(default_factory=list)
    arguments: dict[str, Any] = field(default_factory=dict)  # install()'s arguments, defaults filled in
    timings: dict[str, float] = field(default_factory=dict)  # ms per step of install() (bench/bench_fastpath.py)

    def prepare(self) -> int:
        """Check and prepare every installed kernel now (source hash, its section of the bundle, launch tables);
        install() leaves this to each kernel's first use. Returns how many kernels."""
        servers = (*self.triton.values(), *self.tilelang.values())
        for s in servers:
            s.prepare()
        return len(servers)

    def preload(self, device: int | None = None) -> int:
        """Load every bundled module on `device` (default: current), preparing every kernel first. Call before
        CUDA-graph capture."""
        from nojit.loader.torch_cuda import current_device

        dev = current_device() if device is None else device
        return sum(s.preload(dev) for s in (*self.triton.values(), *self.tilelang.values(), *self.cutedsl.values()))

    def uninstall(self) -> None:
        """Give the kernels back their own JIT paths and lift the strict guards (tests and tools)."""
        global _current
        from nojit.loader.triton_fast import restore_getitem

        for server in self.triton.values():
            server.fn.__dict__.pop("run", None)
            restore_getitem(server.fn)  # its own class back (kernel[grid] bound in C)
        if self.tilelang:
            from nojit.loader import tilelang_serving

            tilelang_serving.uninstall(self.tilelang)
        for server in self.cutedsl.values():
            server.uninstall()
        if self.flashinfer is not None:
            from nojit.loader import flashinfer_serving

            flashinfer_serving.uninstall()
        if self.humming is not None:
            from nojit.loader import humming_serving

            humming_serving.uninstall()
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
    _check_arguments(bundle_path, mode, resolver, allow_mismatch, record_file, kernels)
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
        clock = _Steps()
        path = bundle_path or settings.bundle
        mode = Mode(mode) if mode is not None else settings.mode
        allow = settings.allow_mismatch if allow_mismatch is None else _allowed_words(allow_mismatch)
        if path:
            bundle = Bundle.open(path, expected_sha256=settings.bundle_sha256)
        else:
            from nojit.loader.installed_bundles import open_installed_bundle

            wheel_bundle = open_installed_bundle(settings.bundle_sha256)  # sha256-pinned by the wheel's record
            if wheel_bundle is None:
                raise BundleError("no bundle given", fix="set NOJIT_BUNDLE to the bundle file built by `nojit build`, "
                                  "or install a bundle wheel made by `nojit package`")
            bundle, path = wheel_bundle, wheel_bundle.path
        clock.step("open")
        if mode is Mode.STRICT:
            fw = firewall.activate(bundle.index)  # before anything imports a library that looks for compilers
            clock.step("firewall")
            # the kernel's exec allow-list, inherited by every child and irreversible (loader/landlock.py)
            landlock.enforce(os.path.join(fw.root, "nojit-stand-in"), firewall.runtime_dir())
            clock.step("landlock")
        allowed = check_versions(bundle.index, path, RuntimeVersions.of_this_process(), allow)
        clock.step("versions")
        check_driver(bundle.index, path, mode is Mode.STRICT, log.warning, log.info)  # before any cubin reaches the driver
        clock.step("driver")
        recorder = None
        if mode is Mode.RECORD:
            recorder = KeyRecorder(record_file or settings.record_file or f"{os.path.abspath(path)}.keys.jsonl")
        policy = ServingPolicy(mode, path, recorder)
        inst = Installation(bundle, policy, mode, allowed_differences=allowed,
                            arguments={**asked, "bundle_path": path, "mode": mode, "allow_mismatch": allow})
        packages = ("vllm",) if bundle.index.producer.vllm else ()  # what the bundle was built from
        resolve = resolver or (lambda kid: resolve_installed(kid, packages))
        wanted = [k for k in bundle.kernel_ids() if kernels is None or k in kernels]
        records = bundle.index.kernels
        tilelang_ids = [k for k in wanted if records[k].runtime == "tilelang"]
        if tilelang_ids:
            from nojit.loader import tilelang_serving

            inst.tilelang = tilelang_serving.install(bundle, tilelang_ids, policy, allow)  # filled as vLLM decorates
        clock.step("tilelang")
        flashinfer_ids = [k for k in wanted if records[k].runtime == "flashinfer"]
        if flashinfer_ids:
            from nojit.loader import flashinfer_serving

            inst.flashinfer = flashinfer_serving.install(bundle, flashinfer_ids, policy)
        clock.step("flashinfer")
        humming_ids = [k for k in wanted if records[k].runtime == "humming"]
        if humming_ids:
            from nojit.loader import humming_serving

            inst.humming = humming_serving.install(bundle, humming_ids, policy)
        clock.step("humming")
        triton_ids = [k for k in wanted if records[k].runtime == "triton"]
        if triton_ids:
            _install_triton(inst, triton_ids, resolve, allow)
        clock.step("triton")
        cutedsl_ids = [k for k in wanted if records[k].runtime == "cutedsl"]
        if cutedsl_ids:
            from nojit.loader import cutedsl_serving

            inst.cutedsl = cutedsl_serving.install(bundle, cutedsl_ids, policy, allow, resolve)
        clock.step("cutedsl")
        deepgemm_ids = [k for k in wanted if records[k].runtime == "deepgemm"]
        if deepgemm_ids:  # after firewall.activate: DeepGEMM's compiler ends at the stand-in, its probe answered
            from nojit.loader.deepgemm_serving import install_from_bundle

            inst.deepgemm = install_from_bundle(bundle, records, deepgemm_ids, mode, recorder, allow)
        clock.step("deepgemm")
        from nojit.loader.cuda_launch import launcher
        from nojit.loader.torch_cuda import device_capability

        launcher().device_check = lambda device: check_exact_arch(bundle.index, path, device_capability(device), allow)
        if mode is Mode.STRICT:
            install_strict_guards()
        clock.step("guards")
        for line in allowed:
            log.warning("nojit: serving %s although %s (NOJIT_ALLOW_MISMATCH)", path, line)
        if not settings.quiet:
            log.info(
                "nojit: serving %d Triton and %d TileLang kernels (%d entries) from %s in %s mode",
                len(inst.triton), len(inst.tilelang), bundle.index.entry_count, path, mode.value,
            )
        inst.timings = clock.steps
        _current = inst
        return inst


class _Steps:
    """Milliseconds per step of install(), for the benchmark's breakdown (a clock read per step)."""

    def __init__(self) -> None:
        self.steps: dict[str, float] = {}
        self._t = time.perf_counter()

    def step(self, name: str) -> None:
        now = time.perf_counter()
        self.steps[name] = (now - self._t) * 1e3
        self._t = now


def _check_arguments(bundle_path: Any, mode: Any, resolver: Any, allow_mismatch: Any, record_file: Any,
                     kernels: Any) -> None:
    """install()'s arguments, type-checked before anything is done: a wrong one is a BundleError naming it."""
    def refuse(name: str, value: Any, want: str) -> BundleError:
        return BundleError(f"install({name}={value!r:.80}): a {type(value).__name__}, expected {want}",
                           fix=f"pass {name} as {want}, or leave it out to use the environment's setting")

    for name, value in (("bundle_path", bundle_path), ("record_file", record_file)):
        if value is not None and not isinstance(value, (str, os.PathLike)):
            raise refuse(name, value, "a path (str)")
        if isinstance(value, str) and (not value or "\0" in value):
            raise BundleError(f"install({name}={value!r:.80}): empty or holds a NUL byte", fix=f"pass {name} as a path")
    if mode is not None:
        choices = ", ".join(m.value for m in Mode)
        if not isinstance(mode, Mode) and not (isinstance(mode, str) and mode in {m.value for m in Mode}):
            raise BundleError(f"install(mode={mode!r:.80}) is not a mode", fix=f"pass one of: {choices}")
    if resolver is not None and not callable(resolver):
        raise refuse("resolver", resolver, "a callable mapping a kernel id to its object")
    for name, value in (("allow_mismatch", allow_mismatch), ("kernels", kernels)):
        if value is not None and (isinstance(value, (str, bytes)) or not isinstance(value, (set, frozenset, list, tuple))
                                  or not all(isinstance(v, str) for v in value)):
            raise refuse(name, value, "a set of str")


def check_exact_arch(index: Any, path: str, capability: tuple[int, int], allow: frozenset[str]) -> None:
    """At a device's first launch: its capability (versions.check_arch), then every arch the bundle recorded."""
    from nojit.loader.arch_fit import arch_problems
    from nojit.loader.versions import check_arch

    check_arch(index, path, capability, allow)
    problems = arch_problems(index, capability)
    if problems and "arch" not in allow:
        raise BundleMismatchError(f"bundle {path} is not built for exactly this GPU: " + "; ".join(problems),
                                  fix="rebuild the bundle for this GPU's architecture (one arch per bundle)")


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
        fn = jit_function_of(resolve(kid))
        if fn is None:
            raise BundleMismatchError(
                f"kernel {kid} is not a Triton JITFunction in this process",
                fix="vLLM replaced Triton with a placeholder (no GPU driver?) or the kernel changed; "
                "rebuild the bundle against the installed vLLM",
            )
        # Source check, section and tables: at the kernel's first use (TritonKernelServer.prepare); in a vLLM
        # worker that is the warmup registry's preflight, then preload() for every kernel, before serving.
        server = TritonKernelServer(fn, bundle.index.kernels[kid], bundle, inst.policy, specializer, debug,
                                    instrumentation_mode, fast_path=settings.fast_path, allow=allow,
                                    differences=inst.allowed_differences)
        fn.run = server.entry_point  # instance attribute: shadows JITFunction.run for this kernel only
        inst.triton[kid] = server
