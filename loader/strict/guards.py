"""Strict mode's guarantee that nothing compiles in this process.

Bundled kernels never reach a compiler, but anything else could: a kernel the bundle does
not know, a key it lacks, a Triton helper that builds its C launcher with gcc, TileLang
lowering, the driver JIT-compiling PTX. In strict mode every such entry point raises
CompileForbiddenError naming what tried to compile, and the process cannot start a
compiler binary at all: an audit hook refuses it before the process is created (any path,
versioned and target-prefixed names, `env gcc`, `sh -c "... gcc ..."`, os.system, os.popen;
a version probe such as `nvcc --version` is let through), and firewall.py's stand-ins refuse
what does not pass through Python. The guards cover Triton (every re-export of its compile),
TileLang, CuTeDSL (`cutlass.cute.compile`) and Humming (its compile step; a cache hit stays),
whether they are imported before or after `install_strict_guards()`: an import hook applies
the guard when such a module finishes loading. All of it is Python-level patching done once;
nothing runs on a kernel launch, so CUDA-graph capture is untouched.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import re
import shlex
import sys
import threading
from collections.abc import Callable
from typing import Any

from nojit.loader.strict import firewall
from nojit.loader.strict import inprocess_guard
from nojit.loader.errors import CompileForbiddenError

COMPILER_BINARIES = frozenset(
    {"gcc", "g++", "cc", "c++", "clang", "clang++", "ld", "ptxas", "nvcc", "nvlink", "fatbinary", "cicc", "ptxas-blackwell"}
)
_FIX = (
    "this process runs in NOJIT_MODE=strict: add the kernel/key to the bundle (NOJIT_MODE=record, then "
    "`nojit build --add-keys`), or run with NOJIT_MODE=permissive to allow the JIT"
)

_lock = threading.RLock()
_state: dict[str, Any] = {"audit": False, "hook": False, "active": False}
_guarded: set[str] = set()  # modules of _LIBRARY_GUARDS whose library is guarded now
compile_attempts: list[str] = []


def _forbid(what: str, event: dict[str, Any] | None = None) -> CompileForbiddenError:
    compile_attempts.append(what)
    firewall.log_event({"event": "compile_forbidden", "what": what, **(event or {})})
    return CompileForbiddenError(f"strict mode: {what}", fix=_FIX)


_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "busybox"})
# words that run the command that follows them (their own options and, for timeout, a duration skipped)
_WRAPPERS = frozenset({"env", "exec", "command", "nice", "nohup", "time", "timeout", "stdbuf", "xargs", "setsid",
                       "ionice", "chrt", "taskset", "unbuffer", "builtin"})
_SEPARATORS = frozenset({";", "&&", "||", "|", "&", "(", ")", "|&", ";;", "\n"})
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*", re.S)
_EXEC_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn"})


def _compiler_in_argv(argv: list[str]) -> list[str] | None:
    """The compiler command (argv) this command line starts, unless it is a version probe; None if none."""
    i = 0
    while i < len(argv):
        word = os.path.basename(argv[i])
        if _ASSIGNMENT.fullmatch(argv[i]):
            i += 1  # VAR=value before the command
            continue
        if word in _SHELLS:
            if "-c" in argv[i + 1:]:
                j = argv.index("-c", i + 1)
                return _compiler_in_shell(argv[j + 1]) if j + 1 < len(argv) else None
            return None
        if word in _WRAPPERS:
            i += 1
            while i < len(argv) and (argv[i].startswith("-") or "=" in argv[i]
                                     or (word == "timeout" and argv[i][:1].isdigit())):
                i += 1
            continue
        if firewall.family_of(word) is not None:
            return None if firewall.is_version_probe([word, *argv[i + 1:]]) else argv[i:]
        return None
    return None


def _compiler_in_shell(command: str) -> list[str] | None:
    """The first compiler command a shell command line starts (every simple command is checked)."""
    try:
        lexer = shlex.shlex(command.replace("\n", " ; "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:
        tokens = command.split()
    simple: list[str] = []
    i = 0
    while i <= len(tokens):
        tok = tokens[i] if i < len(tokens) else ";"
        if tok and set(tok) <= set("<>&|;()") and ("<" in tok or ">" in tok):
            if simple and simple[-1].isdigit():
                simple.pop()  # the fd of 2>&1
            i += 2  # the redirection and its target
            continue
        if tok in _SEPARATORS or tok.startswith(("$(", "`")):
            found = _compiler_in_argv(simple) if simple else None
            if found:
                return found
            simple = []
        else:
            simple.append(tok.lstrip("`").rstrip("`"))
        i += 1
    return None


def _argv_of(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, (str, bytes, os.PathLike)):
        return [os.fsdecode(value)]
    try:
        return [os.fsdecode(a) for a in value]
    except TypeError:
        return []


def _audit(event: str, args: tuple) -> None:
    if event not in _EXEC_EVENTS or not _state["active"]:
        return
    if event == "os.system":
        found = _compiler_in_shell(os.fsdecode(args[0]))
    elif event == "subprocess.Popen":
        argv = _argv_of(args[1])
        if args[0] is not None and argv:
            argv = [os.fsdecode(args[0]), *argv[1:]]  # what really runs is `executable`
        found = _compiler_in_argv(argv)
    else:  # os.exec / os.posix_spawn / os.spawn: (path, argv, env)
        argv = _argv_of(args[1]) if len(args) > 1 else []
        path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else ""
        found = _compiler_in_argv([path, *argv[1:]] if path else argv)
    if found:
        raise _forbid(f"a compiler process was about to start: {' '.join(found)[:500]}",
                      {"tool": os.path.basename(found[0]), "argv": found[:64], "via": event})


def install_strict_guards() -> None:
    """Idempotent. Guards what is importable now; call again after importing Triton/TileLang."""
    with _lock:
        _state["active"] = True
        # NVRTC, nvJitLink, NVVM patched in every loaded copy; the driver's PTX JIT off (bundled cubins are SASS)
        inprocess_guard.activate(_forbid, RunAfterImport)
        if not _state["audit"]:
            sys.addaudithook(_audit)  # cannot be removed; inert while no strict install is active
            _state["audit"] = True
        for module, guard in _LIBRARY_GUARDS.items():
            if module not in _guarded and module in sys.modules:
                guard()
                _guarded.add(module)
        if not _state["hook"]:
            sys.meta_path.insert(0, _GuardOnImport())
            _state["hook"] = True


class RunAfterImport(importlib.abc.MetaPathFinder):
    """Calls `after()` once a module that `wants(name)` has finished executing (libraries imported after install):
    finds the module's spec with the other finders and wraps that spec's loader's exec_module."""

    def __init__(self, wants: Callable[[str], bool], after: Callable[[], None]) -> None:
        self.wants = wants
        self.after = after

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not self.wants(fullname):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module
        after = self.after

        def exec_then_after(module: Any) -> None:
            run(module)
            sys.modules.setdefault(fullname, module)
            after()

        try:
            loader.exec_module = exec_then_after  # per-spec loader object (SourceFileLoader etc.)
        except AttributeError:
            return spec
        return spec


class _GuardOnImport(RunAfterImport):
    """Applies the strict guards when Triton/TileLang/CuTeDSL/Humming is imported after install."""

    def __init__(self) -> None:
        super().__init__(lambda name: name in _LIBRARY_GUARDS and _state["active"], install_strict_guards)


_restore: list[tuple[Any, str, Any]] = []


def _patch(obj: Any, name: str, value: Any) -> None:
    own = vars(obj).get(name) if isinstance(obj, type) else None  # keep a classmethod a classmethod
    _restore.append((obj, name, own if own is not None else getattr(obj, name)))
    setattr(obj, name, value)


def deactivate() -> None:
    """Undo the guards (uninstall, tests): restores what was patched; the audit hook goes inert."""
    with _lock:
        _state["active"] = False
        firewall.deactivate()
        inprocess_guard.deactivate()
        while _restore:
            obj, name, value = _restore.pop()
            setattr(obj, name, value)
        _guarded.clear()
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _GuardOnImport)]
        _state["hook"] = False


def _guard_triton() -> None:
    import triton
    import triton.compiler.compiler as compiler_mod
    from triton.runtime.jit import JITFunction

    def no_do_compile(self: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
        raise _forbid(f"Triton was about to compile {self.__module__}:{self.__qualname__} for key {key}")

    _patch(JITFunction, "_do_compile", no_do_compile)
    # triton.compile itself refuses: its code object is swapped, so every alias of it (triton.compile,
    # triton.compiler.compile, a `from triton import compile` anywhere, now or later) refuses, at no cost
    # per loaded module (scanning every module's namespace for aliases cost tens of ms once vLLM is loaded).
    original = compiler_mod.compile
    if getattr(getattr(original, "__code__", None), "co_freevars", None) == ():
        _patch(original, "__defaults__", None)
        _patch(original, "__kwdefaults__", None)
        _patch(original, "__code__", _refused_triton_compile.__code__)
        return _guard_triton_build(triton)

    def no_compile(*args: Any, **kwargs: Any) -> Any:
        raise refuse_triton_compile(args)

    for module in list(sys.modules.values()):  # a closure cannot take other code: replace every alias instead
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, value in list(namespace.items()):
            if value is original:
                _patch(module, name, no_compile)
    _guard_triton_build(triton)


def _guard_triton_build(triton: Any) -> None:
    knobs = getattr(triton, "knobs", None)
    build = getattr(knobs, "build", None)
    if build is not None and hasattr(build, "impl"):

        def no_build(name: str, *args: Any, **kwargs: Any) -> str:
            raise _forbid(f"Triton was about to build its C module {name} with a host compiler")

        _patch(build, "impl", no_build)


def _refused_triton_compile(*args: Any, **kwargs: Any) -> Any:
    """The code triton.compile runs in strict mode. It runs with Triton's module globals, so it names only
    builtins and reaches refuse_triton_compile through the import system."""
    raise __import__("nojit.loader.strict.guards", fromlist=["refuse_triton_compile"]).refuse_triton_compile(args)


def refuse_triton_compile(args: tuple) -> CompileForbiddenError:
    src = args[0] if args else None
    name = getattr(getattr(src, "fn", None), "__qualname__", src)
    return _forbid(f"triton.compile was called for {name}")


class _NoCuteCompile:
    """Stands in for `cutlass.cute.compile`, called directly or with options (`cute.compile[options](...)`, as
    FlashInfer's cached_compile calls it): either way the call raises CompileForbiddenError."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise _forbid("CuTeDSL (cutlass.cute.compile) was about to compile a kernel")

    def __getitem__(self, options: Any) -> _NoCuteCompile:
        return self


def _guard_cute() -> None:
    _patch(sys.modules["cutlass.cute"], "compile", _NoCuteCompile())


def _guard_humming() -> None:
    compiler = sys.modules["humming.jit.compiler"]

    def no_compile(cls: Any, *args: Any, **kwargs: Any) -> Any:
        raise _forbid(f"Humming ({cls.__name__}) was about to compile a kernel its cache does not hold")

    for cls in vars(compiler).values():
        if isinstance(cls, type) and "_compile" in vars(cls):
            _patch(cls, "_compile", classmethod(no_compile))


def _guard_tilelang() -> None:
    import tilelang

    def no_compile(*args: Any, **kwargs: Any) -> Any:
        raise _forbid("TileLang was about to compile a kernel")

    _patch(tilelang, "compile", no_compile)
    impl = getattr(sys.modules.get("tilelang.jit"), "JITImpl", None)
    if impl is not None:
        _patch(impl, "compile", no_compile)
        _patch(impl, "par_compile", no_compile)


# The module whose loading completes each library, and the guard applied once it is loaded (at install, or by
# _GuardOnImport when the library is imported later).
_LIBRARY_GUARDS: dict[str, Callable[[], None]] = {
    "triton": _guard_triton,
    "tilelang": _guard_tilelang,
    "cutlass.cute": _guard_cute,
    "humming.jit.compiler": _guard_humming,
}
