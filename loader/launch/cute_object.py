"""A bundled CuTeDSL object (`export_to_c`'s .o) loaded by CuTeDSL's own runtime: one loader for every room that
serves CuTeDSL objects (vLLM's CuTeDSL kernels, FlashInfer's `cached_compile` kernels)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from nojit.loader.bundle.file import Bundle
from nojit.loader.bundle.manifest import CuteLaunch, Entry
from nojit.loader.errors import LaunchError


def load_cute_object(bundle: Bundle, entry: Entry, kernel: str, prefix: str) -> tuple[Any, Any]:
    """(module, function) of `entry`'s object. CuTeDSL loads from a path, so the sha256-checked blob goes to a
    private (0600) temporary file, removed once loaded; the caller keeps the module alive."""
    import cutlass.cute as cute

    launch = entry.launch
    assert isinstance(launch, CuteLaunch)
    data = bundle.read_blob(entry.blob)  # sha256-checked
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".o")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        module = cute.runtime.load_module(path, enable_tvm_ffi="--enable-tvm-ffi" in launch.options)
        fn = getattr(module, launch.symbol)
    except Exception as exc:  # noqa: BLE001 - CuTeDSL's loader errors are not typed
        raise LaunchError(f"kernel {kernel}: CuTeDSL could not load the bundled object {entry.blob[:12]} "
                          f"({type(exc).__name__}: {str(exc)[:300]})",
                          fix="check that nvidia-cutlass-dsl and apache-tvm-ffi are the versions the bundle "
                          "names (`nojit inspect`), or rebuild the bundle") from None
    finally:
        os.unlink(path)
    return module, fn
