"""Python face of the C launcher: modules loaded once per device, launches on torch's stream.

Everything CUDA goes through nojit.loader._cuda_launcher (csrc/), which opens libcuda at
run time: no Triton driver object, no host compiler, no CUDA toolkit. A cubin is loaded
into the current context of the device the launch happens on, once, on first use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nojit.loader.errors import LaunchError

_ERRLEN = 512


def _lib():  # imported lazily: CPU-only tools (inspect, tests) never need the C extension
    from nojit.loader import _cuda_launcher

    return _cuda_launcher


@dataclass(frozen=True)
class LoadedFunction:
    module: int
    function: int
    num_regs: int
    max_threads: int


class CudaLauncher:
    """Loads cubins (cached per device and blob) and launches them."""

    def __init__(self) -> None:
        m = _lib()
        self._ffi = m.ffi
        self._c = m.lib
        self._err = self._ffi.new("char[]", _ERRLEN)
        self._lock = threading.Lock()
        self._loaded: dict[tuple[int, str], LoadedFunction] = {}
        self._checked_devices: set[int] = set()
        self.loads = 0
        # Called once per device before its first module load (the loader checks the GPU
        # architecture against the bundle's target there).
        self.device_check: Callable[[int], None] | None = None

    def _fail(self, what: str, rc: int) -> LaunchError:
        return self.error(self._err, what, rc)

    @property
    def c_launch(self):
        """The C entry point itself, for callers that keep their own error buffer (the hot path)."""
        return self._c.nojit_launch

    def new_error_buffer(self):
        return self._ffi.new("char[]", _ERRLEN)

    def error(self, err_buffer, what: str, rc: int) -> LaunchError:
        msg = self._ffi.string(err_buffer).decode(errors="replace")
        return LaunchError(f"{what}: {msg} (code {rc})", fix=_fix_for(msg))

    def driver_version(self) -> int:
        out = self._ffi.new("int *")
        rc = self._c.nojit_driver_version(out, self._err, _ERRLEN)
        if rc:
            raise self._fail("CUDA driver", rc)
        return int(out[0])

    def function(self, device: int, blob: str, image_fn, symbol: str, dynamic_smem: int) -> LoadedFunction:
        """The loaded function for (device, blob); `image_fn()` supplies the cubin on first use."""
        key = (device, blob)
        loaded = self._loaded.get(key)
        if loaded is not None:
            return loaded
        with self._lock:
            loaded = self._loaded.get(key)
            if loaded is None:
                loaded = self._load(device, image_fn(), symbol, dynamic_smem)
                self._loaded[key] = loaded
        return loaded

    def _load(self, device: int, image: bytes, symbol: str, dynamic_smem: int) -> LoadedFunction:
        if device not in self._checked_devices:
            if self.device_check is not None:
                self.device_check(device)
            self._checked_devices.add(device)
        rc = self._c.nojit_ensure_context(device, self._err, _ERRLEN)
        if rc:
            raise self._fail(f"CUDA context for device {device}", rc)
        mod = self._ffi.new("uint64_t *")
        fn = self._ffi.new("uint64_t *")
        regs = self._ffi.new("int *")
        threads = self._ffi.new("int *")
        rc = self._c.nojit_load(image, len(image), symbol.encode(), dynamic_smem, mod, fn, regs, threads, self._err, _ERRLEN)
        if rc:
            raise self._fail(f"loading kernel {symbol}", rc)
        self.loads += 1
        return LoadedFunction(int(mod[0]), int(fn[0]), int(regs[0]), int(threads[0]))

    def launch(
        self,
        function: int,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared: int,
        stream: int,
        arg_types: bytes,
        arg_values: list[int],
        cluster: tuple[int, int, int],
        pdl: bool,
        cooperative: bool,
    ) -> None:
        rc = self._c.nojit_launch(
            function,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared,
            stream,
            arg_types,
            arg_values,
            len(arg_values),
            cluster[0],
            cluster[1],
            cluster[2],
            int(pdl),
            int(cooperative),
            self._err,
            _ERRLEN,
        )
        if rc:
            raise self._fail("kernel launch", rc)


class BundledFunction:
    """Base of a prepared bundle entry: its CUfunction per device, loaded on first use, and the
    C entry point with an error buffer of its own (so launches allocate nothing)."""

    def __init__(self, bundle: Any, entry: Any, symbol: str, dynamic_smem: int, threads_per_block: int | None) -> None:
        self.entry = entry
        self._bundle = bundle
        self._symbol = symbol
        self._dynamic_smem = dynamic_smem
        self._threads = threads_per_block
        self._functions: dict[int, int] = {}
        lch = launcher()
        self._c_launch = lch.c_launch
        self._err = lch.new_error_buffer()

    def load(self, device: int) -> int:
        """The CUfunction for `device`, loading the module on first use."""
        f = self._functions.get(device)
        if f is None:
            blob = self.entry.blob
            try:
                loaded = launcher().function(device, blob, lambda: self._bundle.read_blob(blob), self._symbol,
                                             self._dynamic_smem)
            except LaunchError as exc:
                raise LaunchError(f"{exc.message} ({self.where()})", fix=exc.fix) from None
            if self._threads and loaded.max_threads and self._threads > loaded.max_threads:
                raise LaunchError(f"{self.entry.kernel}: {self._threads} threads per block, the cubin allows "
                                  f"{loaded.max_threads}", fix="rebuild the bundle; this cubin is inconsistent")
            f = self._functions[device] = loaded.function
        return f

    def where(self) -> str:
        """Kernel, key and bundle of this entry, for driver errors."""
        import json

        key = json.dumps(self.entry.key, sort_keys=True, separators=(",", ":"))
        return f"kernel {self.entry.kernel}, {self.entry.variant} key {key[:300]}, bundle {self._bundle.path}"

    def _failed(self, rc: int) -> LaunchError:
        return launcher().error(self._err, f"launching {self.where()}", rc)


def _fix_for(message: str) -> str:
    if "libcuda.so.1" in message:
        return "run on a machine with the NVIDIA driver installed (libcuda.so.1 on the loader path)"
    if "NO_BINARY_FOR_GPU" in message or "INVALID_IMAGE" in message:
        return "the bundle's cubins are for another GPU architecture: build a bundle for this GPU"
    if "UNSUPPORTED_PTX_VERSION" in message or "INVALID_PTX" in message:
        return "the driver is too old for these cubins: upgrade the NVIDIA driver"
    return "check the CUDA driver and the GPU state; rerun with NOJIT_MODE=permissive to fall back to the JIT"


_launcher: CudaLauncher | None = None
_launcher_lock = threading.Lock()
_device_check: Callable[[int], None] | None = None  # install()'s, for a launcher made after it (set_device_check)


def launcher() -> CudaLauncher:
    """The process-wide launcher (created on first use, with the device check install() set)."""
    global _launcher
    if _launcher is None:
        with _launcher_lock:
            if _launcher is None:
                made = CudaLauncher()
                made.device_check = _device_check  # before any other thread can see it
                _launcher = made
    return _launcher


def set_device_check(check: Callable[[int], None] | None) -> None:
    """The check run once per device before its first module load (install(): the GPU against the bundle's
    target): on the launcher if there is one, else on the one made at the first load. install() does not make
    the launcher (loading the C extension): a process that launches nothing, vLLM's API server, never pays it."""
    global _device_check
    with _launcher_lock:
        _device_check = check
        if _launcher is not None:
            _launcher.device_check = check
