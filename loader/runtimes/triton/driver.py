"""Triton's driver questions answered from torch, so deriving keys never builds `cuda_utils`.

Creating Triton's real CUDA driver compiles its host module `cuda_utils` from driver.c with
gcc unless Triton's cache already holds it (triton/backends/nvidia/driver.py: `CudaDriver()`
-> `CudaUtils()` -> `compile_module_from_file`). vLLM's warmup registry creates it just to
derive keys: `_triton_key_deriver` asks `driver.active.get_current_device()` and
`kernel.device_caches[device]`, whose `create_binder` asks `get_current_target()`
(vllm/model_executor/warmup/jit_warmup_triton_helper.py; triton/runtime/jit.py). With an
empty TRITON_CACHE_DIR in strict mode that build is refused and the start fails.

Those, and the three an autotuner's benchmark asks (`get_benchmarker`, `get_empty_cache_for_benchmark`,
`clear_cache`: Triton's own `do_bench` on the bundled cubins), are the only questions a nojit-served process
asks Triton's driver: bundled kernels
launch through nojit's own C launcher, never through Triton's. So nojit answers them from
torch (which has the CUDA runtime loaded anyway) and creates Triton's real driver only when
something asks for more (a kernel Triton itself launches): in permissive mode
that is the JIT doing its job; in strict mode it is refused with the firewall's message.

One more question comes from kernels' hosts, not from Triton: FLA's `get_all_max_shared_mem` (vLLM's
third_party/flash_linear_attention/ops/utils.py, reached by Qwen3.5's GDN layers) asks
`driver.active.utils.get_device_properties(i)`. Asking Triton's real `utils` builds `cuda_utils` with gcc (three
processes on the H200: ldconfig, gcc, file); refused in strict mode, FLA swallows the error and picks its
small-shared-memory configs. So `utils.get_device_properties` is answered too, from the driver attributes
Triton's driver.c reads (the `utils` rest is Triton's own, built on first use).

Chosen over shipping a prebuilt `cuda_utils` in the bundle because nothing then depends on
the serving machine's Python ABI, libcuda path or Triton's cache layout, the bundle carries no
host code, and the answer is the one Triton's own driver gives (`GPUDriver.__init__` takes
`torch.cuda.current_device`; `get_current_target` is capability major*10+minor, warp 32).
"""

from __future__ import annotations

from typing import Any


class TorchAnsweredDriver:
    """Stands as `triton.runtime.driver.active`: device, stream and target from torch; the rest
    from Triton's real driver, created on first use."""

    def __init__(self, real: Any) -> None:
        self._real_config = real  # triton.runtime.driver (the DriverConfig): creates the real driver lazily

    # --- answered here (what key derivation and nojit-served launches ask) ---
    def is_active(self) -> bool:
        return True

    def get_current_device(self) -> int:
        from nojit.loader.launch.torch_cuda import current_device

        return current_device()

    def get_current_stream(self, device: int | None = None) -> int:
        from nojit.loader.launch.torch_cuda import current_device, current_stream

        return current_stream(current_device() if device is None else device)

    def get_device_capability(self, device: int | None = None) -> tuple[int, int]:
        from nojit.loader.launch.torch_cuda import current_device, device_capability

        return device_capability(current_device() if device is None else device)

    def set_current_device(self, device: int) -> None:
        import torch

        torch.cuda.set_device(device)

    def get_current_target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        major, minor = self.get_device_capability()
        return GPUTarget("cuda", major * 10 + minor, 32)

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cuda", self.get_current_device())

    def get_device_interface(self) -> Any:
        import torch

        return torch.cuda

    # --- Triton's Autotuner benchmarking bundled cubins (triton/runtime/autotuner.py `do_bench`, triton/testing.py
    # `do_bench`): the same answers as Triton's CudaDriver (backends/nvidia/driver.py), from torch ---
    def get_benchmarker(self) -> Any:
        from triton.testing import do_bench

        return do_bench

    def get_empty_cache_for_benchmark(self) -> Any:
        import torch

        return torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device="cuda")  # Triton's 256 MB L2 flush buffer

    def clear_cache(self, cache: Any) -> None:
        cache.zero_()

    @property
    def utils(self) -> "AnsweredUtils":
        return AnsweredUtils(self)

    # --- everything else: Triton's own driver (built now; strict mode refuses a cold build) ---
    def __getattr__(self, name: str) -> Any:
        return getattr(self._real_config.default, name)

    @property
    def real_driver_created(self) -> bool:
        return self._real_config._default is not None


def answer_from_torch() -> TorchAnsweredDriver | None:
    """Make Triton's `driver.active` the torch-answered driver, unless Triton's real driver is
    already active (then nothing is built by asking it again). Returns the driver set, or None."""
    from triton.runtime import driver

    if driver._active is not None:
        return driver._active if isinstance(driver._active, TorchAnsweredDriver) else None
    answered = TorchAnsweredDriver(driver)
    driver.set_active(answered)
    return answered


def restore() -> None:
    """Give Triton back its own driver (uninstall, tests)."""
    from triton.runtime import driver

    if isinstance(driver._active, TorchAnsweredDriver):
        driver._active = None


# triton/backends/nvidia/driver.c getDeviceProperties: the CUdevice_attribute each property is read from
# (cuda.h values), in the dict Triton returns. Shared memory is the per-block opt-in maximum, except on sm_107
# (MAX_OVERSIZED_SHARED_MEMORY_PER_BLOCK, 150), as driver.c does.
DEVICE_PROPERTIES: tuple[tuple[str, int], ...] = (
    ("max_shared_mem", 97), ("max_num_regs", 12), ("multiprocessor_count", 16), ("warpSize", 10),
    ("sm_clock_rate", 13), ("mem_clock_rate", 36), ("mem_bus_width", 37))
_OVERSIZED_SHARED_MEMORY, _CAPABILITY_MAJOR, _CAPABILITY_MINOR = 150, 75, 76


def _libcuda() -> Any:
    """The driver library torch has already loaded (no second copy, no search: the soname)."""
    import ctypes

    return ctypes.CDLL("libcuda.so.1")


class AnsweredUtils:
    """Stands as `driver.active.utils`: `get_device_properties` from the CUDA driver's attributes, as Triton's
    driver.c reads them; anything else from Triton's own utils (built on first use)."""

    def __init__(self, driver: TorchAnsweredDriver) -> None:
        self._driver = driver

    def get_device_properties(self, device: int) -> dict[str, int]:
        import ctypes

        import torch

        from nojit.loader.errors import LaunchError

        try:
            torch.cuda.init()  # cuInit, as Triton's driver would have done by now
            lib = _libcuda()
        except (RuntimeError, AssertionError, OSError) as exc:  # torch's error (no driver, CUDA unusable after a
            # fork), or dlopen's (no libcuda.so.1): said with torch's or the loader's own words
            raise LaunchError(f"Triton's get_device_properties of device {device}: CUDA cannot be used in this "
                              f"process ({type(exc).__name__}: {str(exc)[:200]})",
                              fix="run where the NVIDIA driver (libcuda.so.1) and the GPU are visible to this process, "
                                  "and CUDA is not initialised before a fork") from None
        dev = ctypes.c_int(0)

        def attribute(number: int) -> int:
            value = ctypes.c_int(0)
            rc = lib.cuDeviceGetAttribute(ctypes.byref(value), number, dev)
            if rc != 0:
                raise LaunchError(f"the CUDA driver answered {rc} to cuDeviceGetAttribute({number}) of device {device}",
                                  fix="run where the NVIDIA driver and the GPU are visible to this process")
            return value.value

        if lib.cuDeviceGet(ctypes.byref(dev), int(device)) != 0:
            raise LaunchError(f"no CUDA device {device} for Triton's get_device_properties",
                              fix="check CUDA_VISIBLE_DEVICES")
        out = {name: attribute(number) for name, number in DEVICE_PROPERTIES}
        if (attribute(_CAPABILITY_MAJOR), attribute(_CAPABILITY_MINOR)) == (10, 7):
            out["max_shared_mem"] = attribute(_OVERSIZED_SHARED_MEMORY)
        return out

    def get_current_device(self) -> int:
        return self._driver.get_current_device()

    def get_device_capability(self, device: int) -> tuple[int, int]:
        return self._driver.get_device_capability(device)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._driver._real_config.default.utils, name)

