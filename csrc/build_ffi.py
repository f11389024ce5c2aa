"""cffi (API mode) builder for nojit's C launcher; run by setuptools at wheel-build time only.

The extension is built against the stable ABI (abi3), so one wheel serves every CPython
from 3.10 on. It links no CUDA library: libcuda.so.1 is opened with dlopen at run time.
"""

from __future__ import annotations

import os

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))

ffibuilder = FFI()
with open(os.path.join(HERE, "nojit_cuda.h")) as header:
    # One declaration of the API: the header's marked region is also the cdef.
    text = header.read()
ffibuilder.cdef(text.split("cdef-begin", 1)[1].split("*/", 1)[1].split("/* cdef-end */", 1)[0])
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
