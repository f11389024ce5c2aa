"""Is a kernel's source what the bundle compiled? Answered from what the build recorded, without Triton's AST walk.

Triton's `JITFunction.cache_key` (the bundle's source hash) is made of the kernel's source text, its
starting line, and what each name and attribute the source reads resolved to when Triton walked its AST:
the `cache_key` of every @triton.jit function it calls (with `noinline`), and the value of every
constexpr global. Computing it walks the AST of the kernel and of every dependency: at first launch
that is most of the time spent preparing a kernel.

The build records those parts per function (`source_parts`: each function's source digest and starting
line, and every name/attribute path its walk read with a fingerprint of the value it found; see
aot/runtimes/triton/source_parts.py). If the live kernel and every dependency it reaches have the same
source digest and line, and every recorded path resolves (as Triton resolves it) to a value with the same
fingerprint, every input of Triton's key is the same, so its key is the bundle's. Anything else (no
record, another Triton, a path that now resolves differently, a changed source) is "not proven", and the
caller asks Triton's own `cache_key`, which then refuses or passes exactly as without this module.
"""

from __future__ import annotations

import functools
import hashlib
import sys
from types import ModuleType
from typing import Any

PARTS_VERSION = 1
LIBDEVICE = "triton.language.extra.libdevice"


def src_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def triton_version() -> str | None:
    return getattr(sys.modules.get("triton"), "__version__", None)


@functools.cache
def triton_parts() -> tuple[type, type, frozenset[str]]:
    """JITCallable, constexpr, and the module names Triton's walk does not look into (its own finder's set)."""
    from triton.language.core import constexpr
    from triton.runtime.jit import DependenciesFinder, JITCallable

    return JITCallable, constexpr, frozenset(DependenciesFinder("", {}, {}, "").supported_modules)


def fingerprint(val: Any) -> str | None:
    """What Triton's walk adds to the key for a value it found, as a string: equal fingerprints, equal
    contributions (None: a value the fast check does not handle: an aggregate, or one Triton refuses)."""
    jit_callable, constexpr, _ = triton_parts()
    if val is None:
        return "none"
    if type(val) is ModuleType:
        return "module:" + val.__name__
    if getattr(val, "__triton_aggregate__", False):
        return None
    if getattr(val, "__triton_builtin__", False):
        return "builtin:" + str(getattr(val, "__name__", ""))
    if getattr(val, "__module__", "") == LIBDEVICE:
        return "libdevice:" + str(getattr(val, "__name__", ""))
    if isinstance(val, jit_callable):
        return f"jit:{val.__module__}:{val.__qualname__}:{bool(getattr(val, 'noinline', False))}"
    if isinstance(val, constexpr):
        return "constexpr:" + repr(val)
    if callable(val) and not isinstance(val, type):
        return None
    return f"value:{type(val).__module__}.{type(val).__qualname__}"


def scope_lookup(fn: Any, name: str) -> Any:
    """A name as Triton's walk looks it up: the function's globals, then its closure."""
    val = fn.__globals__.get(name)
    if val is not None:
        return val
    closure = fn.fn.__closure__
    if closure:
        for free, cell in zip(fn.fn.__code__.co_freevars, closure):
            if free == name:
                try:
                    return cell.cell_contents
                except ValueError:  # an empty cell
                    return None
    return None


def resolve(fn: Any, path: list[str] | tuple[str, ...]) -> Any:
    """`a.b.c` as Triton's walk evaluates it: None past a missing value or one of Triton's own modules."""
    _, _, skipped = triton_parts()
    val = scope_lookup(fn, path[0])
    for attr in path[1:]:
        if val is None or getattr(val, "__name__", "") in skipped:
            return None
        val = getattr(val, attr, None)
    return val


def unchanged_since_build(fn: Any, parts: Any, source_hash: str) -> bool:
    """True only when the recorded parts prove `fn.cache_key == source_hash`; False: not proven (ask cache_key)."""
    if not isinstance(parts, dict) or parts.get("v") != PARTS_VERSION or parts.get("key") != source_hash:
        return False
    if parts.get("triton") != triton_version() or getattr(fn, "hash", None) is not None:
        return False  # another Triton's walk, or Triton holds the key already (then it costs nothing)
    fns = parts.get("fns")
    if not isinstance(fns, dict):
        return False
    try:
        return _matches(fn, parts.get("root"), fns, {})
    except Exception:  # a malformed record, a property that raises: not proven
        return False


def _matches(fn: Any, name: Any, fns: dict[str, Any], seen: dict[int, bool]) -> bool:
    if id(fn) in seen:
        return seen[id(fn)]
    seen[id(fn)] = False  # a cycle is not proven (Triton keys it with a placeholder)
    rec = fns.get(name) if isinstance(name, str) else None
    if not isinstance(rec, dict) or f"{fn.__module__}:{fn.__qualname__}" != name:
        return False
    if rec.get("line") != fn.starting_line_number or rec.get("src") != src_digest(fn.src):
        return False
    refs = rec.get("refs")
    if not isinstance(refs, list):
        return False
    for path, want in refs:
        val = resolve(fn, path)
        got = fingerprint(val)
        if got is None or got != want:
            return False
        if got.startswith("jit:") and not _matches(val, got[4:].rpartition(":")[0], fns, seen):
            return False
    seen[id(fn)] = True
    return True
