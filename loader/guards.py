"""Strict mode's guarantee that nothing compiles in this process.

Bundled kernels never reach a compiler, but anything else could: a kernel the bundle does
not know, a key it lacks, a Triton helper that builds its C launcher with gcc, TileLang
lowering, the driver JIT-compiling PTX. In strict mode every such entry point raises
CompileForbiddenError naming what tried to compile, and the process cannot start a
compiler binary at all (an audit hook refuses it before the process is created).
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from nojit.loader.errors import CompileForbiddenError

COMPILER_BINARIES = frozenset(
    {"gcc", "g++", "cc", "c++", "clang", "clang++", "ld", "ptxas", "nvcc", "nvlink", "fatbinary", "cicc", "ptxas-blackwell"}
)
_FIX = (
    "this process runs in NOJIT_MODE=strict: add the kernel/key to the bundle (NOJIT_MODE=record, then "
    "`nojit build --add-keys`), or run with NOJIT_MODE=permissive to allow the JIT"
)

_lock = threading.Lock()
_state: dict[str, Any] = {"audit": False, "triton": False, "tilelang": False, "active": False}
compile_attempts: list[str] = []


def _forbid(what: str) -> CompileForbiddenError:
    compile_attempts.append(what)
    return CompileForbiddenError(f"strict mode: {what}", fix=_FIX)


def _executable_of(args: Any) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        first = os.fsdecode(args).split()[0] if os.fsdecode(args).strip() else ""
    elif isinstance(args, (list, tuple)) and args:
        first = os.fsdecode(args[0])
    else:
        return ""
    return os.path.basename(first)


def _audit(event: str, args: tuple) -> None:
    if not _state["active"]:
        return
    if event == "subprocess.Popen":
        exe = _executable_of(args[0]) if args[0] is not None else _executable_of(args[1])
        if exe in COMPILER_BINARIES or exe.endswith(("-gcc", "-g++")):
            raise _forbid(f"a compiler process ({exe}) was about to start")
    elif event in ("os.system", "os.posix_spawn", "os.exec"):
        exe = _executable_of(args[0])
        if exe in COMPILER_BINARIES:
            raise _forbid(f"a compiler process ({exe}) was about to start")


def install_strict_guards() -> None:
    """Idempotent. Guards what is importable now; call again after importing Triton/TileLang."""
    with _lock:
        _state["active"] = True
        # The driver must never JIT-compile PTX: bundled cubins carry SASS only.
        os.environ.setdefault("CUDA_DISABLE_PTX_JIT", "1")
        if not _state["audit"]:
            sys.addaudithook(_audit)  # cannot be removed; inert while no strict install is active
            _state["audit"] = True
        if not _state["triton"] and "triton" in sys.modules:
            _guard_triton()
            _state["triton"] = True
        if not _state["tilelang"] and "tilelang" in sys.modules:
            _guard_tilelang()
            _state["tilelang"] = True


_restore: list[tuple[Any, str, Any]] = []


def _patch(obj: Any, name: str, value: Any) -> None:
    _restore.append((obj, name, getattr(obj, name)))
    setattr(obj, name, value)


def deactivate() -> None:
    """Undo the guards (uninstall, tests): restores what was patched; the audit hook goes inert."""
    with _lock:
        _state["active"] = False
        while _restore:
            obj, name, value = _restore.pop()
            setattr(obj, name, value)
        _state["triton"] = _state["tilelang"] = False


def _guard_triton() -> None:
    import triton
    import triton.compiler.compiler as compiler_mod
    from triton.runtime.jit import JITFunction

    def no_do_compile(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        raise _forbid(f"Triton was about to compile {self.__module__}:{self.__qualname__} for key {key}")

    def no_compile(src: Any, *args: Any, **kwargs: Any) -> Any:
        name = getattr(getattr(src, "fn", None), "__qualname__", src)
        raise _forbid(f"triton.compile was called for {name}")

    _patch(JITFunction, "_do_compile", no_do_compile)
    _patch(compiler_mod, "compile", no_compile)
    _patch(triton, "compile", no_compile)
    knobs = getattr(triton, "knobs", None)
    build = getattr(knobs, "build", None)
    if build is not None and hasattr(build, "impl"):

        def no_build(name: str, *args: Any, **kwargs: Any) -> str:
            raise _forbid(f"Triton was about to build its C module {name} with a host compiler")

        _patch(build, "impl", no_build)


def _guard_tilelang() -> None:
    import tilelang

    def no_compile(*args: Any, **kwargs: Any) -> Any:
        raise _forbid("TileLang was about to compile a kernel")

    _patch(tilelang, "compile", no_compile)
    impl = getattr(sys.modules.get("tilelang.jit"), "JITImpl", None)
    if impl is not None:
        _patch(impl, "compile", no_compile)
        _patch(impl, "par_compile", no_compile)
