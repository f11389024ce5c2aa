"""Humming's kernel cache, seeded from bundled cubins under the key this process's Humming computes.

Humming 0.1.19 (humming/jit/compiler.py `Compiler.compile`) keys a kernel by the md5-style hex of
    "<compiler class>$$nvrtc+<major>.<minor>$$<flags>$$<kernel_expr>$$<code>$$<every include/**.cuh path: mtime>"
(plus the patcher's source hash when the cubin is post-processed), and looks it up as
`$HUMMING_CACHE_DIR/<hash>/kernel.cubin`. Three parts of that key belong to the machine, not the kernel:
the header mtimes (pip writes install-time mtimes: measured, 63 headers, 63 distinct mtimes within 14 ms
of the install), the absolute include paths in the flags (Humming's install path, and the CUDA include
directories `filter_cuda_paths` finds), and the NVRTC version. A cache copied from the build box is
therefore never hit on another machine.

So nojit does not copy keys: it carries what the key is made of (compiler class, code, kernel_expr,
sm_version, fast-math and post-process flags) with the cubin, and in the serving process lets Humming's
own `Compiler.compile` compute the key and write its own cache layout, with its compile step (`_compile`,
which starts the NVRTC child) replaced for that one call by writing the bundled cubin. Humming's later
lookups in this process then hit (a hit never reaches `_compile`, so the strict guard on `_compile`
never fires and no process starts). What the mtimes stood for, the header contents, is checked instead:
the bundle records the sha256 of Humming's headers (`headers_digest`) and serving refuses other headers;
the NVRTC major.minor must equal the bundle's, since it selects flags (`-no-cache` from 12.9).
"""

from __future__ import annotations

import glob
import hashlib
import os
import threading
from typing import Any

from nojit.loader.errors import BundleCorruptError, BundleMismatchError
from nojit.loader.private_dir import open_private

_lock = threading.Lock()


def headers_digest() -> str:
    """sha256 over Humming's include/**/*.cuh (relative path and content): what its mtime key stands for."""
    from humming.jit.compiler import Compiler

    root = Compiler.humming_include_dir()
    h = hashlib.sha256()
    for path in sorted(glob.glob(f"{root}/**/*.cuh", recursive=True)):
        with open(path, "rb") as f:
            data = f.read()
        h.update(f"{os.path.relpath(path, root)}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def nvrtc_version(compiler_cls: Any) -> str:
    return compiler_cls.signature()  # e.g. "nvrtc+13.0": Humming's own probe (a ctypes call, no process)


def check_compatible(built_headers: str, built_compiler: str, compiler_cls: Any, bundle_path: str) -> None:
    here_headers, here_compiler = headers_digest(), nvrtc_version(compiler_cls)
    if here_headers != built_headers or here_compiler != built_compiler:
        raise BundleMismatchError(
            f"bundle {bundle_path} holds Humming kernels built from headers {built_headers[:12]} with "
            f"{built_compiler}; this process has headers {here_headers[:12]} and {here_compiler}",
            fix="install the humming-kernels and nvidia-cuda-nvrtc versions the bundle was built with, or rebuild it")


def seed(compiler_cls: Any, code: str, sm_version: str, kernel_expr: str | None, disable_fast_math: bool,
         postprocessed: bool, cubin: bytes, digest: str) -> str:
    """Put `cubin` where this process's Humming will look for this kernel; returns the path (read-only)."""

    def from_bundle(cls: Any, source_path: str, cache_dirname: Any, sm: str, expr: Any, flags: Any) -> tuple:
        where = os.fspath(cache_dirname)  # <HUMMING_CACHE_DIR>/<key>: Humming just made it, with its umask's mode
        with open_private(os.path.dirname(where)) as cache, cache.child(os.path.basename(where), tighten=True) as folder:
            folder.write("kernel_tmp.cubin", cubin, 0o444)
        return 0, "nojit: from the bundle\n", ""

    with _lock:  # the class attribute is swapped for this one call
        previous = compiler_cls.__dict__.get("_compile")
        compiler_cls._compile = classmethod(from_bundle)
        try:
            path = compiler_cls.compile(code, sm_version=sm_version, kernel_expr=kernel_expr,
                                        disable_fast_math=disable_fast_math,
                                        postprocess_cubin=(lambda _path: None) if postprocessed else None)
        finally:
            if previous is None:
                del compiler_cls._compile
            else:
                compiler_cls._compile = previous
    where, name = os.path.split(path)
    with open_private(os.path.dirname(where)) as cache, cache.child(os.path.basename(where), tighten=True) as folder:
        if folder.sha256(name) != digest:
            raise BundleCorruptError(f"Humming cache entry {path} does not hold the bundled cubin {digest[:12]}",
                                     fix=f"remove {os.path.dirname(path)}: it is written again from the bundle")
        folder.fchmod_file(name, 0o444)
    return path
