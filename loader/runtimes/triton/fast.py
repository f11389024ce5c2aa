"""The one-call launch path for bundled Triton kernels (csrc/nojit_fast.c), prepared at install.

Per kernel and launch options, a C table holds the exact entries, each under the codes the C
side computes from a call's bound arguments (see the header of csrc/nojit_fast.c). Here the
same codes are computed from the bundle's keys, so a call whose key is an exact entry is
found, packed and launched by one C call. Anything else (generic entries, misses, scratch
buffers, exotic arguments) is a miss of the table and takes the Python path of
TritonKernelServer, which is the one definition of the key; the fast path can be slower to
say no, never wrong.

`run` is a C callable per kernel (`new_runner`): it binds the call's positional and keyword
arguments to the kernel's parameters, picks the table of the launch options, computes the grid,
reads torch's device and stream and launches, with no Python frame. Tensors and the stream are read
through torch's DLPack C exchange API where torch has one (`dlpack_status()`; csrc/nojit_dlpack.h).
Calls it hands back (warmup, options not seen yet, odd grids, misses) take a generated Python `run` and
the server's own.

`kernel[grid]` of a prepared kernel is bound in C too (`serve_getitem`): the JITFunction's class is
swapped for a subclass whose `__getitem__` returns a C callable bound to (runner, grid), so a call
skips Triton's `lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args, **kwargs)` and its
re-packing of keywords; what the runner does not take goes where it went through that lambda.
"""

from __future__ import annotations

import inspect
import math
import types
from typing import Any

from nojit.loader.errors import LaunchError
from nojit.loader.launch.fast_module import dlpack_status, ensure_launch_entry, fast_module  # noqa: F401
from nojit.loader.bundle.triton_key import Key, generated

# Codes shared with csrc/nojit_fast.c.
K_CONSTEXPR, K_PLAIN, K_ANNOT, K_FIXED = 0, 1, 2, 3
C_ONE, C_INT, C_BOOL, C_FLOAT, C_NONE, C_ANNOT, C_FIXED, C_TENSOR = 0x10, 0x20, 0x40, 0x50, 0x60, 0x70, 0x80, 0x1000
_ATTR = {None: 0, "D": 1, "": 2}
_INT_WIDTH = {"i32": 1, "i64": 2, "u64": 3}
_ANNOT_ATTR = {None: 0, "D": 1, "": 2, ("int", 1): 3, ("NoneType", None): 4}
_PLAIN_TAGS = {"int": int, "bool": bool, "float": float, "str": str}

def _untag(tagged: Any) -> tuple[bool, Any]:
    """(True, value) for a plain tagged constexpr value C can compare; (False, None) otherwise."""
    kind, value = tagged
    if kind == "NoneType":
        return True, None
    if kind == "float" and isinstance(value, str):
        return (value != "nan"), float(value)
    cls = _PLAIN_TAGS.get(kind)
    if cls is None or type(value) is not cls:
        return False, None
    return True, value


_POINTER_TYPES: dict[tuple[int, bool], tuple[str | None, ...]] = {}


def _pointer_types(specializer: Any, is_const: bool) -> tuple[str | None, ...]:
    """Triton's pointer type of every registered dtype (None: Triton cannot take it), once per process."""
    cache_key = (id(specializer), is_const)
    types = _POINTER_TYPES.get(cache_key)
    if types is None:
        out: list[str | None] = []
        for dtype in fast_module().dtypes:
            try:
                out.append(specializer.pointer_type(dtype, is_const))
            except Exception:  # a dtype Triton cannot take: never matches an entry
                out.append(None)
        types = _POINTER_TYPES[cache_key] = tuple(out)
    return types


_TYPE_IDS: dict[str, int] = {}  # Triton pointer type -> the type id C codes use (one numbering per process)
_POINTER_CODES: dict[tuple[int, bool], tuple[int, ...]] = {}


def _pointer_codes(specializer: Any, is_const: bool) -> tuple[int, ...]:
    """The type id of every registered dtype for a pointer parameter (0xFFFF: Triton cannot take it), once
    per process instead of once per kernel parameter."""
    cache_key = (id(specializer), is_const)
    codes = _POINTER_CODES.get(cache_key)
    if codes is None:
        codes = _POINTER_CODES[cache_key] = tuple(_TYPE_IDS.setdefault(ty, len(_TYPE_IDS)) if ty else 0xFFFF
                                                  for ty in _pointer_types(specializer, is_const))
    return codes


class TritonFastPath:
    """The C tables of one kernel: one per launch-options key holding its exact entries."""

    def __init__(self, fn: Any, specializer: Any, exact: dict[Key, Any]) -> None:
        m = fast_module()
        self.runner: Any = None  # the C runner of make_run (tests probe it)
        self.general: Any = None  # the generated Python run behind it
        self.tables_by_raw: dict[tuple, Any] = {}  # raw launch options -> table, filled by the general run
        self.kinds: list[int] = []
        self._tymap = _TYPE_IDS
        params = []
        candidates: list[list[Any]] = []
        for p in fn.params:
            cands: list[Any] = []
            candidates.append(cands)
            if p.is_constexpr:
                self.kinds.append(K_CONSTEXPR)
                params.append([K_CONSTEXPR, 0, 0, None, cands])
                continue
            ann = p.annotation_type
            kind = K_FIXED if ann and (ann == "u1" or ann[:2] in ("fp", "bf")) else K_ANNOT if ann else K_PLAIN
            self.kinds.append(kind)
            codes = _pointer_codes(specializer, bool(p.is_const))
            params.append([kind, int(not p.do_not_specialize), int(not p.do_not_specialize_on_alignment), codes, cands])
        self._candidates = candidates
        by_options: dict[tuple, list[tuple[tuple[int, ...], Any]]] = {}
        for (spec, okey), variant in exact.items():
            codes = self.codes(spec)
            if codes is None or variant._scratch or len(variant.launch.args) + 2 > 128:
                continue
            by_options.setdefault(okey, []).append((codes, variant))
        self.tables: dict[tuple, Any] = {}
        self.variants: dict[int, list[Any]] = {}  # id(table) -> variants by entry index
        for okey, items in by_options.items():
            table = m.new_table([(k, s, a, c, tuple(cands)) for k, s, a, c, cands in params])
            variants = []
            for codes, variant in items:
                launch = variant.launch
                cluster = variant._cluster
                m.add_entry(table, codes, variant, tuple(i for i, _ in launch.args),
                            "".join(code for _, code in launch.args).encode(), launch.num_ctas, 32 * launch.num_warps,
                            launch.shared, cluster[0], cluster[1], cluster[2], int(launch.launch_pdl),
                            int(launch.launch_cooperative_grid))
                variants.append(variant)
            self.tables[okey] = table
            self.variants[id(table)] = variants

    def codes(self, spec: tuple) -> tuple[int, ...] | None:
        """The C codes of a bundle key's spec; None where C cannot recognise it (served by Python)."""
        out = []
        for i, (kind, item) in enumerate(zip(self.kinds, spec)):
            ty, attr = item
            if kind == K_CONSTEXPR:
                if ty != "constexpr":
                    return None
                ok, value = _untag(attr)
                if not ok:
                    return None
                cands = self._candidates[i]
                for j, c in enumerate(cands):
                    if type(c) is type(value) and (c == value or (isinstance(c, float) and math.isnan(c))):
                        out.append(1 + j)
                        break
                else:
                    cands.append(value)
                    out.append(len(cands))
            elif kind == K_FIXED:
                out.append(C_FIXED)
            elif kind == K_ANNOT:
                if attr not in _ANNOT_ATTR:
                    return None
                out.append(C_ANNOT + _ANNOT_ATTR[attr])
            elif ty == "constexpr":
                if attr == ("int", 1):
                    out.append(C_ONE)
                elif attr == ("NoneType", None):
                    out.append(C_NONE)
                else:
                    return None
            elif (ty, attr) == ("u1", None):
                out.append(C_BOOL)
            elif (ty, attr) == ("fp32", None):
                out.append(C_FLOAT)
            elif attr not in _ATTR:
                return None
            elif ty.startswith("*"):
                if ty not in self._tymap:
                    return None
                out.append(C_TENSOR + 4 * self._tymap[ty] + _ATTR[attr])
            elif ty in _INT_WIDTH:
                out.append(C_INT + 4 * _INT_WIDTH[ty] + _ATTR[attr])
            else:
                return None
        return tuple(out)


def make_run(server: Any, fast: TritonFastPath) -> Any:
    """A `run` with the kernel's own parameters: native binding, one C call on a hit.

    Returns server.run itself where the kernel's signature cannot be generated (a parameter named
    like run's own keywords, or not positional-or-keyword).
    """
    fn = server.fn
    names = list(server.names)
    sig = fn.signature
    if any(n in ("grid", "warmup") or n.startswith("_nj_") or not n.isidentifier() for n in names):
        return server.run
    m = fast_module()
    from nojit.loader.launch.torch_cuda import current_device, current_stream

    slow = server.run
    tables_by_raw: dict[tuple, Any] = {}

    def table_for_options(options: dict) -> Any:
        try:
            raw = tuple(options.items())
            hash(raw)
        except TypeError:
            return None
        table = fast.tables.get(server.options_key(options))
        tables_by_raw[raw] = table
        return table

    def miss(table: Any, bound: tuple, grid: Any, warmup: bool, options: dict) -> Any:
        """Not served by C (warmup, new options, generic entries, misses): the Python path decides."""
        if options and table is _UNSEEN and table_for_options(options) is not None and not warmup:
            return namespace["run"](*bound, grid=grid, warmup=False, **options)  # known now: the C launch
        return slow(*bound, grid=grid, warmup=warmup, **options)

    def after(r: int, table: Any, bound: tuple, grid: Any, device: int, options: dict) -> Any:
        """A launch the C call did not finish: a module to load on this device, or a driver error."""
        if r >= 0:
            variant = fast.variants[id(table)][r]
            ensure_launch_entry()
            m.set_function(table, r, device, variant.load(device))
            r2 = m.launch(table, bound, grid, device, current_stream(device))
            if r2 is variant:
                return variant
            if r2.__class__ is not int or r2 >= 0:  # pragma: no cover - cannot happen after set_function
                return slow(*bound, grid=grid, warmup=False, **options)
            r = r2
        raise LaunchError(f"launching {server.record.id}: cuLaunchKernelEx failed (CUresult {-r})",
                          fix="check the CUDA driver and the GPU state; rerun with NOJIT_MODE=permissive to fall "
                          "back to the JIT")

    namespace: dict[str, Any] = {
        "_nj_t0": fast.tables.get(server.options_key({})), "_nj_tables": tables_by_raw, "_nj_unseen": _UNSEEN,
        "_nj_slow": slow, "_nj_miss": miss, "_nj_after": after, "_nj_launch": m.launch, "_nj_dev": current_device,
        "_nj_stream": current_stream, "_nj_names": tuple(names),
    }
    arglist = []
    for i, name in enumerate(names):
        param = sig.parameters[name]
        if param.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            return server.run
        if param.default is inspect.Parameter.empty:
            arglist.append(name)
        else:
            namespace[f"_nj_default_{i}"] = param.default
            arglist.append(f"{name}=_nj_default_{i}")
    bound = f"({', '.join(names)}{',' if names else ''})"
    # The kernel's own signature is a one-line function; the body, the same for every kernel, is compiled once
    # per process and made per kernel over this kernel's namespace.
    namespace["_nj_body"] = types.FunctionType(_run_body_code(), namespace, "run")
    src = (f"def run({', '.join(arglist + ['*', 'grid', 'warmup', '**_nj_o'])}):\n"
           f"    return _nj_body({bound}, grid, warmup, _nj_o)\n")
    generated(src, f"<nojit fast run {fn.__module__}:{fn.__qualname__}>", namespace, "run")
    general = namespace["run"]
    # The run vLLM's calls reach: binding, options, grid, device, stream and launch in one C call; the
    # generated function above takes the calls C hands back (warmup, options not seen yet, odd grids).
    defaults = tuple(sig.parameters[n].default for n in names)
    _runner, run = m.new_runner(namespace["_nj_t0"], tuple(names),
                                defaults, inspect.Parameter.empty, current_device, current_stream, general, slow,
                                after, tables_by_raw)
    fast.runner, fast.general, fast.tables_by_raw = _runner, general, tables_by_raw
    return run


_RUN_BODY = """
def run(_nj_b, grid, warmup, _nj_o):
    if _nj_o:
        try:
            _nj_t = _nj_tables.get(tuple(_nj_o.items()), _nj_unseen)
        except TypeError:
            _nj_t = None
    else:
        _nj_t = _nj_t0
    if warmup or _nj_t is None or _nj_t is _nj_unseen:
        return _nj_miss(_nj_t, _nj_b, grid, warmup, _nj_o)
    if grid.__class__ is not tuple:
        grid = grid(dict(zip(_nj_names, _nj_b))) if callable(grid) else tuple(grid)
    try:
        _nj_d = _nj_dev()
        _nj_s = _nj_stream(_nj_d)
    except RuntimeError:  # no driver / no GPU: the Python path raises nojit's LaunchError
        return _nj_slow(*_nj_b, grid=grid, warmup=False, **_nj_o)
    _nj_r = _nj_launch(_nj_t, _nj_b, grid, _nj_d, _nj_s)
    if _nj_r is None or _nj_r.__class__ is int:
        return _nj_miss(_nj_t, _nj_b, grid, False, _nj_o) if _nj_r is None else _nj_after(_nj_r, _nj_t, _nj_b, grid, _nj_d, _nj_o)
    return _nj_r
"""
_run_body: list[Any] = []


def _run_body_code() -> Any:
    """The code of the generated run's body (after binding), compiled once per process."""
    if not _run_body:
        module = compile(_RUN_BODY, "<nojit fast run body>", "exec")
        _run_body.append(next(c for c in module.co_consts if isinstance(c, types.CodeType)))
    return _run_body[0]


class _Unseen:
    """Launch options not seen yet: the Python path computes their table once."""


_UNSEEN = _Unseen()


# --- kernel[grid] bound in C (csrc/nojit_fast.c bind_grid) -------------------------------------------------
_SERVED_CLASSES: dict[type, type] = {}


def _served_class(base: type) -> type:
    """The subclass of a JITFunction class whose `kernel[grid]` is bound in C (one per class, per process).

    Triton's `__getitem__` returns `lambda *args, **kwargs: self.run(grid=grid, warmup=False, *args,
    **kwargs)`: a Python frame and a re-packing of every keyword per launch. This one returns a C callable
    that binds the call straight into the kernel's C runner; where `run` is not a C runner (not prepared
    yet, fast path off, recording) it returns Triton's own lambda. Nothing else differs: isinstance, every
    attribute, `run`, `warmup` and the wrappers that call `fn.run` are the base class's.
    """
    cls = _SERVED_CLASSES.get(base)
    if cls is None:
        bind_grid = fast_module().bind_grid
        triton_getitem = base.__getitem__

        def __getitem__(self: Any, grid: Any) -> Any:
            return bind_grid(self, grid, triton_getitem)

        cls = type(base.__name__, (base,), {"__getitem__": __getitem__, "__module__": base.__module__,
                                            "__qualname__": base.__qualname__, "_nj_served_base": base})
        _SERVED_CLASSES[base] = cls
    return cls


def serve_getitem(fn: Any) -> bool:
    """Make `fn[grid]` the C bound-grid callable (swaps fn's class to a subclass). False: left as is."""
    if fast_module() is None or not hasattr(fast_module(), "bind_grid"):
        return False
    base = type(fn)
    if "_nj_served_base" in base.__dict__:
        return True
    try:
        fn.__class__ = _served_class(base)
    except TypeError:  # a class whose layout forbids it (slots): Triton's lambda stays
        return False
    return True


def restore_getitem(fn: Any) -> None:
    """Give `fn` its own class back (uninstall)."""
    base = type(fn).__dict__.get("_nj_served_base")
    if base is not None:
        fn.__class__ = base
