"""A CPU stand-in for nojit's C launcher and for torch's device questions, for tests with no GPU.

It stands where `nojit.loader.launch.cuda_launch.launcher()` returns the real CudaLauncher: module
loads are recorded (the cubin is read from the bundle and its sha256 checked, as a load
would), launches are recorded instead of reaching cuLaunchKernelEx, and the architecture
check the loader installs still runs once per device. Device 0 and stream 0 stand for the GPU.
Everything above it (bundle, key rules, servers, policy, vLLM) is the real code.
"""

from __future__ import annotations

import hashlib
from typing import Any

from nojit.loader.launch.cuda_launch import LoadedFunction


class DryRunLauncher:
    def __init__(self) -> None:
        self.loaded: dict[tuple[int, str], LoadedFunction] = {}
        self.launches: list[dict[str, Any]] = []
        self.device_check = None
        self._checked: set[int] = set()
        self.loads = 0

    @property
    def c_launch(self):
        return self._launch

    def new_error_buffer(self) -> bytearray:
        return bytearray(512)

    def error(self, err_buffer: Any, what: str, rc: int) -> Exception:
        from nojit.loader.errors import LaunchError

        return LaunchError(f"{what}: dry run (code {rc})", fix="none: a dry run")

    def function(self, device: int, blob: str, image_fn: Any, symbol: str, dynamic_smem: int) -> LoadedFunction:
        key = (device, blob)
        if key not in self.loaded:
            if device not in self._checked and self.device_check is not None:
                self.device_check(device)
            self._checked.add(device)
            image = image_fn()
            assert hashlib.sha256(image).hexdigest() == blob, f"cubin {blob[:12]} does not match its digest"
            self.loads += 1
            self.loaded[key] = LoadedFunction(len(self.loaded) + 1, len(self.loaded) + 1, 32, 1024)
        return self.loaded[key]

    def _launch(self, function: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int, stream: int,
                types_: bytes, args: list[int], nargs: int, *rest: Any) -> int:
        self.launches.append({"function": function, "grid": (gx, gy, gz), "block": (bx, by, bz)})
        return 0


def install_dry_run() -> DryRunLauncher:
    """Put the dry-run launcher and device 0 / stream 0 in place (before nojit installs a bundle)."""
    from nojit.loader.launch import cuda_launch
    from nojit.loader.runtimes.tilelang import serving as tilelang_serving
    from nojit.loader.launch import torch_cuda
    from nojit.loader.runtimes.triton import serving as triton_serving

    dry = DryRunLauncher()
    cuda_launch._launcher = dry  # type: ignore[assignment]
    for module in (torch_cuda, triton_serving, tilelang_serving):
        module.current_device = lambda: 0  # type: ignore[attr-defined]
        module.current_stream = lambda device: 0  # type: ignore[attr-defined]
    return dry
