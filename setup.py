"""Builds the C parts at wheel-build time: the cffi launcher (csrc/build_ffi.py) and the one-call
fast path (csrc/nojit_fast.c, a limited-API extension: it reads Python objects, which cffi cannot take)
and the in-process compiler guard (csrc/nojit_inproc.c)."""

from setuptools import Extension, setup

setup(
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    ext_modules=[
        Extension(
            "nojit.loader._fastlaunch",
            sources=["csrc/nojit_fast.c"],
            include_dirs=["csrc"],
            libraries=["m"],
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter", "-Wno-missing-field-initializers"],
            py_limited_api=True,
        ),
        Extension(  # strict mode's refusing stubs for NVRTC and nvJitLink (loader/strict/inprocess_guard.py)
            "nojit.loader._inproc",
            sources=["csrc/nojit_inproc.c"],
            define_macros=[("Py_LIMITED_API", "0x030A0000")],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
            py_limited_api=True,
        ),
    ],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
