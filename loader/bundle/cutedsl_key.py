"""CuTeDSL compile keys in the bundle: vLLM's own key objects, written as tagged JSON and read back.

vLLM keys a CuTeDSL executor by a frozen `CompileKey` dataclass per owner
(`VllmCuTeDSLJitKernel._compiled_cache[compile_key]`, model_executor/warmup/jit_warmup.py
`_get_or_compile`). Its fields are ints, bools, floats, strings and cutlass numeric types
(`cutlass.BFloat16`, ...). The JSON form tags every value with its type, so that the key read
back is equal (and hashes equal) to the one vLLM's `dispatch` builds at run time:
`["int", 4]`, `["bool", true]`, `["float", 448.0]`, `["str", "x"]`, `["none", null]`,
`["cutlass", "BFloat16"]` (an attribute of the `cutlass` package), `["torch", "float32"]`,
`["tuple", [...]]`, and for the dataclass itself `["key", "<qualname>", [[field, value], ...]]`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import sys
from typing import Any

_SCALARS = {"bool": bool, "int": int, "float": float, "str": str}


def key_to_json(key: Any) -> Any:
    """The tagged JSON form of a key (ValueError for a value it cannot represent)."""
    if dataclasses.is_dataclass(key) and not isinstance(key, type):
        return ["key", type(key).__qualname__,
                [[f.name, key_to_json(getattr(key, f.name))] for f in dataclasses.fields(key)]]
    if key is None:
        return ["none", None]
    if isinstance(key, bool):
        return ["bool", key]
    if isinstance(key, int):
        return ["int", key]
    if isinstance(key, float):
        if not math.isfinite(key):
            raise ValueError(f"non-finite float {key!r} in a CuTeDSL key")
        return ["float", key]
    if isinstance(key, str):
        return ["str", key]
    if isinstance(key, tuple):
        return ["tuple", [key_to_json(v) for v in key]]
    if isinstance(key, type) and key.__module__.startswith("cutlass"):
        cutlass = sys.modules.get("cutlass")
        if cutlass is not None and getattr(cutlass, key.__name__, None) is key:
            return ["cutlass", key.__name__]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(key, torch.dtype):
        return ["torch", str(key).removeprefix("torch.")]
    raise ValueError(f"cannot represent {type(key).__name__} {key!r:.80} in a CuTeDSL key")


def validate(obj: Any, depth: int = 0) -> None:
    """Structure check of a JSON key (manifest validation; no library imported)."""
    if depth > 8 or not isinstance(obj, list) or len(obj) < 2 or not isinstance(obj[0], str):
        raise ValueError(f"{str(obj)[:80]} is not a tagged value")
    tag, value = obj[0], obj[1]
    if tag == "key":
        if len(obj) != 3 or not isinstance(value, str) or not isinstance(obj[2], list):
            raise ValueError("a key is [\"key\", qualname, [[field, value], ...]]")
        for item in obj[2]:
            if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0].isidentifier()):
                raise ValueError(f"bad key field {str(item)[:80]}")
            validate(item[1], depth + 1)
    elif tag == "tuple":
        if not isinstance(value, list):
            raise ValueError("a tuple holds a list")
        for v in value:
            validate(v, depth + 1)
    elif tag in _SCALARS:
        if type(value) is not _SCALARS[tag] and not (tag == "float" and type(value) is int):
            raise ValueError(f"{tag} value {value!r:.40} has type {type(value).__name__}")
    elif tag in ("cutlass", "torch"):
        if not isinstance(value, str) or not value.isidentifier():
            raise ValueError(f"{tag} type name {value!r:.40} is not an identifier")
    elif tag != "none" or value is not None:
        raise ValueError(f"unknown tag {tag!r:.40}")


def key_from_json(obj: Any, key_class: type | None) -> Any:
    """The live key object for `obj`; `key_class` is the owner's CompileKey dataclass (None: keys are tuples)."""
    validate(obj)
    return _decode(obj, key_class)


def _decode(obj: list, key_class: type | None) -> Any:
    tag, value = obj[0], obj[1]
    if tag == "key":
        if key_class is None or key_class.__qualname__ != value:
            raise ValueError(f"the key names class {value}, the owner's is "
                             f"{getattr(key_class, '__qualname__', None)}")
        return key_class(**{name: _decode(v, None) for name, v in obj[2]})
    if tag == "tuple":
        return tuple(_decode(v, None) for v in value)
    if tag == "none":
        return None
    if tag == "float":
        return float(value)
    if tag in _SCALARS:
        return value
    if tag == "cutlass":
        import cutlass

        found = getattr(cutlass, value, None)
        if not isinstance(found, type):
            raise ValueError(f"cutlass has no type {value}")
        return found
    import torch

    found = getattr(torch, value, None)
    if not isinstance(found, torch.dtype):
        raise ValueError(f"torch has no dtype {value}")
    return found


def key_text(key_json: Any) -> str:
    """A short readable form for messages: Class(field=value, ...)."""
    try:
        return repr(_decode(key_json, None)) if key_json[0] != "key" else (
            f"{key_json[1]}(" + ", ".join(f"{n}={_decode(v, None)!r}" for n, v in key_json[2]) + ")")
    except Exception:  # noqa: BLE001 - a message must not fail
        return str(key_json)[:300]


def source_hash(modules: list[Any]) -> str:
    """sha256 over the text of the vLLM modules that define the kernel (the owner's module first: its kernel
    body, launch and key; then the modules its kernel body is built from, as the kernel record lists them)."""
    return source_hash_of_files([(m.__name__, m.__file__) for m in modules])


def source_hash_of_files(files: list[tuple[str, str]]) -> str:
    """source_hash over (module name, its file) pairs: the serving side hashes the files a record names without
    importing them (installed_modules.module_file)."""
    h = hashlib.sha256()
    for name, path in files:
        with open(path, "rb") as f:
            data = f.read()
        h.update(f"{name}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


# vLLM's router GEMM owner (model_executor/kernels/linear/cute_dsl/ll_bf16.py:112-115, 246-268) keeps dot-product
# executors under (M, K, bs, output_dtype) and split-K ones under (split_k, num_stages, output_dtype).
LL_BF16_CLASS = "vllm.model_executor.kernels.linear.cute_dsl.ll_bf16:LLBf16Gemm"


def cache_slot(owner: Any, key: Any) -> tuple[dict, Any]:
    """Where vLLM's owner keeps the executor of `key`: (the dict, the dict key)."""
    cls = type(owner)
    if f"{cls.__module__}:{cls.__qualname__}" == LL_BF16_CLASS:
        if key.backend == "splitk":
            return owner._splitk_cache, (key.split_k, key.num_stages, key.output_dtype)
        return owner._compiled_cache, (key.M, key.K, key.bs, key.output_dtype)
    return owner._compiled_cache, key  # VllmCuTeDSLJitKernel (warmup/jit_warmup.py _get_or_compile)
