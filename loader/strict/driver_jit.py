"""The driver's PTX JIT compiler library (`libnvidia-ptxjitcompiler.so.*`), made unreadable to the strict tree on
request (NOJIT_UNREADABLE_PTX_JIT=1).

The loader patch (inprocess_guard.py) refuses PTX in processes that install nojit, and CUDA_DISABLE_PTX_JIT=1 did not
stop the driver's JIT on the H200; a child that never installs nojit and drops the variable still JIT-compiles raw
PTX. libcuda keeps its PTX compiler in this separate library and opens it only to compile: CUDA names the error for a
missing one (CUDA_ERROR_JIT_COMPILER_NOT_FOUND, 221), and minimal containers run without it. So, like NVRTC's builtins
(nvrtc_builtins.py), it can be taken from the whole tree. Opt-in: on the H200 (session 11,
tests/gpu/test_inprocess_gpu.py::test_the_driver_jit_library_unreadable_stops_ptx_in_a_child_and_cubins_still_run)
such a child's CUDA started, a cubin loaded and ran, and raw PTX got 221; but a cubin loaded after the refused PTX
failed with 999 (CUDA_ERROR_UNKNOWN), so a process that tries PTX first would break. PTX whose SASS is already in the
driver's JIT cache (~/.nv/ComputeCache, CUDA_CACHE_PATH) loads without this library, and CUDA_DISABLE_PTX_JIT=1 does
not stop that either (measured there: 223 with an empty cache, 0 with the PTX cached).

Copies are looked for where the driver's libraries live: the system library folders, the container toolkit's
/usr/local/nvidia/lib*, WSL's /usr/lib/wsl/lib, LD_LIBRARY_PATH, and the folder of a libcuda already loaded.
"""

from __future__ import annotations

import glob
import os

_NAME = "libnvidia-ptxjitcompiler.so*"
_FOLDERS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64",
            "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib")


def _loaded_libcuda_folders() -> list[str]:
    try:
        with open("/proc/self/maps") as f:
            return [os.path.dirname(line.split(None, 5)[5].strip()) for line in f
                    if len(line.split(None, 5)) == 6 and "/libcuda.so" in line]
    except OSError:
        return []


def find() -> list[str]:
    """The real paths of every copy of the driver's PTX JIT library found where the driver's libraries live."""
    folders = [*_FOLDERS, *(d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d),
               *_loaded_libcuda_folders()]
    copies = {os.path.realpath(p) for d in dict.fromkeys(folders) for p in glob.glob(os.path.join(d, _NAME))}
    return sorted(p for p in copies if os.path.isfile(p))
