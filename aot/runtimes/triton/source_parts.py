"""What Triton's `cache_key` of a kernel was made of, recorded at build for the loader's cheap exact check.

Triton's own DependenciesFinder walks each function (subclassed here only to note, for every name and
attribute path it reads, the value it found); the record holds per function its source digest, starting
line and those (path, fingerprint) pairs, for the kernel and every @triton.jit function it reaches.
nojit.loader.runtimes.triton.source_parts reads it at first launch. A kernel whose walk meets something the fingerprints do
not cover (an aggregate, a tuple's attribute, a dependency cycle, one constexpr name in two modules) gets
no record: the loader then asks Triton's cache_key, as before.
"""

from __future__ import annotations

import ast
from typing import Any

from nojit.loader.runtimes.triton.source_parts import (
    PARTS_VERSION,
    fingerprint,
    resolve,
    scope_lookup,
    src_digest,
    triton_parts,
    triton_version,
    unchanged_since_build,
)


def _skipped_modules() -> frozenset[str]:
    return triton_parts()[2]


class _Unsupported(Exception):
    pass


def _attribute_path(node: ast.Attribute) -> list[str] | None:
    parts = [node.attr]
    value = node.value
    while isinstance(value, ast.Attribute):
        parts.append(value.attr)
        value = value.value
    if not isinstance(value, ast.Name):
        return None
    parts.append(value.id)
    return parts[::-1]


def _trace(fn: Any) -> list[list[Any]]:
    """(path, fingerprint) for every name and attribute path Triton's walk of `fn` reads, in walk order."""
    from triton.runtime.jit import DependenciesFinder

    refs: list[list[Any]] = []

    class Tracer(DependenciesFinder):  # type: ignore[misc, valid-type]
        def visit_Name(self, node: ast.Name) -> Any:
            looked_up = not isinstance(node.ctx, ast.Store) and node.id not in getattr(self, "local_names", ())
            val = super().visit_Name(node)
            if looked_up:
                if val is not scope_lookup(fn, node.id):
                    raise _Unsupported(f"name {node.id} resolves differently")
                refs.append([[node.id], _fp(val)])
            return val

        def visit_Attribute(self, node: ast.Attribute) -> Any:
            path = _attribute_path(node)
            if path is None and isinstance(node.value, ast.Tuple):
                raise _Unsupported("an attribute of a tuple")
            local = path is not None and path[0] in getattr(self, "local_names", ())
            val = super().visit_Attribute(node)
            if path is not None and not local:
                if val is not resolve(fn, path):
                    raise _Unsupported(f"{'.'.join(path)} resolves differently")
                if not _cut(resolve(fn, path[:-1])):  # else None, fixed by the shorter path's own record
                    refs.append([path, _fp(val)])
            elif val is not None:
                raise _Unsupported("an attribute Triton resolved from a value the record cannot name")
            return val

    nonlocals = {}
    if fn.fn.__closure__:
        import inspect

        nonlocals = inspect.getclosurevars(fn.fn).nonlocals
    Tracer(name=fn._fn_name, globals=fn.__globals__, nonlocals=nonlocals, src=fn.src).visit(fn.parse())
    return refs


def _distinct(refs: list[list[Any]]) -> list[list[Any]]:
    """Each (path, fingerprint) once: the check tests each independently of order."""
    seen: set[tuple[tuple[str, ...], str]] = set()
    out = []
    for path, fp in refs:
        if (tuple(path), fp) not in seen:
            seen.add((tuple(path), fp))
            out.append([path, fp])
    return out


def _cut(lhs: Any) -> bool:
    """Triton's walk stops at this value (reads no attribute of it)."""
    return lhs is None or getattr(lhs, "__name__", "") in _skipped_modules()


def _fp(val: Any) -> str:
    got = fingerprint(val)
    if got is None:
        raise _Unsupported(f"a value the record does not cover: {type(val).__name__}")
    return got


def source_parts(fn: Any) -> dict[str, Any] | None:
    """The record for a Triton JITFunction (None where the loader must use cache_key: see the module doc)."""
    key = fn.cache_key
    fns: dict[str, Any] = {}
    constexpr_names: dict[str, str] = {}
    pending = [fn]
    try:
        while pending:
            f = pending.pop()
            name = f"{f.__module__}:{f.__qualname__}"
            if name in fns:
                continue
            refs = _distinct(_trace(f))
            fns[name] = {"src": src_digest(f.src), "line": f.starting_line_number, "refs": refs}
            for path, fp in refs:
                if fp.startswith("jit:"):
                    pending.append(resolve(f, path))
                elif fp.startswith("constexpr:") and len(path) == 1:
                    # Triton 3.6 orders constexpr globals by id() of their module's dict: one name in two
                    # modules could order differently from process to process.
                    prev = constexpr_names.setdefault(path[0], f.__module__)
                    if prev != f.__module__:
                        raise _Unsupported(f"constexpr {path[0]} in {prev} and {f.__module__}")
    except (_Unsupported, RecursionError):
        return None
    parts = {"v": PARTS_VERSION, "triton": triton_version(), "key": key, "root": f"{fn.__module__}:{fn.__qualname__}",
             "fns": fns}
    if not _proves(fn, parts):
        return None
    return parts


def _proves(fn: Any, parts: dict[str, Any]) -> bool:
    """The record must prove the key here, where it was made (Triton holds the key now: check past that)."""
    saved = fn.hash
    try:
        fn.hash = None
        return unchanged_since_build(fn, parts, parts["key"])
    finally:
        fn.hash = saved
