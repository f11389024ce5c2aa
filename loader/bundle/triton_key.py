"""The Triton specialization key: computed per call exactly as Triton's binder would, and its JSON form.

Triton picks a compiled variant from the call's arguments: per parameter a type and an
attribute (ints == 1 become the constant 1, ints and pointers divisible by 16 get
'D', bools/floats/None are never value-specialized, do_not_specialize and
do_not_specialize_on_alignment switch parts of that off), plus the launch options passed
as keywords. This module reproduces that rule without running Triton's binder, so the
loader can find the precompiled cubin in a few microseconds, and it is the one place that
defines how such a key is written into a bundle.

Key value (hashable, used for lookups):
    (spec, options)
    spec    = one item per kernel parameter:
              ("constexpr", tagged)   compile-time value (declared constexpr, None, int 1)
              (type, attr)            run-time value: type "i32", "*bf16", ...; attr "D", "",
                                      None, or a tagged int (annotated ints)
    options = sorted (name, tagged) pairs of the keyword options (num_warps, launch_pdl, ...)
    tagged  = (python type name, value), so that True, 1 and 1.0 stay distinct keys.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

from nojit.loader.bundle.key_values import UnsupportedArgument, check_tagged, tag

SpecItem = tuple[Any, Any]
Key = tuple[tuple[SpecItem, ...], tuple[tuple[str, Any], ...]]



_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_UINT64_MAX = (1 << 64) - 1
_ONE = ("constexpr", ("int", 1))
_NONE = ("constexpr", ("NoneType", None))
_U1 = ("u1", None)
_FP32 = ("fp32", None)


class ArgSpecializer:
    """Specializes one argument the way Triton's native_specialize_impl does.

    ptr_type maps a torch dtype to Triton's pointer type string ("*bf16"), computed once
    from Triton's own canonicalization so the two can never disagree.
    """

    def __init__(self, ptr_type: Callable[[Any, bool], str], tensor_cls: type | None) -> None:
        self._ptr_type = ptr_type
        self._cache: dict[tuple[Any, bool], str] = {}
        self._tensor_cls = tensor_cls or type(None)

    def pointer_type(self, dtype: Any, is_const: bool) -> str:
        try:
            return self._cache[(dtype, is_const)]
        except KeyError:
            ty = self._cache[(dtype, is_const)] = self._ptr_type(dtype, is_const)
            return ty

    def make(self, is_const: bool, specialize: bool, align: bool) -> Callable[[Any], SpecItem]:
        """One specializer closure per (is_const, specialize, align) combination.

        Tensors come first (most arguments are), their (type, attr) tuples are cached per
        dtype, so a call allocates nothing for them.
        """
        tensor_cls = self._tensor_cls
        pointer_type = self.pointer_type
        tensor_items: dict[Any, tuple[SpecItem, SpecItem]] = {}

        def tensor_pair(dtype: Any) -> tuple[SpecItem, SpecItem]:
            ty = pointer_type(dtype, is_const)
            if not specialize:
                pair = ((ty, None), (ty, None))
            elif align:
                pair = ((ty, "D"), (ty, ""))
            else:
                pair = ((ty, ""), (ty, ""))
            tensor_items[dtype] = pair
            return pair

        def spec(v: Any) -> SpecItem:
            cls = v.__class__
            if cls is tensor_cls:
                pair = tensor_items.get(v.dtype) or tensor_pair(v.dtype)
                return pair[1] if v.data_ptr() & 15 else pair[0]
            if cls is int:
                if specialize and v == 1:
                    return _ONE
                if _INT32_MIN <= v <= _INT32_MAX:
                    ty = "i32"
                elif _INT64_MIN <= v <= _INT64_MAX:
                    ty = "i64"
                elif 0 <= v <= _UINT64_MAX:
                    ty = "u64"
                else:
                    raise UnsupportedArgument("integer to be specialized too large to represent")
                if not specialize:
                    return (ty, None)
                return (ty, "D" if align and not v & 15 else "")
            if cls is bool:
                return _U1
            if cls is float:
                return _FP32
            if v is None:
                return _NONE
            if cls is not tuple and hasattr(v, "data_ptr"):  # tensor subclasses, Triton's warmup stand-ins
                pair = tensor_pair(v.dtype)
                return pair[1] if v.data_ptr() & 15 else pair[0]
            name = cls.__name__
            if name == "constexpr":
                return ("constexpr", tag(v))
            if name == "JITFunction":
                return ("constexpr", ("jit", v.cache_key))
            raise UnsupportedArgument(f"argument of type {name} ({v!r:.80})")

        return spec


def _param_items(fn: Any, specializer: ArgSpecializer) -> list[tuple[str, Any, Any]]:
    """Per parameter: (kind, name, specializer closure or annotation type)."""
    items = []
    for p in fn.params:
        if p.is_constexpr:
            items.append(("constexpr", p.name, None))
            continue
        spec = specializer.make(bool(p.is_const), not p.do_not_specialize, not p.do_not_specialize_on_alignment)
        ann = p.annotation_type
        if ann:
            if ann == "u1" or ann[:2] in ("fp", "bf"):
                items.append(("fixed", p.name, (ann, None)))
            else:
                items.append(("annotated", p.name, (ann, spec)))
        else:
            items.append(("plain", p.name, spec))
    return items


def make_binder(fn: Any, specializer: ArgSpecializer) -> Callable[..., tuple[tuple[Any, ...], tuple[SpecItem, ...], dict]]:
    """A function with the kernel's own signature returning (bound args, spec, options).

    Generated once per kernel from the live JITFunction's parameters (names, defaults,
    constexpr, do_not_specialize*), like Triton's binder, so a call binds positional and
    keyword arguments and defaults with plain Python semantics and no inspect per call.
    The generated code uses the kernel's own parameter names (vLLM calls kernels with
    keywords); nojit's helpers live under names starting with `_nj_`, which no kernel uses.
    """
    sig = fn.signature
    namespace: dict[str, Any] = {"_nj_tag": tag}
    arglist, items, names = [], [], []
    for i, (kind, name, extra) in enumerate(_param_items(fn, specializer)):
        param = sig.parameters[name]
        if param.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD or name.startswith("_nj_") or not name.isidentifier():
            raise UnsupportedArgument(f"kernel {fn.__qualname__} parameter {name!r} ({param.kind.name})")
        names.append(name)
        if param.default is inspect.Parameter.empty:
            arglist.append(name)
        else:
            namespace[f"_nj_default_{i}"] = param.default
            arglist.append(f"{name}=_nj_default_{i}")
        if kind == "constexpr":
            items.append(f"('constexpr', _nj_tag({name}))")
        elif kind == "fixed":
            namespace[f"_nj_fixed_{i}"] = extra
            items.append(f"_nj_fixed_{i}")
        elif kind == "annotated":
            ann, spec = extra
            namespace[f"_nj_spec_{i}"] = spec
            items.append(f"({ann!r}, _nj_spec_{i}({name})[1])")
        else:
            namespace[f"_nj_spec_{i}"] = extra
            items.append(f"_nj_spec_{i}({name})")
    src = (
        f"def bind({', '.join(arglist + ['**_nj_options'])}):\n"
        f"    return ({', '.join(names)}{',' if names else ''}), ({', '.join(items)}{',' if items else ''}), _nj_options\n"
    )
    return generated(src, f"<nojit binder {fn.__module__}:{fn.__qualname__}>", namespace, "bind")


_GENERATED: dict[str, Any] = {}  # generated source text -> its code, compiled once per process


def generated(src: str, filename: str, namespace: dict[str, Any], name: str) -> Any:
    """The function `name` that `src` defines, executed in `namespace`. compile() runs once per distinct source
    text (kernels of one signature, a second install() in one process); each function keeps its own filename."""
    code = _GENERATED.get(src)
    if code is None:
        code = _GENERATED[src] = compile(src, filename, "exec")
    exec(code, namespace)
    made = namespace[name]
    if made.__code__.co_filename != filename:
        made.__code__ = made.__code__.replace(co_filename=filename)
    return made


def options_key(options: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, tag(v)) for k, v in options.items()))


def with_implicit_options(options: dict[str, Any], fn_debug: Any, debug_knob: bool, instrumentation_mode: str) -> dict[str, Any]:
    """A call's launch options plus the two Triton's `JITFunction.run` adds before binding: `debug`
    (the call's, else the kernel's, or the knob) and `instrumentation_mode` (the knob's)."""
    return {**options, "debug": options.get("debug", fn_debug) or debug_knob, "instrumentation_mode": instrumentation_mode}


# ---------------------------------------------------------------------------- conversion
def from_triton_specialization(specialization: Iterable[tuple[Any, Any]]) -> tuple[SpecItem, ...]:
    """Triton binder output -> our spec (used at build time and by the parity tests)."""
    out = []
    for ty, attr in specialization:
        if isinstance(ty, tuple):
            raise UnsupportedArgument("tuple arguments are not supported")
        if ty == "constexpr":
            out.append(("constexpr", tag(attr)))
        elif attr is None or isinstance(attr, str):
            out.append((ty, attr))
        else:
            out.append((ty, tag(attr)))
    return tuple(out)


def _to_json(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_to_json(v) for v in value]
    return value


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return tuple([_from_json(v) if isinstance(v, list) else v for v in value])
    return value


def key_to_json(key: Key) -> dict[str, Any]:
    spec, options = key
    return {"spec": _to_json(spec), "options": _to_json(options)}


def key_from_json(obj: Any) -> Key:
    """The lookup key of a bundle entry; ValueError unless every item has the form key_to_json writes."""
    if not isinstance(obj, dict) or set(obj) != {"spec", "options"}:
        raise ValueError("a Triton key is an object with 'spec' and 'options'")
    spec, options = obj["spec"], obj["options"]
    if not isinstance(spec, list) or not isinstance(options, list):
        raise ValueError("a Triton key's spec and options are lists")
    spec_items = []  # the key's tuples, built while checking (what _from_json would build, one pass)
    for item in spec:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and item[0]):
            raise ValueError(f"spec item {item!r:.80} is not [type, attribute]")
        ty, attr = item
        if ty == "constexpr":
            check_tagged(attr)
        elif ty.startswith("*"):
            if attr not in (None, "D", ""):
                raise ValueError(f"pointer attribute {attr!r:.40} is not D, '' or null")
        elif attr is not None and attr not in ("D", ""):
            check_tagged(attr)
        spec_items.append((ty, _from_json(attr) if attr.__class__ is list else attr))
    names = set()
    option_items = []
    for item in options:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)) or item[0] in names:
            raise ValueError(f"option {item!r:.80} is not a distinct [name, value]")
        names.add(item[0])
        value = item[1]
        check_tagged(value)
        option_items.append((item[0], _from_json(value)))
    try:
        key = (tuple(spec_items), tuple(option_items))
        hash(key)
    except (TypeError, RecursionError):
        raise ValueError("a Triton key holds an unhashable value") from None
    return key


def key_text(key: Key) -> str:
    """One line for humans and logs: `*bf16:D, i32:, constexpr=1 | num_warps=4`."""
    parts = []
    for ty, attr in key[0]:
        if ty == "constexpr":
            parts.append(f"{attr[1]!r}")
        else:
            parts.append(f"{ty}:{attr if isinstance(attr, str) else ('-' if attr is None else attr[1])}")
    opts = ", ".join(f"{k}={v[1]!r}" for k, v in key[1])
    return f"({', '.join(parts)}) | {opts}" if opts else f"({', '.join(parts)})"


def runtime_params(info: dict[str, Any], n: int) -> tuple[bool, ...]:
    """Which of a kernel's n parameters are passed at run time, from its record's info["constexpr"]
    (the indices the kernel declares tl.constexpr): the runtime_param of generic_spec and layout_spec."""
    constexpr = set(info.get("constexpr", []))
    return tuple(i not in constexpr for i in range(n))


def generic_spec(spec: tuple[SpecItem, ...], runtime_param: tuple[bool, ...]) -> tuple[SpecItem, ...]:
    """The universal variant of a spec: no value 1 baked in, no divisibility or alignment assumed.

    It keeps what changes the generated code's types (pointer dtypes, int widths, None-ness,
    the kernel's declared constexprs) and drops what only narrows the values it is valid
    for, so its cubin is correct for every run-time value of the same types.
    runtime_param[i] is False for parameters the kernel declares tl.constexpr.
    """
    out = []
    for item, runtime in zip(spec, runtime_param):
        ty, attr = item
        if not runtime:
            out.append(item)
        elif ty == "constexpr":
            out.append(("i32", "") if attr == ("int", 1) else item)  # None stays a constexpr None
        elif isinstance(attr, str):
            out.append((ty, ""))
        elif attr is None:
            out.append(item)
        else:  # annotated int carrying its value 1
            out.append((ty, ""))
    return tuple(out)


def layout_spec(spec: tuple[SpecItem, ...], runtime_param: tuple[bool, ...]) -> tuple[SpecItem, ...]:
    """The key of the generic entry laid out for calls like `spec`: its generic_spec with 'D' marks kept.

    Triton picks layouts (which thread holds which elements, hence the order of a reduction)
    from divisibility. A generic entry built from this spec keeps the marks for choosing
    layouts only and assumes nothing in its code (nojit.aot.runtimes.triton.compiler), so it is
    correct for any values and reduces in the same order as the JIT's cubin for `spec`.
    """
    return tuple((g[0], "D") if s[1] == "D" and g[1] == "" else g for s, g in zip(spec, generic_spec(spec, runtime_param)))


def hint_agreement(a: tuple[SpecItem, ...], b: tuple[SpecItem, ...]) -> int:
    """How many parameters two layout specs of one generic group mark alike (to pick the nearest entry)."""
    return sum(x[1] == y[1] for x, y in zip(a, b))
