"""Serving one Triton kernel from the bundle: its `run` is replaced, per JITFunction object.

Triton's `kernel[grid](...)`, `kernel.warmup(...)`, autotuners and heuristics all call
`JITFunction.run`; an instance attribute shadows the class method, so this catches every
path to a compile for this kernel and no other kernel is touched. A call binds its
arguments, computes the key Triton would compute, and launches the matching cubin through
the C launcher on torch's current stream. Triton's driver object is never touched (its
first use builds a C module with gcc).
"""

from __future__ import annotations

import struct
from typing import Any

from nojit.loader.bundle_file import Bundle
from nojit.loader.cuda_launch import launcher
from nojit.loader.manifest import Entry, KernelRecord, TritonLaunch
from nojit.loader.policy import ServingPolicy
from nojit.loader.torch_cuda import current_device, current_stream
from nojit.loader.triton_key import (
    ArgSpecializer,
    Key,
    UnsupportedArgument,
    generic_spec,
    key_from_json,
    key_text,
    key_to_json,
    make_binder,
    options_key,
)

_MASK64 = (1 << 64) - 1
_pack_double = struct.Struct("<d").pack
_unpack_u64 = struct.Struct("<Q").unpack


def _pointer(v: Any) -> int:
    return v.data_ptr() if v.__class__ is not int else v


def _integer(v: Any) -> int:
    return int(v) & _MASK64


def _floating(v: Any) -> int:
    return _unpack_u64(_pack_double(float(v)))[0]


_PACKERS = {"p": _pointer, "l": _integer, "L": _integer, "i": _integer, "u": _integer, "h": _integer,
            "H": _integer, "c": _integer, "f": _floating, "d": _floating, "e": _floating, "b": _floating}


class TritonVariant:
    """One bundled cubin with everything needed to launch it."""

    __slots__ = ("entry", "launch", "kernel", "_bundle", "_types", "_plan", "_block", "_cluster", "_scratch")

    def __init__(self, entry: Entry, bundle: Bundle) -> None:
        launch = entry.launch
        assert isinstance(launch, TritonLaunch)
        self.entry = entry
        self.launch = launch
        self.kernel = entry.kernel
        self._bundle = bundle
        self._plan = tuple((index, _PACKERS[code]) for index, code in launch.args)
        self._types = ("".join(code for _, code in launch.args) + "pp").encode()
        self._block = (32 * launch.num_warps, 1, 1)
        self._cluster = launch.cluster_dims if launch.num_ctas > 1 else (1, 1, 1)
        self._scratch = launch.global_scratch_size > 0 or launch.profile_scratch_size > 0

    def load(self, device: int):
        launch = self.launch
        return launcher().function(
            device, self.entry.blob, lambda: self._bundle.read_blob(self.entry.blob), launch.symbol, launch.shared
        )

    def __call__(self, bound: tuple[Any, ...], grid: tuple[int, ...]) -> None:
        launch = self.launch
        gx = grid[0]
        gy = grid[1] if len(grid) > 1 else 1
        gz = grid[2] if len(grid) > 2 else 1
        if gx * gy * gz == 0:
            return
        device = current_device()
        fn = self.load(device)
        values = [pack(bound[i]) for i, pack in self._plan]
        keep = None
        if self._scratch:
            keep = self._scratch_buffers(gx * gy * gz, device)
            values.extend(t.data_ptr() if t is not None else 0 for t in keep)
        else:
            values.extend((0, 0))
        launcher().launch(
            fn.function,
            (gx * launch.num_ctas, gy, gz),
            self._block,
            launch.shared,
            current_stream(device),
            self._types,
            values,
            self._cluster,
            launch.launch_pdl,
            launch.launch_cooperative_grid,
        )
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
    """Replaces `run` on one JITFunction: key -> bundled variant -> launch; misses go to the policy."""

    def __init__(
        self,
        fn: Any,
        record: KernelRecord,
        entries: list[Entry],
        bundle: Bundle,
        policy: ServingPolicy,
        specializer: ArgSpecializer,
        debug: bool,
        instrumentation_mode: str,
    ) -> None:
        self.fn = fn
        self.record = record
        self.policy = policy
        self.names = tuple(p.name for p in fn.params)
        self._runtime_param = tuple(not p.is_constexpr for p in fn.params)
        self._binder = make_binder(fn, specializer)
        self._debug = debug
        self._instrumentation_mode = instrumentation_mode
        self.exact: dict[Key, TritonVariant] = {}
        self.generic: dict[Key, TritonVariant] = {}
        for e in entries:
            key = key_from_json(e.key)
            (self.exact if e.variant == "exact" else self.generic)[key] = TritonVariant(e, bundle)
        self._jit_run = type(fn).run  # the class's own run: the JIT path for permissive misses

    # The signature Triton's KernelInterface uses for run().
    def run(self, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        call_kwargs = dict(kwargs)
        kwargs["debug"] = kwargs.get("debug", self.fn.debug) or self._debug
        kwargs["instrumentation_mode"] = self._instrumentation_mode
        try:
            bound, spec, options = self._binder(*args, **kwargs)
            key = (spec, options_key(options))
        except UnsupportedArgument as exc:
            return self._miss(None, str(exc), args, call_kwargs, grid, warmup)
        variant = self.exact.get(key)
        if variant is not None:
            if self.policy.recording:
                self.policy.served(self.record.id, "triton", key_to_json(key), "exact", self.record.source_hash)
        else:
            variant = self.generic.get((generic_spec(spec, self._runtime_param), key[1]))
            if variant is None:
                return self._miss(key, "", args, call_kwargs, grid, warmup)
            self.policy.served(self.record.id, "triton", key_to_json(key), "generic", self.record.source_hash)
        if warmup:
            return variant
        if callable(grid):
            grid = grid(dict(zip(self.names, bound)))
        variant(bound, grid)
        return variant

    def _miss(self, key: Key | None, reason: str, args: tuple, kwargs: dict, grid: Any, warmup: bool) -> Any:
        key_json = key_to_json(key) if key is not None else None
        text = key_text(key) if key is not None else "(unrepresentable arguments)"
        self.policy.miss(self.record.id, "triton", key_json, text, self.record.source_hash, reason)
        return self._jit_run(self.fn, *args, grid=grid, warmup=warmup, **kwargs)

    def preload(self, device: int) -> int:
        """Load every variant's module on `device` (before CUDA-graph capture). Returns how many."""
        variants = list(self.exact.values()) + list(self.generic.values())
        for v in variants:
            v.load(device)
        return len(variants)
