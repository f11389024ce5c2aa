"""Cubins that do not depend on where the build's packages are installed.

Triton writes each kernel's source file path into the line table of the cubin (the PTX
`.file` directives, from `JITCallable.file_name`, which is the absolute `co_filename`).
vLLM installed in two virtual environments at two paths therefore gives two different
cubins, with the same machine code, for every kernel, and two build machines cannot agree
on a bundle's digest. In a build worker, every JIT function's file name is reported as
its path below `site-packages/` (`vllm/models/deepseek_v4/sparse_mla.py`, the same in
every environment; a file outside site-packages, like an extracted kernel source on a GPU
machine, is named by its base name). Line numbers stay, so profilers still map SASS to
source lines. Nothing else in the compile reads the path.

The GPU check compiles its JIT reference with the same names (`tests/gpu/checks/check_triton.py`
calls canonical_source_paths()), so "bundled cubin == JIT cubin" stays a byte comparison.
"""

from __future__ import annotations

import os

CACHE_TAG = "srcpath1"  # cubins compiled with canonical file names are cached apart from older ones
_MARKERS = ("/site-packages/", "/dist-packages/")


def canonical_source_name(path: str) -> str:
    """The path below site-packages (or the base name of a file outside it)."""
    for marker in _MARKERS:
        if marker in path:
            return path.rpartition(marker)[2]
    return os.path.basename(path)


def canonical_source_paths() -> None:
    """Make every Triton JIT function in this process report a canonical file name to the compiler."""
    from triton.runtime import jit

    JITCallable = getattr(jit, "JITCallable", None) or jit.JITFunction  # JITCallable: Triton >= 3.5
    if isinstance(JITCallable.__dict__.get("file_name"), property):
        return

    def get(self: object) -> str:
        return canonical_source_name(self.__dict__["_nojit_file_name"])

    def set_(self: object, value: str) -> None:
        self.__dict__["_nojit_file_name"] = value

    # A data descriptor wins over the instance attribute set in JITCallable.__init__, also for
    # functions created (and named) before this call.
    for obj in _existing_jit_callables(JITCallable):
        obj.__dict__["_nojit_file_name"] = obj.__dict__.pop("file_name")
    JITCallable.file_name = property(get, set_)
    cache = os.environ.get("TRITON_CACHE_DIR")
    if cache and not cache.endswith(CACHE_TAG):
        os.environ["TRITON_CACHE_DIR"] = f"{cache}-{CACHE_TAG}"


def _existing_jit_callables(cls: type) -> list:
    import gc

    return [o for o in gc.get_objects() if issubclass(type(o), cls) and "file_name" in o.__dict__]
