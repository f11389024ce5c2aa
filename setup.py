"""Only here for cffi: builds the C launcher (csrc/) into nojit.loader._cuda_launcher at wheel-build time."""

from setuptools import setup

setup(
    cffi_modules=["csrc/build_ffi.py:ffibuilder"],
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
