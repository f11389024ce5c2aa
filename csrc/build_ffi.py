"""cffi (API mode) builder for nojit's C launcher; run by setuptools at wheel-build time only.

The extension is built against the stable ABI (abi3), so one wheel serves every CPython
from 3.10 on. It links no CUDA library: libcuda.so.1 is opened with dlopen at run time.
"""

from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))

ffibuilder = FFI()
ffibuilder.cdef(
    """
    int nojit_init(char *err, size_t errlen);
    int nojit_driver_version(int *version, char *err, size_t errlen);
    int nojit_ensure_context(int device, char *err, size_t errlen);
    int nojit_load(const void *image, size_t image_size, const char *symbol, uint32_t dynamic_smem,
                   uint64_t *module_out, uint64_t *function_out, int *num_regs_out,
                   int *max_threads_out, char *err, size_t errlen);
    int nojit_unload(uint64_t module, char *err, size_t errlen);
    int nojit_launch(uint64_t function, uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                     uint32_t block_x, uint32_t block_y, uint32_t block_z, uint32_t shared_bytes,
                     uint64_t stream, const char *arg_types, const uint64_t *arg_values, int num_args,
                     uint32_t cluster_x, uint32_t cluster_y, uint32_t cluster_z, int pdl,
                     int cooperative, char *err, size_t errlen);
    """
)
ffibuilder.set_source(
    "nojit.loader._cuda_launcher",
    '#include "nojit_cuda.h"',
    sources=[os.path.relpath(os.path.join(HERE, "nojit_cuda.c"))],
    include_dirs=[os.path.relpath(HERE)],
    libraries=["dl", "pthread"],
    extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
    py_limited_api=True,
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
