"""Serving vLLM's TileLang (mHC) kernels from the bundle, with TileLang absent from the process.

vLLM's mHC module gets its decorator from `vllm.tilelang_utils` (`tilelang_jit`), which
imports TileLang eagerly. Before that module is imported, the loader puts its own
`vllm.tilelang_utils` in its place: `tilelang_jit(fn)` returns a bundle server for fn, with
the two methods vLLM uses (`__call__` at run time, `compile` from its warmup) plus
`par_compile`. Calls are keyed by TileLang's phase-1 rule (tilelang_key), launched from the
captured launch plan with PDL where the kernel has it: one C call per launch
(csrc/nojit_fast_tilelang.h) that checks, reads shapes, evaluates the geometry, packs and
launches; whatever it declines takes the Python path (`_launch_python`), the one definition. If vLLM
already imported the real module, the kernel functions are replaced in its namespace.

vLLM routes mHC to TileLang only if `find_spec("tilelang")` succeeds; when TileLang is
not installed, a placeholder spec answers that question (importing it still fails, with a
message saying why), so vLLM takes the same path it would with TileLang installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
import types
from typing import Any

from nojit.loader.bundle.file import Bundle
from nojit.loader.launch.cuda_launch import BundledFunction
from nojit.loader.errors import (BundleMismatchError, KernelNotInBundleError, LaunchError, NoJitError,
                                 UnavailableAttributeError)
from nojit.loader.bundle.launch_expr import check_geometry, evaluate
from nojit.loader.bundle.manifest import Entry, KernelRecord, TileLangLaunch
from nojit.loader.policy import ServingPolicy
from nojit.loader.settings import Mode, settings
from nojit.loader.bundle.tilelang_key import MISSING, key_from_json, key_text, key_to_json, make_binder, source_hash
from nojit.loader.launch.torch_cuda import current_device, current_stream
from nojit.loader.launch.fast_module import ensure_launch_entry, fast_module
from nojit.loader.bundle.versions import check_source

log = logging.getLogger("nojit")

MHC_MODULE = "vllm.model_executor.kernels.mhc.tilelang_kernels"
UTILS_MODULE = "vllm.tilelang_utils"
_ERRLEN = 512
_CTYPE_CODE = {"int32": "i", "int64": "l"}


class TileLangVariant(BundledFunction):
    """One bundled cubin and its launch plan, prepared for cheap launches."""

    def __init__(self, entry: Entry, bundle: Bundle, tensor_order: tuple[str, ...]) -> None:
        launch = entry.launch
        assert isinstance(launch, TileLangLaunch)
        super().__init__(bundle, entry, launch.symbol, launch.dynamic_smem, None)
        self.launch = launch
        index = {name: i for i, name in enumerate(tensor_order)}
        missing = [p["name"] for p in launch.params if p["kind"] == "tensor" and p["name"] not in index]
        if missing:
            raise BundleMismatchError(f"{entry.kernel}: launch plan uses tensors {missing} the kernel does not take",
                                      fix="rebuild the bundle against the installed vLLM")
        self._vars = tuple((name, index[src["param"]], int(src["dim"])) for name, src in launch.dynamic_vars.items())
        self._params = tuple((0, index[p["name"]]) if p["kind"] == "tensor" else (1, p["name"]) for p in launch.params)
        self._types = "".join("p" if p["kind"] == "tensor" else _CTYPE_CODE[p["ctype"]] for p in launch.params).encode()
        simple = lambda e: isinstance(e, int) or "var" in e  # noqa: E731
        self._simple_geometry = all(simple(e) for e in (*launch.grid, *launch.block))
        import torch

        self._checks = tuple(
            (index[t["name"]], getattr(torch, t["dtype"]), len(t["shape"])) for t in launch.tensor_params
            if t["name"] in index
        )
        self._plan = _c_plan(self, launch, len(tensor_order)) if settings.fast_path else None
        self._tl_launch = fast_module().tl_launch if self._plan is not None else None

    def _dims(self, exprs: tuple, values: dict[str, int]) -> tuple[int, int, int]:
        if self._simple_geometry:
            return tuple(e if isinstance(e, int) else values[e["var"]] for e in exprs)  # type: ignore[return-value]
        try:
            return tuple(evaluate(e, values) for e in exprs)  # type: ignore[return-value]
        except LaunchError as exc:
            raise LaunchError(f"{self.where()}: {exc.message} (values {values})", fix=exc.fix) from None

    def check(self, tensors: tuple[Any, ...]) -> None:
        """TileLang's host-side checks that matter for memory safety: dtype, rank, contiguity."""
        for i, dtype, ndim in self._checks:
            t = tensors[i]
            if t is MISSING:
                raise TypeError(f"{self.entry.kernel}: tensor argument {i} is missing")
            if t.dtype is not dtype or t.dim() != ndim or not t.is_contiguous():
                raise TypeError(f"{self.entry.kernel}: tensor argument {i} is {t.dtype} {tuple(t.shape)} "
                                f"(contiguous={t.is_contiguous()}), the kernel takes a contiguous {ndim}-d {dtype}")

    def __call__(self, tensors: tuple[Any, ...]) -> None:
        """One C call (checks, shapes, geometry, packing, cuLaunchKernelEx) where the plan has one; whatever C
        declines takes the Python path, which launches or raises the typed error."""
        plan = self._plan
        if plan is not None:
            try:
                device = current_device()
                stream = current_stream(device)
            except RuntimeError:
                return self._launch_python(tensors)
            r = self._tl_launch(plan, tensors, device, stream)
            if r == 0:
                return None
            if r == 2:  # first launch on this device: load the module, hand C the function and the driver entry
                ensure_launch_entry()
                fast_module().tl_set_function(plan, device, self._functions.get(device) or self.load(device))
                r = self._tl_launch(plan, tensors, device, stream)
                if r == 0:
                    return None
            if r < 0:
                raise LaunchError(f"launching {self.where()}: cuLaunchKernelEx failed (CUresult {-r})",
                                  fix="check the CUDA driver and the GPU state; rerun with NOJIT_MODE=permissive to "
                                  "fall back to the JIT")
        return self._launch_python(tensors)

    def _launch_python(self, tensors: tuple[Any, ...]) -> None:
        """The one definition of a launch: checks, shape variables, geometry, packing, the cffi launcher."""
        self.check(tensors)
        values = {name: tensors[i].shape[dim] for name, i, dim in self._vars}
        grid = self._dims(self.launch.grid, values)
        check_geometry(grid, None, self.where())
        if not (grid[0] and grid[1] and grid[2]):
            return
        block = self._dims(self.launch.block, values)
        check_geometry(grid, block, self.where())
        try:
            device = current_device()
        except RuntimeError as exc:
            raise LaunchError(f"cannot launch {self.entry.kernel}: {exc}",
                              fix="run on a machine with an NVIDIA GPU and driver (libcuda.so.1)") from None
        function = self._functions.get(device) or self.load(device)
        args = [tensors[v].data_ptr() if kind == 0 else values[v] for kind, v in self._params]
        cluster = self.launch.cluster_dims or (1, 1, 1)
        rc = self._c_launch(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], self.launch.dynamic_smem,
                            current_stream(device), self._types, args, len(args), cluster[0], cluster[1], cluster[2],
                            int(self.launch.pdl), int(self.launch.cooperative), self._err, _ERRLEN)
        if rc:
            raise self._failed(rc)


# ---- the C plan of a variant (csrc/nojit_fast_tilelang.h) ----
_OPS = {"+": 2, "-": 3, "*": 4, "//": 5, "%": 6, "min": 7, "max": 8, "<": 9, "<=": 10, "==": 11, "select": 12}


def compile_expr(expr: Any, var_index: dict[str, int], out: list[int]) -> None:
    """A validated launch expression as the C side's postfix program: (op, value) pairs appended to out."""
    if isinstance(expr, int):
        out += (0, expr)
    elif "var" in expr:
        out += (1, var_index[expr["var"]])
    else:
        for a in expr["args"]:
            compile_expr(a, var_index, out)
        out += (_OPS[expr["op"]], 0)


def _c_plan(variant: TileLangVariant, launch: TileLangLaunch, ntensors: int) -> Any:
    """The variant's C plan, or None where the C module is absent or the plan is outside what C takes."""
    m = fast_module()
    if m is None:
        return None
    var_index = {name: i for i, (name, _t, _d) in enumerate(variant._vars)}
    try:
        programs = []
        for e in (*launch.grid, *launch.block):
            prog: list[int] = []
            compile_expr(e, var_index, prog)
            programs.append(tuple(prog))
        params = tuple((0, ref, "p") if kind == 0 else (1, var_index[ref], _CTYPE_CODE[p["ctype"]])
                       for (kind, ref), p in zip(variant._params, launch.params))
        return m.tl_new(ntensors, variant._checks, tuple((t, d) for _n, t, d in variant._vars), tuple(programs),
                        params, launch.dynamic_smem, tuple(launch.cluster_dims or (1, 1, 1)), int(launch.pdl),
                        int(launch.cooperative), MISSING)
    except (KeyError, ValueError, OverflowError, TypeError) as exc:  # outside C's limits: the Python path serves it
        log.debug("nojit: %s served by the Python path (%s)", variant.entry.kernel, exc)
        return None


class TileLangKernelServer:
    """Stands where vLLM expects a TileLang JITImpl: `__call__`, `compile`, `par_compile`.

    Prepared at first use (`prepare`), not at decoration: the source check needs the helpers defined
    later in vLLM's module, and the kernel's section of the bundle is read and validated only then."""

    def __init__(self, fn: Any, record: KernelRecord, bundle: Bundle, policy: ServingPolicy,
                 allow: frozenset[str]) -> None:
        self.fn = fn
        self.record = record
        self.policy = policy
        self.bundle = bundle
        self._allow = allow
        self._ready = False
        self._lock = threading.Lock()
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__qualname__ = getattr(fn, "__qualname__", self.__name__)
        self.__wrapped__ = fn

    def prepare(self) -> None:
        """Source hash checked, section read and validated, binder and variants built (once; thread-safe)."""
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            if not check_source(self.record.id, self.record.source_hash, source_hash(self.fn), self.bundle.path,
                                self._allow):
                log.warning("nojit: %s source differs from the bundle; serving it anyway (NOJIT_ALLOW_MISMATCH=source)",
                            self.record.id)
            entries = self.bundle.entries(self.record.id)
            tensor_names = {t["name"] for t in entries[0].launch.tensor_params} if entries else set()  # type: ignore[union-attr]
            self._bind, self.tensor_names, self.scalar_names = make_binder(self.fn, tensor_names)
            self._variants = {key_from_json(e.key): TileLangVariant(e, self.bundle, self.tensor_names) for e in entries}
            self._ready = True

    @property
    def variants(self) -> dict[tuple[Any, ...], TileLangVariant]:
        self.prepare()
        return self._variants

    def _lookup(self, args: tuple, kwargs: dict) -> tuple[tuple[Any, ...], TileLangVariant | None, tuple[Any, ...]]:
        if not self._ready:
            self.prepare()
        tensors, key = self._bind(*args, **kwargs)
        for v in key:  # a plain loop: a generator in any() costs more than the rest of the lookup
            if v is MISSING:
                missing = [n for n, v in zip(self.scalar_names, key) if v is MISSING]
                raise TypeError(f"{self.record.id}() missing required arguments {missing}")
        try:
            return tensors, self._variants.get(key), key
        except TypeError:  # an unhashable argument: TileLang freezes lists/dicts; vLLM passes none
            return tensors, None, key

    def _miss(self, key: tuple[Any, ...]) -> Any:
        key_json = key_to_json(self.scalar_names, key)
        self.policy.miss(self.record.id, "tilelang", key_json, key_text(self.scalar_names, key), self.record.source_hash)
        return _real_tilelang_jit(self.fn, self.record.id)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        tensors, variant, key = self._lookup(args, kwargs)
        if variant is None:
            return self._miss(key)(*args, **kwargs)
        if self.policy.recording:
            self.policy.served(self.record.id, "tilelang", lambda: key_to_json(self.scalar_names, key), "exact",
                               self.record.source_hash)
        try:
            variant(tensors)
        except NoJitError as exc:  # permissive/record: this call goes to the JIT; strict: raised
            if not self.policy.contain(self.record.id, exc):
                raise
            return _real_tilelang_jit(self.fn, self.record.id)(*args, **kwargs)
        return None

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's warmup path: resolve the variant now (load nothing, compile nothing)."""
        _tensors, variant, key = self._lookup(args, kwargs)
        if variant is None:
            return self._miss(key).compile(*args, **kwargs)
        return variant

    def par_compile(self, configs: Any, num_workers: int | None = None, **_ignored: Any) -> list[Any]:
        return [self.compile(**dict(c)) for c in configs]

    def preload(self, device: int) -> int:
        for v in self.variants.values():
            v.load(device)
        return len(self._variants)


def _real_tilelang_jit(fn: Any, kernel_id: str) -> Any:
    """The JIT fallback for a permissive miss: real TileLang, if this process has it."""
    try:
        import tilelang  # noqa: F401
    except ImportError as exc:
        raise NoJitError(
            f"{kernel_id}: the bundle lacks this key and TileLang is not available to compile it ({exc})",
            fix="add the key to the bundle (NOJIT_MODE=record, then `nojit build --add-keys`), or install tilelang",
        ) from None
    sys.modules.pop(UTILS_MODULE, None)
    real = importlib.import_module(UTILS_MODULE)
    return real.tilelang_jit(fn)


class _Unavailable(types.ModuleType):
    """Stands for `tilelang` / `tilelang.language` inside vLLM's mHC module: never used there at run time."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise UnavailableAttributeError(f"{self.__name__}.{name} is not available: nojit serves vLLM's TileLang kernels from its "
                         "bundle and TileLang is not loaded in this process",
                         fix="use NOJIT_MODE=permissive with tilelang installed to JIT-compile TileLang kernels")


class _PlaceholderSpecFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes find_spec('tilelang') succeed when TileLang is not installed; importing it still fails."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "tilelang":
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        raise ImportError("tilelang is not installed; nojit serves vLLM's TileLang kernels from its bundle")


class _State:
    def __init__(self) -> None:
        self.bundle: Bundle | None = None
        self.ids: set[str] = set()
        self.policy: ServingPolicy | None = None
        self.allow: frozenset[str] = frozenset()
        self.servers: dict[str, TileLangKernelServer] = {}
        self.saved_utils: Any = None
        self.finder: _PlaceholderSpecFinder | None = None


_state = _State()


def _server_for(fn: Any, kernel_id: str) -> TileLangKernelServer:
    assert _state.bundle is not None and _state.policy is not None
    server = TileLangKernelServer(fn, _state.bundle.index.kernels[kernel_id], _state.bundle, _state.policy,
                                  _state.allow)
    _state.servers[kernel_id] = server
    return server


class _UnbundledKernel:
    """A TileLang kernel the bundle does not hold: every use is a miss (strict mode raises)."""

    def __init__(self, fn: Any, kernel_id: str) -> None:
        self.fn, self.kernel_id = fn, kernel_id

    def _refuse(self) -> Any:
        assert _state.policy is not None
        if _state.policy.mode is Mode.STRICT:
            raise KernelNotInBundleError(self.kernel_id, "(any)", _state.bundle.path if _state.bundle else "?",
                                         fix="build the bundle with this kernel (nojit build), or use NOJIT_MODE=permissive")
        return _real_tilelang_jit(self.fn, self.kernel_id)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._refuse()(*args, **kwargs)

    def compile(self, *args: Any, **kwargs: Any) -> Any:
        return self._refuse().compile(*args, **kwargs)

    def par_compile(self, *args: Any, **kwargs: Any) -> Any:
        return self._refuse().par_compile(*args, **kwargs)


def tilelang_jit(fn: Any) -> Any:
    """nojit's replacement for `vllm.tilelang_utils.tilelang_jit`."""
    kernel_id = f"{fn.__module__}:{fn.__qualname__}"
    if kernel_id in _state.ids:
        return _server_for(fn, kernel_id)
    return _UnbundledKernel(fn, kernel_id)


def _stub_utils_module() -> types.ModuleType:
    stub = types.ModuleType(UTILS_MODULE, "nojit: serves vLLM's TileLang kernels from the bundle (tilelang not loaded)")
    stub.tilelang = _Unavailable("tilelang")
    stub.T = _Unavailable("tilelang.language")
    stub.tilelang_jit = tilelang_jit
    stub.__nojit__ = True
    return stub


def install(bundle: Bundle, kernel_ids: list[str], policy: ServingPolicy,
            allow: frozenset[str]) -> dict[str, TileLangKernelServer]:
    """Route vLLM's TileLang kernels to the bundle. Returns the live servers dict (filled as vLLM decorates)."""
    _state.bundle, _state.ids, _state.policy, _state.allow = bundle, set(kernel_ids), policy, allow
    _state.servers = {}
    mhc = sys.modules.get(MHC_MODULE)
    if mhc is None:
        _state.saved_utils = sys.modules.get(UTILS_MODULE)
        sys.modules[UTILS_MODULE] = _stub_utils_module()
        vllm_pkg = sys.modules.get("vllm")
        if vllm_pkg is not None:
            vllm_pkg.tilelang_utils = sys.modules[UTILS_MODULE]  # type: ignore[attr-defined]
        try:
            findable = importlib.util.find_spec("tilelang") is not None
        except (ImportError, ValueError):
            findable = False
        if not findable:
            _state.finder = _PlaceholderSpecFinder()
            sys.meta_path.append(_state.finder)
        layers = sys.modules.get("vllm.model_executor.layers.mhc")
        if layers is not None and not getattr(layers, "HAS_TILELANG_MHC", True):
            log.warning("nojit: vLLM already decided that TileLang mHC is unavailable; install nojit earlier "
                        "(before vLLM imports its models) so the bundled mHC kernels are used")
        return _state.servers
    # vLLM's mHC module is already loaded with real TileLang: replace its kernel objects.
    for kid in kernel_ids:
        module_name, _, name = kid.partition(":")
        if module_name != MHC_MODULE or "." in name or not hasattr(mhc, name):
            raise BundleMismatchError(f"TileLang kernel {kid} is not in {MHC_MODULE}",
                                      fix="rebuild the bundle against the installed vLLM")
        jit_impl = getattr(mhc, name)
        fn = getattr(getattr(jit_impl, "func", None), "orig_func", None) or getattr(jit_impl, "__wrapped__", None)
        if fn is None:
            raise BundleMismatchError(f"cannot find the Python function behind {kid}", fix="report this to nojit")
        server = _server_for(fn, kid)
        server.prepare()  # the module is complete: a stale source is refused now, at install
        server._original = jit_impl  # type: ignore[attr-defined]
        setattr(mhc, name, server)
    return _state.servers


def uninstall(servers: dict[str, TileLangKernelServer]) -> None:
    mhc = sys.modules.get(MHC_MODULE)
    for kid, server in servers.items():
        original = getattr(server, "_original", None)
        if mhc is not None and original is not None:
            setattr(mhc, kid.partition(":")[2], original)
    utils = sys.modules.get(UTILS_MODULE)
    if utils is not None and getattr(utils, "__nojit__", False):
        if _state.saved_utils is not None:
            sys.modules[UTILS_MODULE] = _state.saved_utils
        else:
            sys.modules.pop(UTILS_MODULE, None)
    if _state.finder is not None and _state.finder in sys.meta_path:
        sys.meta_path.remove(_state.finder)
    _state.__init__()  # type: ignore[misc]
