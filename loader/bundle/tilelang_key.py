"""TileLang's key for a call, and the source digest of a TileLang kernel function, without TileLang.

TileLang (0.1.12, eager mode) keys a compiled kernel by its phase-1 key: every non-tensor
parameter of the kernel function, in signature order, defaults filled in, compared with
Python equality (phase 2 is empty for kernels that only use `T.dynamic`). The loader
reproduces that from the kernel function's own signature and the tensor-parameter names
the bundle recorded, so TileLang need not be importable where kernels are served.

Bundle JSON: {"args": [[name, [type, value]], ...]} (tagged, see key_values); the lookup
key is the tuple of plain values, so equality is TileLang's own (4 == 4.0).
"""

from __future__ import annotations

import hashlib
import inspect
import types
from collections.abc import Callable
from typing import Any

from nojit.loader.bundle.key_values import check_tagged, tag

MISSING = object()  # a tensor argument not given (TileLang's compile(**scalars) form)


def key_to_json(names: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
    return {"args": [[n, list(tag(v))] for n, v in zip(names, values)]}


def key_from_json(obj: Any) -> tuple[Any, ...]:
    if not isinstance(obj, dict) or set(obj) != {"args"} or not isinstance(obj["args"], list):
        raise ValueError("a TileLang key is an object with 'args'")
    out = []
    names = set()
    for item in obj["args"]:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], list) and len(item[1]) == 2) or item[0] in names:
            raise ValueError(f"malformed TileLang key item {item!r:.80}")
        check_tagged(item[1])
        if isinstance(item[1][1], list):
            raise ValueError(f"TileLang key item {item[0]!r} holds a list")
        names.add(item[0])
        out.append(item[1][1])
    return tuple(out)


def key_names(obj: dict[str, Any]) -> tuple[str, ...]:
    return tuple(item[0] for item in obj["args"])


def key_text(names: tuple[str, ...], values: tuple[Any, ...]) -> str:
    return "(" + ", ".join(f"{n}={v!r}" for n, v in zip(names, values)) + ")"


def make_binder(fn: Callable[..., Any], tensor_names: set[str]) -> tuple[Callable[..., Any], tuple[str, ...], tuple[str, ...]]:
    """A function with fn's signature returning (tensors in signature order, phase-1 key values).

    Tensors default to MISSING so the same binder serves `compile(**scalars)`.
    Returns (binder, tensor names in order, scalar names in order).
    """
    sig = inspect.signature(fn)
    arglist, tensors, scalars = [], [], []
    namespace: dict[str, Any] = {"_nj_missing": MISSING}
    for i, (name, p) in enumerate(sig.parameters.items()):
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or name.startswith("_nj_"):
            raise ValueError(f"TileLang kernel {fn.__qualname__} parameter {name!r} ({p.kind.name}) is not supported")
        if name in tensor_names:
            tensors.append(name)
            arglist.append(f"{name}=_nj_missing")
        elif p.default is inspect.Parameter.empty:
            scalars.append(name)
            arglist.append(f"{name}=_nj_missing")  # required, checked by the caller with a clear message
        else:
            scalars.append(name)
            namespace[f"_nj_default_{i}"] = p.default
            arglist.append(f"{name}=_nj_default_{i}")
    src = (f"def bind({', '.join(arglist)}):\n"
           f"    return ({''.join(t + ', ' for t in tensors)}), ({''.join(s + ', ' for s in scalars)})\n")
    exec(compile(src, f"<nojit TileLang binder {fn.__module__}:{fn.__qualname__}>", "exec"), namespace)
    return namespace["bind"], tuple(tensors), tuple(scalars)


def source_hash(fn: Callable[..., Any]) -> str:
    """Digest of what TileLang elaborates for fn: its source, the helpers it calls, the globals it reads.

    Module globals such as vLLM's ENABLE_PDL change the generated kernel without entering
    TileLang's key; their values are part of this digest, so a bundle built for another
    platform answer is refused instead of served.
    """
    h = hashlib.sha256()
    seen: set[int] = set()

    def visit(f: types.FunctionType, depth: int) -> None:
        if id(f) in seen or depth > 4:
            return
        seen.add(id(f))
        try:
            h.update(inspect.getsource(f).encode())
        except (OSError, TypeError):
            h.update(f.__qualname__.encode())
        g = f.__globals__
        for name in sorted(set(f.__code__.co_names)):
            if name not in g:
                continue
            v = g[name]
            if v is None or isinstance(v, (bool, int, float, str)):
                h.update(f"{name}={v!r};".encode())
            elif isinstance(v, types.FunctionType) and v.__module__ == f.__module__:
                visit(v, depth + 1)

    visit(fn, 0)
    return h.hexdigest()
