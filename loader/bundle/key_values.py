"""Compile-time values inside keys: tagged with their type so that True, 1 and 1.0 stay distinct.

Both runtimes' keys (Triton constexprs and launch options, TileLang's phase-1 arguments)
hold plain Python values; in a dict key `True == 1 == 1.0`, so each value travels as
(type name, value). The same tagged pairs are what bundles store as JSON.
"""

from __future__ import annotations

from typing import Any


class UnsupportedArgument(Exception):
    """An argument kind the bundle cannot serve (tuples, tensor descriptors, exotic constexprs)."""


_PLAIN_TYPES = {int: "int", bool: "bool", float: "float", str: "str", type(None): "NoneType"}
_INFINITIES = (float("inf"), float("-inf"))


def tag(value: Any) -> tuple[str, Any]:
    """A constexpr or option value with its type, hashable and JSON-representable.

    Non-finite floats (vLLM passes -inf mask values as constexprs) are tagged by their
    repr, "inf", "-inf" or "nan": JSON has no such numbers, and NaN would not equal itself.
    """
    name = _PLAIN_TYPES.get(value.__class__)
    if name is not None:
        if name == "float" and (value != value or value in _INFINITIES):
            return ("float", repr(value))
        return (name, value)
    cls = value.__class__.__name__
    if cls == "dtype":  # triton.language.dtype
        return ("dtype", str(value))
    if cls == "constexpr":  # triton.language.constexpr wrapping a plain value
        return tag(value.value)
    if cls == "JITFunction":
        return ("jit", value.cache_key)
    if isinstance(value, tuple):
        return ("tuple", tuple(tag(v) for v in value))
    raise UnsupportedArgument(f"constexpr value of type {type(value).__name__} ({value!r})")


def untag(tagged: tuple[str, Any]) -> Any:
    """The value `tag` tagged (a dtype comes back as triton.language.dtype)."""
    kind, value = tagged
    if kind == "float" and isinstance(value, str):  # inf, -inf, nan
        return float(value)
    if kind in ("int", "bool", "float", "str", "NoneType"):
        return value
    if kind == "dtype":
        import triton.language as tl

        return tl.dtype(value)
    if kind == "tuple":
        return tuple(untag(v) for v in value)
    raise UnsupportedArgument(f"cannot rebuild a value of kind {kind!r} from a key")


_TAG_TYPES = {"int": int, "bool": bool, "float": (float, int, str), "str": str, "NoneType": type(None), "dtype": str,
              "jit": str}


def check_tagged(value: Any, depth: int = 0) -> None:
    """Raise ValueError unless `value` is the JSON form of a tagged value ([type name, value]), as `tag` writes it."""
    if depth > 8:
        raise ValueError("tagged value nested too deeply")
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str)):
        raise ValueError(f"{value!r:.80} is not a [type, value] pair")
    name, v = value
    if name == "tuple":
        if not isinstance(v, (list, tuple)):
            raise ValueError(f"tuple value {v!r:.80} is not a list")
        for item in v:
            check_tagged(item, depth + 1)
        return
    kind = _TAG_TYPES.get(name)
    if kind is None:
        raise ValueError(f"unknown value type {name!r:.40}")
    if isinstance(v, bool) and name != "bool" or not isinstance(v, kind):
        raise ValueError(f"{v!r:.80} is not a {name}")
    if name == "float" and isinstance(v, str) and v not in ("inf", "-inf", "nan"):
        raise ValueError(f"float {v!r:.40} is not inf, -inf or nan")
