"""A stand-in libcuda.so.1 that reports the GPU facts a test chooses (driver version, devices, capability).

Only the facts are faked: the code under test opens it with ctypes as it opens the real driver
(`nojit.loader.bundle.driver_floor.LIBCUDA` is the seam) and runs its real checks on the answers.
"""

from __future__ import annotations

import pathlib
import subprocess

_SOURCE = r"""
#include <string.h>
int cuDriverGetVersion(int *v) { *v = DRIVER; return 0; }
int cuInit(unsigned flags) { return DEVICES > 0 ? 0 : 100; }  /* 100: CUDA_ERROR_NO_DEVICE */
int cuDeviceGetCount(int *n) { *n = DEVICES; return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return i < DEVICES ? 0 : 101; }
int cuDeviceGetName(char *name, int len, int d) { strncpy(name, NAME, len); return 0; }
int cuDeviceGetAttribute(int *v, int attr, int d) {
  if (attr == 75) { *v = MAJOR; return 0; }   /* CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR */
  if (attr == 76) { *v = MINOR; return 0; }   /* ..._MINOR */
  return 1;
}
"""


def fake_libcuda(folder: pathlib.Path, driver: int = 13000, devices: int = 1, capability: tuple[int, int] = (9, 0),
                 name: str = "NVIDIA H200") -> str:
    """Compile the stand-in into `folder` and return its path."""
    src = folder / "fake_gpu.c"
    lib = folder / f"libcuda-{driver}-{devices}-{capability[0]}{capability[1]}.so"
    src.write_text(_SOURCE)
    subprocess.run(["cc", "-shared", "-fPIC", f"-DDRIVER={driver}", f"-DDEVICES={devices}",
                    f"-DMAJOR={capability[0]}", f"-DMINOR={capability[1]}", f'-DNAME="{name}"', str(src),
                    "-o", str(lib)], check=True)
    return str(lib)
