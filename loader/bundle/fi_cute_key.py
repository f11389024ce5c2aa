"""FlashInfer's CuTeDSL compile-cache keys in the bundle: the key FlashInfer's `cached_compile` looks up, as JSON.

FlashInfer keeps its CuTeDSL kernels (the gated-delta-rule prefill, ...) in one in-process dict,
`flashinfer/gdn_kernels/delta_rule_dsl/custom_compile_cache.py: _in_mem_compile_cache`, under
`(func._get_compile_key(), _compile_options_key(compile_options))`: the kernel object's class MRO plus the
attributes its `manual_cache_key(...)` names (bools, ints, None, tuples, torch dtypes, cutlass numeric types),
and `((OptionClass, value), ...)` of the `cute.compile` options. Nothing is on disk: every process compiles.
The JSON form is `["fi_cute", [mro "module:qualname", ...], [[attribute, value], ...], [[option class, value],
...]]`, each value tagged as in cutedsl_key (plus `["class", "module:qualname"]`), so a live key and a bundled
one compare as canonical JSON. The kernel id is the class that defines the key (the MRO's first).
"""

from __future__ import annotations

from typing import Any

from nojit.loader.bundle import cutedsl_key

TAG = "fi_cute"
MAX_ITEMS = 256


def class_path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _value(v: Any) -> Any:
    if isinstance(v, type) and not (v.__module__.startswith("cutlass") and _is_cutlass_numeric(v)):
        return ["class", class_path(v)]
    if isinstance(v, tuple):
        return ["tuple", [_value(x) for x in v]]
    return cutedsl_key.key_to_json(v)


def _is_cutlass_numeric(cls: type) -> bool:
    try:
        cutedsl_key.key_to_json(cls)
    except ValueError:
        return False
    return True


def key_to_json(key: Any) -> list[Any]:
    """The JSON form of one `cached_compile` key (ValueError for a key this codec cannot write: the automatic
    key of a class without `manual_cache_key`, whose MRO FlashInfer writes as a string, is written as such)."""
    if not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], tuple) and key[0]):
        raise ValueError(f"{str(key)[:120]} is not FlashInfer's (compile key, options key)")
    compile_key, options = key
    mro = compile_key[0]
    mro_json: Any = [class_path(c) for c in mro] if isinstance(mro, tuple) else ["str", str(mro)]
    attrs = []
    for item in compile_key[1:]:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError(f"compile-key item {str(item)[:80]} is not (attribute, value)")
        attrs.append([item[0], _value(item[1])])
    opts = []
    for item in options or ():
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], type)):
            raise ValueError(f"compile option {str(item)[:80]} is not (option class, value)")
        opts.append([class_path(item[0]), _value(item[1])])
    return [TAG, mro_json, attrs, opts if options is not None else None]


def kernel_of(key_json: list[Any]) -> str:
    """The kernel id of a key: the class that made it (the MRO's first)."""
    mro = key_json[1]
    return mro[0] if mro and mro[0] != "str" else "automatic:" + str(mro[1])[:200]


def validate(obj: Any) -> None:
    """Structure check of a JSON key (manifest validation; no library imported)."""
    if not (isinstance(obj, list) and len(obj) == 4 and obj[0] == TAG):
        raise ValueError(f"{str(obj)[:80]} is not [\"{TAG}\", mro, attributes, options]")
    _, mro, attrs, opts = obj
    if not (isinstance(mro, list) and 0 < len(mro) <= 64 and all(isinstance(c, str) and ":" in c for c in mro)):
        raise ValueError("the MRO is not a list of module:qualname")
    for items in (attrs, opts or []):
        if not isinstance(items, list) or len(items) > MAX_ITEMS:
            raise ValueError("attributes / options are not a list")
        for item in items:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                raise ValueError(f"{str(item)[:80]} is not [name, value]")
            if item[1][:1] != ["class"]:
                cutedsl_key.validate(item[1])


def key_text(key_json: Any) -> str:
    """A short readable form for messages: Class(attribute=value, ...) [options]."""
    try:
        def show(v: Any) -> str:
            if v[0] == "class":
                return v[1].rpartition(".")[2]
            if v[0] == "tuple":
                return "(" + ", ".join(show(x) for x in v[1]) + ")"
            if v[0] in ("cutlass", "torch"):
                return str(v[1])
            return repr(cutedsl_key._decode(v, None))
        attrs = ", ".join(f"{n}={show(v)}" for n, v in key_json[2])
        opts = ", ".join(f"{c.rpartition('.')[2]}={show(v)}" for c, v in key_json[3] or [])
        return f"{kernel_of(key_json).rpartition(':')[2]}({attrs}) [{opts}]"
    except Exception:  # noqa: BLE001 - a message must not fail
        return str(key_json)[:300]
