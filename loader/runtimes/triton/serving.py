"""Serving one Triton kernel from the bundle: its `run` is replaced, per JITFunction object.

Triton's `kernel[grid](...)`, `kernel.warmup(...)`, autotuners and heuristics all call
`JITFunction.run`; an instance attribute shadows the class method, so this catches every
path to a compile for this kernel and no other kernel is touched. A call binds its
arguments, computes the key Triton would compute, and launches the matching cubin through
the C launcher on torch's current stream. Triton's driver object is never touched (its
first use builds a C module with gcc).

The hot path is kept short on purpose: one generated binder call, two dict lookups, one
generated packer, one C call. With the fast path, a prepared kernel's `run` is one C callable and its
`kernel[grid]` a C callable bound to that grid (triton_fast.serve_getitem; uninstall restores the class).
"""

from __future__ import annotations

import logging
import struct
import threading
from typing import Any

from nojit.loader.bundle.file import Bundle
from nojit.loader.launch.cuda_launch import BundledFunction
from nojit.loader.errors import BundleMismatchError, LaunchError, NoJitError
from nojit.loader.bundle.manifest import Entry, KernelRecord, TritonLaunch
from nojit.loader.policy import ServingPolicy
from nojit.loader.launch.torch_cuda import current_device, current_stream
from nojit.loader.runtimes.triton.source_parts import unchanged_since_build
from nojit.loader.bundle.versions import check_source
from nojit.loader.bundle.triton_key import (
    ArgSpecializer,
    Key,
    UnsupportedArgument,
    generic_spec,
    hint_agreement,
    key_from_json,
    key_text,
    key_to_json,
    layout_spec,
    make_binder,
    options_key,
)

log = logging.getLogger("nojit")

_pack_double = struct.Struct("<d").pack
_unpack_u64 = struct.Struct("<Q").unpack
_ERRLEN = 512
_MAX_REMEMBERED_FALLBACKS = 4096  # distinct missed keys whose choice is cached (a bound, not a tuning)


def _double_bits(v: Any) -> int:
    return _unpack_u64(_pack_double(float(v)))[0]


_PACKERS: dict[tuple[tuple[int, str], ...], Any] = {}


def _make_packer(args: tuple[tuple[int, str], ...]) -> Any:
    """A generated function: bound arguments -> the 64-bit slots the C launcher reads (one per argument layout)."""
    packer = _PACKERS.get(args)
    if packer is None:
        packer = _PACKERS[args] = _generate_packer(args)
    return packer


def _generate_packer(args: tuple[tuple[int, str], ...]) -> Any:
    parts = []
    for index, code in args:
        if code == "p":
            parts.append(f"b[{index}].data_ptr()")
        elif code in "fdeb":
            parts.append(f"_bits(b[{index}])")
        else:
            parts.append(f"int(b[{index}]) & 0xFFFFFFFFFFFFFFFF")
    namespace = {"_bits": _double_bits}
    exec(f"def pack(b):\n    return [{', '.join(parts + ['0', '0'])}]\n", namespace)
    return namespace["pack"]


class TritonVariant(BundledFunction):
    """One bundled cubin with everything needed to launch it."""

    def __init__(self, entry: Entry, bundle: Bundle) -> None:
        launch = entry.launch
        assert isinstance(launch, TritonLaunch)
        super().__init__(bundle, entry, launch.symbol, launch.shared, 32 * launch.num_warps)
        self.launch = launch
        self._pack = _make_packer(launch.args)
        self._types = ("".join(code for _, code in launch.args) + "pp").encode()
        self._nargs = len(launch.args) + 2
        self._ctas = launch.num_ctas
        self._block_x = 32 * launch.num_warps
        self._cluster = launch.cluster_dims if launch.num_ctas > 1 else (1, 1, 1)
        self._pdl = int(launch.launch_pdl)
        self._coop = int(launch.launch_cooperative_grid)
        self._scratch = launch.global_scratch_size > 0 or launch.profile_scratch_size > 0

    def __call__(self, bound: tuple[Any, ...], grid: Any) -> None:
        n = len(grid)
        gx = grid[0]
        gy = grid[1] if n > 1 else 1
        gz = grid[2] if n > 2 else 1
        if not (gx and gy and gz):
            return
        try:
            device = current_device()
        except RuntimeError as exc:  # torch found no driver / no GPU
            raise LaunchError(f"cannot launch {self.entry.kernel}: {exc}",
                              fix="run on a machine with an NVIDIA GPU and driver (libcuda.so.1)") from None
        function = self._functions.get(device) or self.load(device)
        values = self._pack(bound)
        keep = None
        if self._scratch:
            keep = self._scratch_buffers(gx * gy * gz, device)
            values[-2:] = [t.data_ptr() if t is not None else 0 for t in keep]
        cluster = self._cluster
        rc = self._c_launch(function, gx * self._ctas, gy, gz, self._block_x, 1, 1, self.launch.shared,
                            current_stream(device), self._types, values, self._nargs, cluster[0], cluster[1],
                            cluster[2], self._pdl, self._coop, self._err, _ERRLEN)
        if rc:
            raise self._failed(rc)
        del keep  # the caching allocator keeps stream order: freeing after enqueue is safe

    def _scratch_buffers(self, programs: int, device: int) -> list[Any]:
        import torch

        out = []
        for size, align in (
            (self.launch.global_scratch_size, self.launch.global_scratch_align),
            (self.launch.profile_scratch_size, self.launch.profile_scratch_align),
        ):
            if size:
                nbytes = programs * self.launch.num_ctas * size
                buf = torch.empty(nbytes + align, dtype=torch.uint8, device=f"cuda:{device}")
                offset = (-buf.data_ptr()) % align
                out.append(buf[offset:])
            else:
                out.append(None)
        return out


class TritonKernelServer:
    """Replaces `run` on one JITFunction: key -> bundled variant -> launch; misses go to the policy.

    Installing costs nothing per kernel: `fn.run` first points at `_first_call`, and the kernel is
    prepared at its first use (a call, `kernel.warmup`, vLLM's warmup registry, `preload`): its live
    source checked against the bundle's (loader/runtimes/triton/source_parts.py, else Triton's cache_key), its exact
    entries read and validated (the generic ones at its first miss), its variants, binder and fast-path
    tables built. Then `fn.run` is the real entry point.
    """

    def __init__(
        self,
        fn: Any,
        record: KernelRecord,
        bundle: Bundle,
        policy: ServingPolicy,
        specializer: ArgSpecializer,
        debug: bool,
        instrumentation_mode: str,
        fast_path: bool = False,
        allow: frozenset[str] = frozenset(),
        differences: list[str] | None = None,
    ) -> None:
        self.fn = fn
        self.record = record
        self.policy = policy
        self.bundle = bundle
        self._specializer = specializer
        self._debug = debug
        self._instrumentation_mode = instrumentation_mode
        self._fast_path = fast_path
        self._allow = allow
        self._differences = differences if differences is not None else []
        self._options: dict[tuple, tuple] = {}
        self._fallbacks: dict[Key, TritonVariant] = {}  # exact key -> the generic entry chosen for it
        self._jit_run = type(fn).run  # the class's own run: the JIT path for permissive misses
        self._lock = threading.Lock()
        self._ready = False
        self._fast: Any = None
        self._binder: Any = self._bind_after_prepare  # run() called before any prepare (tests, tools)
        # What install() puts on the JITFunction; replaced by the real entry point once prepared.
        self.entry_point: Any = self._first_call

    def _bind_after_prepare(self, *args: Any, **kwargs: Any) -> Any:
        self.prepare()
        return self._binder(*args, **kwargs)

    def _first_call(self, *args: Any, **kwargs: Any) -> Any:
        self.prepare()
        return self.entry_point(*args, **kwargs)

    def prepare(self) -> None:
        """Check and build everything this kernel's launches need (once; thread-safe). Raises
        BundleMismatchError for a changed source (unless allowed) and BundleCorruptError for a bad section."""
        if self._ready:
            return
        with self._lock:
            if self._ready:
                return
            kid = self.record.id
            # The build's record of what the key was made of proves an unchanged source without Triton's
            # AST walk; anything it cannot prove is decided by Triton's own cache_key, as before.
            if not unchanged_since_build(self.fn, self.record.info.get("source_parts"), self.record.source_hash) and \
                    not check_source(kid, self.record.source_hash, self.fn.cache_key, self.bundle.path, self._allow):
                self._differences.append(f"source: {kid} changed since the bundle was built")
                log.warning("nojit: %s source differs from the bundle; serving it anyway (NOJIT_ALLOW_MISMATCH=source)",
                            kid)
            try:
                self._build(self.bundle.entries_of_variant(kid, "exact"))
            except NoJitError:
                raise
            except Exception as exc:  # a malformed key in an otherwise valid manifest
                raise BundleMismatchError(f"kernel {kid}: cannot serve its bundle entries ({exc})",
                                          fix="rebuild the bundle with `nojit build`") from None
            if self.fn.__dict__.get("run") == self._first_call:  # still installed: point it at the real path
                self.fn.run = self.entry_point
                if self._fast is not None:  # kernel[grid] bound in C, without Triton's lambda
                    from nojit.loader.runtimes.triton.fast import serve_getitem

                    serve_getitem(self.fn)
            self._ready = True

    def _build(self, entries: tuple[Entry, ...]) -> None:
        self.names = tuple(p.name for p in self.fn.params)
        self._runtime_param = tuple(not p.is_constexpr for p in self.fn.params)
        self._binder = make_binder(self.fn, self._specializer)
        self._exact: dict[Key, TritonVariant] = {}
        self._generic_tables: tuple[dict, dict] | None = None  # read at the first miss (_generic_for_misses)
        for e in entries:
            key = e.decoded if e.decoded is not None else key_from_json(e.key)  # decoded by the section's check
            self._exact[key] = TritonVariant(e, self.bundle)
        # The one-call C path for exact entries where it can be used (not while recording, which sees
        # every hit), else run itself.
        entry_point = self.run
        if self._fast_path and not self.policy.recording:
            from nojit.loader.runtimes.triton.fast import TritonFastPath, fast_module, make_run

            if fast_module() is not None:
                self._fast = TritonFastPath(self.fn, self._specializer, self._exact)
                entry_point = make_run(self, self._fast)
        self.entry_point = entry_point

    @property
    def exact(self) -> dict[Key, TritonVariant]:
        self.prepare()
        return self._exact

    @property
    def generic(self) -> dict[Key, TritonVariant]:
        self.prepare()
        return self._generic_for_misses()[0]

    def _generic_for_misses(self) -> tuple[dict[Key, TritonVariant], dict[Key, list[tuple[Key, TritonVariant]]]]:
        """The generic entries, by layout spec (triton_key.layout_spec) and grouped by generic_spec: their part of
        the section is read and validated at the kernel's first miss, which most kernels never have."""
        tables = self._generic_tables
        if tables is None:
            with self._lock:
                tables = self._generic_tables
                if tables is None:
                    tables = self._generic_tables = self._read_generic()
        return tables

    def _read_generic(self) -> tuple[dict[Key, TritonVariant], dict[Key, list[tuple[Key, TritonVariant]]]]:
        kid = self.record.id
        try:
            entries = self.bundle.entries_of_variant(kid, "generic")
            generic: dict[Key, TritonVariant] = {}
            groups: dict[Key, list[tuple[Key, TritonVariant]]] = {}
            for e in entries:
                key = e.decoded if e.decoded is not None else key_from_json(e.key)
                variant = generic[key] = TritonVariant(e, self.bundle)
                groups.setdefault((generic_spec(key[0], self._runtime_param), key[1]), []).append((key, variant))
        except NoJitError:
            raise
        except Exception as exc:  # a malformed key in an otherwise valid manifest
            raise BundleMismatchError(f"kernel {kid}: cannot serve its bundle entries ({exc})",
                                      fix="rebuild the bundle with `nojit build`") from None
        return generic, groups

    @property
    def fast(self) -> Any:
        """The C tables (triton_fast.TritonFastPath), or None where the fast path is off."""
        self.prepare()
        return self._fast

    def options_key(self, options: dict[str, Any]) -> tuple:
        """Triton's launch options for this call, as it would see them (debug, instrumentation added)."""
        raw = tuple(options.items())
        try:
            return self._options[raw]
        except KeyError:
            cacheable = True
        except TypeError:  # an unhashable option value: compute (and refuse) without caching
            cacheable = False
        full = dict(options)
        full["debug"] = full.get("debug", self.fn.debug) or self._debug
        full["instrumentation_mode"] = self._instrumentation_mode
        okey = options_key(full)
        if cacheable:
            self._options[raw] = okey
        return okey

    # The signature Triton's KernelInterface uses for run().
    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        try:
            bound, spec, options = self._binder(*args, **kwargs)
            key = (spec, self.options_key(options))
        except UnsupportedArgument as exc:
            return self._miss(None, str(exc), args, kwargs, grid, warmup)
        variant = self._exact.get(key)
        if variant is None:
            variant = self._fallbacks.get(key) or self.fallback_for(key)
            if variant is None:
                return self._miss(key, "", args, kwargs, grid, warmup)
            self.policy.served(self.record.id, "triton", lambda: key_to_json(key), "generic", self.record.source_hash)
        elif self.policy.recording:
            self.policy.served(self.record.id, "triton", lambda: key_to_json(key), "exact", self.record.source_hash)
        if warmup:
            return variant
        if callable(grid):
            grid = grid(dict(zip(self.names, bound)))
        try:
            variant(bound, grid)
        except NoJitError as exc:  # permissive/record: this call goes to the JIT; strict: raised
            if not self.policy.contain(self.record.id, exc):
                raise
            return self._jit_run(self.fn, *args, grid=grid, warmup=warmup, **kwargs)
        return variant

    def fallback_for(self, key: Key) -> TritonVariant | None:
        """The generic entry serving `key`: the one laid out for its divisibility pattern if bundled
        (bit-identical to the JIT's cubin for `key`), else the nearest pattern of its group."""
        spec, okey = key
        generic, groups = self._generic_for_misses()
        wanted = layout_spec(spec, self._runtime_param)
        variant = generic.get((wanted, okey))
        if variant is None:
            group = groups.get((generic_spec(spec, self._runtime_param), okey))
            if not group:
                return None
            variant = max(group, key=lambda kv: hint_agreement(kv[0][0], wanted))[1]
        if len(self._fallbacks) < _MAX_REMEMBERED_FALLBACKS:
            self._fallbacks[key] = variant
        return variant

    def _miss(self, key: Key | None, reason: str, args: tuple, kwargs: dict, grid: Any, warmup: bool) -> Any:
        key_json = key_to_json(key) if key is not None else None
        text = key_text(key) if key is not None else "(unrepresentable arguments)"
        self.policy.miss(self.record.id, "triton", key_json, text, self.record.source_hash, reason)
        return self._jit_run(self.fn, *args, grid=grid, warmup=warmup, **kwargs)

    def preload(self, device: int) -> int:
        """Load every variant's module on `device` (before CUDA-graph capture). Returns how many."""
        self.prepare()
        variants = list(self._exact.values()) + list(self._generic_for_misses()[0].values())
        for v in variants:
            v.load(device)
        return len(variants)
