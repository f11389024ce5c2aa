"""Install a bundle into this process: the one public entry point of the loader.

`install()` opens the bundle (header and index), refuses it if it does not match this
process (versions), installs each registered runtime (loader/runtimes/__init__.py) that has kernels
in the bundle, in registry order, keeping what each did as a `Handle`, and, in strict mode, closes
every path to a compiler. It is safe to call more than once
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
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.bundle.file import Bundle
from nojit.loader.errors import BundleError, BundleMismatchError
from nojit.loader.faces import Handle, InstallContext
from nojit.loader.strict import exec_guard, firewall, landlock
from nojit.loader.bundle.driver_floor import check_driver
from nojit.loader.strict.guards import install_strict_guards
from nojit.loader.policy import KeyRecorder, ServingPolicy
from nojit.loader.resolve import jit_function_of, resolve_installed, resolve_object  # noqa: F401 (public names of install)
from nojit.loader.settings import Mode, settings
from nojit.loader.bundle.versions import RuntimeVersions, check_versions
from nojit.loader.runtimes import RUNTIMES

log = logging.getLogger("nojit")

Resolver = Callable[[str], Any]


@dataclass
class Installation:
    """What `install()` did; kept for introspection and tests."""

    bundle: Bundle
    policy: ServingPolicy
    mode: Mode
    handles: dict[str, Handle] = field(default_factory=dict)  # runtime name -> what its install did
    allowed_differences: list[str] = field(default_factory=list)
    arguments: dict[str, Any] = field(default_factory=dict)  # install()'s arguments, defaults filled in
    timings: dict[str, float] = field(default_factory=dict)  # ms per step of install() (bench/bench_fastpath.py)

    def servers(self, runtime: str) -> dict[str, Any]:
        """kernel id -> server of one runtime (empty when the bundle holds none of its kernels)."""
        handle = self.handles.get(runtime)
        return handle.servers if handle is not None else {}

    def state(self, runtime: str) -> Any:
        """One runtime's own record of its install (DeepGemmServing, FlashInferServing, ...), or None."""
        handle = self.handles.get(runtime)
        return handle.state if handle is not None else None

    def prepare(self) -> int:
        """Check and prepare every installed kernel now (source hash, its section of the bundle, launch tables);
        install() leaves this to each kernel's first use. Returns how many kernels."""
        return sum(h.prepare() for h in self.handles.values())

    def preload(self, device: int | None = None) -> int:
        """Load every bundled module on `device` (default: current), preparing every kernel first. Call before
        CUDA-graph capture."""
        from nojit.loader.launch.torch_cuda import current_device

        dev = current_device() if device is None else device
        return sum(h.preload(dev) for h in self.handles.values())

    def uninstall(self) -> None:
        """Give the kernels back their own JIT paths and lift the strict guards (tests and tools)."""
        global _current
        for handle in self.handles.values():
            handle.uninstall()
        self.handles.clear()
        from nojit.loader.strict import guards

        guards.deactivate()
        for runtime in RUNTIMES.values():
            if runtime.restore is not None:
                runtime.restore()
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
            from nojit.loader.bundle.installed import open_installed_bundle

            wheel_bundle = open_installed_bundle(settings.bundle_sha256)  # sha256-pinned by the wheel's record
            if wheel_bundle is None:
                raise BundleError("no bundle given", fix="set NOJIT_BUNDLE to the bundle file built by `nojit build`, "
                                  "or install a bundle wheel made by `nojit package`")
            bundle, path = wheel_bundle, wheel_bundle.path
        clock.step("open")
        if mode is Mode.STRICT:
            fw = firewall.activate(bundle.index)  # before anything imports a library that looks for compilers
            clock.step("firewall")
            # the kernel's exec allow-list, inherited by every child and irreversible (loader/strict/landlock.py)
            ll = landlock.enforce(os.path.join(fw.root, "nojit-stand-in"), firewall.runtime_dir())
            # where that allow-list is not applied, libc's exec entries refuse compilers instead (Build 2b)
            exec_guard.activate(ll.state)
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
        unserved = sorted({records[k].runtime for k in wanted} - set(RUNTIMES))
        if unserved:
            raise BundleMismatchError(f"{path}: holds kernels of runtime {', '.join(unserved)}, which this nojit "
                                      "does not serve", fix="install the nojit that built the bundle, or rebuild "
                                      f"it with --runtime {','.join(r for r in RUNTIMES)}")
        counts: list[str] = []
        for runtime in RUNTIMES.values():
            ids = [k for k in wanted if records[k].runtime == runtime.name]
            if ids:
                ctx = InstallContext(bundle, ids, policy, allow, resolve, inst.allowed_differences)
                inst.handles[runtime.name] = runtime.install(ctx)
                counts.append(f"{len(ids)} {runtime.display}")
            clock.step(runtime.name)
        from nojit.loader.launch.cuda_launch import set_device_check
        from nojit.loader.launch.torch_cuda import device_capability

        set_device_check(lambda device: check_exact_arch(bundle.index, path, device_capability(device), allow))
        if mode is Mode.STRICT:
            install_strict_guards()
        clock.step("guards")
        for line in allowed:
            log.warning("nojit: serving %s although %s (NOJIT_ALLOW_MISMATCH)", path, line)
        if not settings.quiet:
            log.info("nojit: serving %s kernels (%d entries) from %s in %s mode", " + ".join(counts) or "no",
                     bundle.index.entry_count, path, mode.value)
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
    from nojit.loader.bundle.arch_fit import arch_problems
    from nojit.loader.bundle.versions import check_arch

    check_arch(index, path, capability, allow)
    problems = arch_problems(index, capability)
    if problems and "arch" not in allow:
        raise BundleMismatchError(f"bundle {path} is not built for exactly this GPU: " + "; ".join(problems),
                                  fix="rebuild the bundle for this GPU's architecture (one arch per bundle)")


def _allowed_words(words: Any) -> frozenset[str]:
    """install(allow_mismatch=...) takes the words NOJIT_ALLOW_MISMATCH takes, checked the same way."""
    return type(settings).allow_mismatch.parse(",".join(words))
