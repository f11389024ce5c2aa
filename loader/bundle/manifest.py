"""The bundle manifest: what a bundle holds, as typed records parsed from (and to) JSON.

The manifest is the bundle's table of contents: who produced it (versions), for which GPU,
which kernels (identity and source hash), and per entry the exact compile key, the launch
metadata and the content address of its cubin. Parsing validates every field's type and
range, so a damaged or hostile manifest ends in one BundleCorruptError that names the
field, never in an exception from deep inside the loader.

In the file (format 2) the manifest is split so that opening reads only what every process
needs: an Index (producer, target, deployment, kernel records, blob table, and per kernel
where its entries lie and their digest), read and checked at open, and one section per kernel
(its entries), decoded and checked at that kernel's first use (`parse_section`). `Manifest`
is the whole thing, for the writer and tools.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.bundle.autotune import AutotuneRecord
from nojit.loader.bundle.records.flashinfer import FlashInferLaunch
from nojit.loader.bundle.records.humming import HummingLaunch
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.provenance import Provenance
from nojit.loader.errors import BundleCorruptError
from nojit.loader.settings import TOOL_FACTS

FORMAT_VERSION = 2  # 2: index + per-kernel entry sections (1: one manifest JSON)
VARIANTS = ("exact", "generic")
ARG_TYPE_CODES = frozenset("plLiuhHcfdeb")
_HEX = frozenset("0123456789abcdef")
MAX_CUBIN_BYTES = 64 << 20  # one cubin, raw; real ones are at most a few MB


class _Fields:
    """Typed access to one JSON object, naming the path of a bad field in the error."""

    def __init__(self, obj: Any, where: str, source: str) -> None:
        if not isinstance(obj, dict):
            raise BundleCorruptError(f"{source}: manifest field {where} is not an object", fix=_REBUILD)
        self.obj = obj
        self.where = where
        self.source = source

    def _bad(self, name: str, what: str) -> BundleCorruptError:
        return BundleCorruptError(f"{self.source}: manifest field {self.where}.{name} {what}", fix=_REBUILD)

    def get(self, name: str, kind: type | tuple[type, ...], optional: bool = False) -> Any:
        if name not in self.obj:
            if optional:
                return None
            raise self._bad(name, "is missing")
        value = self.obj[name]
        if value is None and optional:
            return None
        # bool is an int subclass: never accept it where a number is meant, and vice versa
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            raise self._bad(name, f"has type bool, expected {_kind_name(kind)}")
        if not isinstance(value, kind):
            raise self._bad(name, f"has type {type(value).__name__}, expected {_kind_name(kind)}")
        return value

    def int(self, name: str, lo: int = 0, hi: int = 1 << 62, optional: bool = False) -> int | None:
        value = self.get(name, int, optional)
        if value is not None and not lo <= value <= hi:
            raise self._bad(name, f"= {value} is outside [{lo}, {hi}]")
        return value

    def str(self, name: str, optional: bool = False, max_len: int = 4096) -> str | None:
        value = self.get(name, str, optional)
        if value is not None and len(value) > max_len:
            raise self._bad(name, f"is longer than {max_len} characters")
        if value is not None and not value.isprintable():
            raise self._bad(name, "holds a NUL or control character")
        return value

    def sub(self, name: str) -> "_Fields":
        return _Fields(self.get(name, dict), f"{self.where}.{name}", self.source)


_REBUILD = "the bundle file is damaged or not a nojit bundle: rebuild it with `nojit build` and copy it again"


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


TORCH_DTYPES = frozenset({
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
    "float32", "float64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
})
# Triton parameter type -> the C launcher's type code (pointers are "p").
TRITON_TYPE_CODES = {
    "i1": "c", "u1": "c", "i8": "c", "u8": "c", "i16": "h", "u16": "H", "i32": "i", "u32": "u",
    "i64": "l", "u64": "L", "fp16": "e", "bf16": "b", "fp32": "f", "f32": "f", "fp64": "d",
}
_GRID_LIMITS = ((1 << 31) - 1, 65535, 65535)  # CUDA's grid limits per axis
MAX_CLUSTER_BLOCKS = 16  # Hopper's largest (non-portable) cluster; csrc refuses more as well


class _AnyName(frozenset):
    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.isidentifier()


_ANY_NAME = _AnyName()


def _check_cluster(f: _Fields, cluster: list[Any]) -> None:
    if len(cluster) != 3 or not all(isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= 16 for c in cluster):
        raise f._bad("cluster_dims", "is not three integers in [1, 16]")
    if cluster[0] * cluster[1] * cluster[2] > MAX_CLUSTER_BLOCKS:
        raise f._bad("cluster_dims", f"{cluster} holds more than {MAX_CLUSTER_BLOCKS} blocks")


def _sha(f: _Fields, name: str) -> str:
    value = f.str(name)
    if len(value) != 64 or not set(value) <= _HEX:
        raise f._bad(name, "is not a lowercase sha256 hex digest")
    return value


@dataclass(frozen=True)
class Producer:
    """Versions of everything that shaped the cubins; the loader compares them with its own."""

    nojit: str
    vllm: str | None
    triton: str | None
    tilelang: str | None
    ptxas: str | None
    nvcc: str | None
    python: str
    torch: str | None
    # tool -> version probe -> {"stdout", "stderr"}: what the build's compilers answered (loader/strict/toolchain.py);
    # strict mode's stand-ins replay it (loader/strict/firewall.py). Optional: older bundles have none.
    toolchain: dict[str, dict[str, dict[str, str]]] | None = None

    def to_json(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        if data["toolchain"] is None:
            del data["toolchain"]
        return data

    @classmethod
    def from_json(cls, f: _Fields) -> Producer:
        return cls(
            nojit=f.str("nojit"),
            vllm=f.str("vllm", optional=True),
            triton=f.str("triton", optional=True),
            tilelang=f.str("tilelang", optional=True),
            ptxas=f.str("ptxas", optional=True),
            nvcc=f.str("nvcc", optional=True),
            python=f.str("python"),
            torch=f.str("torch", optional=True),
            toolchain=_toolchain(f),
        )


def _toolchain(f: _Fields) -> dict[str, dict[str, dict[str, str]]] | None:
    raw = f.get("toolchain", dict, optional=True)
    if raw is None:
        return None
    for tool, probes in raw.items():
        if not isinstance(probes, dict) or not all(
            isinstance(streams, dict) and all(isinstance(k, str) and isinstance(v, str) and len(v) <= 65536
                                              for k, v in streams.items())
            for streams in probes.values()
        ):
            raise f._bad(f"toolchain.{tool}", "is not an object of version probes to {stdout, stderr} strings")
    return raw


@dataclass(frozen=True)
class Target:
    """The GPU the cubins are for. sm_90a SASS runs on compute capability 9.0 only."""

    backend: str
    capability: int
    arch: str
    warp_size: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, f: _Fields) -> Target:
        return cls(f.str("backend"), f.int("capability", 1, 1000), f.str("arch"), f.int("warp_size", 1, 1024))


@dataclass(frozen=True)
class BlobRef:
    """Where one compressed cubin lies in the file, and the digest of its raw bytes."""

    sha256: str
    offset: int
    length: int
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "length": self.length, "size": self.size}


@dataclass(frozen=True)
class SectionRef:
    """Where one kernel's entries lie in the file (a zstandard frame of JSON), its digest and entry count."""

    offset: int
    length: int
    size: int
    sha256: str  # of the compressed frame, as the header's digest of the index
    entries: int

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, f: _Fields, file_size: int) -> SectionRef:
        offset = f.int("offset", 0, file_size)
        length = f.int("length", 1, file_size)
        if offset + length > file_size:
            raise f._bad("length", f"runs past the end of the file ({offset}+{length} > {file_size} bytes)")
        return cls(offset, length, f.int("size", 1, MAX_SECTION_BYTES), _sha(f, "sha256"), f.int("entries", 0, 1 << 20))


MAX_SECTION_BYTES = 16 << 20  # one kernel's entries, raw JSON (the largest real one is ~200 KB)


# Scratch Triton asks for per program (global: in-kernel TMA descriptors and the like, a few hundred bytes; profile:
# proton only). The launcher allocates grid * num_ctas * size bytes per launch through torch: a bundle must not
# make that 2^40 per program (1 MiB is far above any real kernel and above a Hopper SM's shared memory).
MAX_SCRATCH_BYTES = 1 << 20
MAX_SCRATCH_ALIGN = 1 << 20


def _align(f: _Fields, name: str) -> int:
    value = f.int(name, 1, MAX_SCRATCH_ALIGN)
    if value & (value - 1):
        raise f._bad(name, f"= {value} is not a power of two")
    return value


@dataclass(frozen=True)
class TritonLaunch:
    """How to launch one Triton cubin (mirrors what Triton's own launcher reads from metadata)."""

    symbol: str
    num_warps: int
    num_ctas: int
    cluster_dims: tuple[int, int, int]
    shared: int
    global_scratch_size: int
    global_scratch_align: int
    profile_scratch_size: int
    profile_scratch_align: int
    launch_pdl: bool
    launch_cooperative_grid: bool
    # Device parameters in order: (index of the Python parameter, type code). The two
    # trailing scratch pointers Triton appends are not listed; the launcher adds them.
    args: tuple[tuple[int, str], ...]
    compile_hash: str

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["cluster_dims"] = list(self.cluster_dims)
        d["args"] = [[i, t] for i, t in self.args]
        return d

    @classmethod
    def from_json(cls, f: _Fields) -> TritonLaunch:
        cluster = f.get("cluster_dims", list)
        args = f.get("args", list)
        _check_cluster(f, cluster)
        parsed_args = []
        for a in args:
            if (
                not isinstance(a, list)
                or len(a) != 2
                or not isinstance(a[0], int)
                or isinstance(a[0], bool)
                or not 0 <= a[0] < 4096
                or not isinstance(a[1], str)
                or len(a[1]) != 1
                or a[1] not in ARG_TYPE_CODES
            ):
                raise f._bad("args", f"has a malformed item {a!r}")
            if parsed_args and a[0] <= parsed_args[-1][0]:
                raise f._bad("args", f"indices are not increasing at {a!r}")
            parsed_args.append((a[0], a[1]))
        return cls(
            symbol=f.str("symbol", max_len=512),
            num_warps=f.int("num_warps", 1, 32),
            num_ctas=f.int("num_ctas", 1, 16),
            cluster_dims=(cluster[0], cluster[1], cluster[2]),
            shared=f.int("shared", 0, 1 << 20),
            global_scratch_size=f.int("global_scratch_size", 0, MAX_SCRATCH_BYTES),
            global_scratch_align=_align(f, "global_scratch_align"),
            profile_scratch_size=f.int("profile_scratch_size", 0, MAX_SCRATCH_BYTES),
            profile_scratch_align=_align(f, "profile_scratch_align"),
            launch_pdl=f.get("launch_pdl", bool),
            launch_cooperative_grid=f.get("launch_cooperative_grid", bool),
            args=tuple(parsed_args),
            compile_hash=f.str("compile_hash", max_len=128),
        )


@dataclass(frozen=True)
class TileLangLaunch:
    """How to launch one TileLang cubin: captured from the lowered program at build time.

    params: device parameters in device order, each {"kind": "tensor", "name": ...} or
    {"kind": "scalar", "name": <dynamic var>, "ctype": "int32"}. grid and block are
    expressions (see launch_expr) over the dynamic vars; dynamic_vars says where each var
    is read from ({"param": tensor name, "dim": axis}).
    """

    symbol: str
    params: tuple[dict[str, Any], ...]
    tensor_params: tuple[dict[str, Any], ...]
    dynamic_vars: dict[str, dict[str, Any]]
    grid: tuple[Any, Any, Any]
    block: tuple[Any, Any, Any]
    dynamic_smem: int
    pdl: bool
    cluster_dims: tuple[int, int, int] | None
    cooperative: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "symbol": self.symbol,
            "params": list(self.params),
            "tensor_params": list(self.tensor_params),
            "dynamic_vars": self.dynamic_vars,
            "grid": list(self.grid),
            "block": list(self.block),
            "dynamic_smem": self.dynamic_smem,
            "pdl": self.pdl,
            "cluster_dims": list(self.cluster_dims) if self.cluster_dims else None,
            "cooperative": self.cooperative,
        }

    @classmethod
    def from_json(cls, f: _Fields) -> TileLangLaunch:
        from nojit.loader.bundle.launch_expr import validate_expr

        params = f.get("params", list)
        tensor_params = f.get("tensor_params", list)
        dyn = f.get("dynamic_vars", dict)
        grid = f.get("grid", list)
        block = f.get("block", list)
        tensors: dict[str, int] = {}  # tensor parameter name -> rank
        for p in tensor_params:
            tf = _Fields(p, f"{f.where}.tensor_params[]", f.source)
            name = tf.str("name", max_len=256)
            if name in tensors:
                raise tf._bad("name", f"{name!r} is listed twice")
            if tf.str("dtype", max_len=32) not in TORCH_DTYPES:
                raise tf._bad("dtype", f"= {p['dtype']!r} is not a torch dtype the launcher checks")
            shape = tf.get("shape", list)
            if len(shape) > 16:
                raise tf._bad("shape", "has more than 16 dimensions")
            for d in shape:
                try:
                    validate_expr(d, _ANY_NAME)  # shapes may name variables the launch never reads
                except ValueError as exc:
                    raise tf._bad("shape", f"holds an invalid expression: {exc}") from None
            tensors[name] = len(shape)
        for name, src in dyn.items():
            sf = _Fields(src, f"{f.where}.dynamic_vars.{name}", f.source)
            if not name.isidentifier():
                raise sf._bad("name", f"{name!r:.80} is not an identifier")
            param = sf.str("param", max_len=256)
            if param not in tensors:
                raise sf._bad("param", f"names {param!r}, which is not a tensor parameter")
            sf.int("dim", 0, tensors[param] - 1)
        for p in params:
            pf = _Fields(p, f"{f.where}.params[]", f.source)
            kind = pf.str("kind")
            name = pf.str("name", max_len=256)
            if kind == "scalar":
                if pf.str("ctype") not in ("int32", "int64"):
                    raise pf._bad("ctype", "is not int32 or int64")
                if name not in dyn:
                    raise pf._bad("name", f"{name!r} is not a dynamic variable")
            elif kind == "tensor":
                if name not in tensors:
                    raise pf._bad("name", f"{name!r} is not a tensor parameter")
            else:
                raise pf._bad("kind", f"= {kind!r} is not tensor or scalar")
        if len(grid) != 3 or len(block) != 3:
            raise f._bad("grid", "grid and block must have three expressions each")
        for what, exprs in (("grid", grid), ("block", block)):
            for e in exprs:
                try:
                    validate_expr(e, frozenset(dyn))
                except ValueError as exc:
                    raise f._bad(what, f"holds an invalid expression: {exc}") from None
            limits = _GRID_LIMITS if what == "grid" else (1024, 1024, 64)
            if any(isinstance(e, int) and not 0 <= e <= hi for e, hi in zip(exprs, limits)):
                raise f._bad(what, f"{exprs} is not a launch size (at most {limits})")
        if all(isinstance(e, int) for e in block) and not 1 <= block[0] * block[1] * block[2] <= 1024:
            raise f._bad("block", f"{block} is not 1 to 1024 threads")
        cluster = f.get("cluster_dims", list, optional=True)
        if cluster is not None:
            _check_cluster(f, cluster)
        return cls(
            symbol=f.str("symbol", max_len=512),
            params=tuple(params),
            tensor_params=tuple(tensor_params),
            dynamic_vars=dyn,
            grid=(grid[0], grid[1], grid[2]),
            block=(block[0], block[1], block[2]),
            dynamic_smem=f.int("dynamic_smem", 0, 1 << 20),
            pdl=f.get("pdl", bool),
            cluster_dims=(cluster[0], cluster[1], cluster[2]) if cluster else None,
            cooperative=f.get("cooperative", bool),
        )


@dataclass(frozen=True)
class CuteLaunch:
    """A CuTeDSL entry: its blob is the object file CuTeDSL's `export_to_c` wrote (host code plus the
    embedded sm_90a cubin), loaded with `cute.runtime.load_module`; `symbol` is the exported function."""

    symbol: str
    options: str  # the cute.compile options vLLM passed (e.g. --enable-tvm-ffi)

    def to_json(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "options": self.options}

    @classmethod
    def from_json(cls, f: _Fields) -> CuteLaunch:
        symbol = f.str("symbol", max_len=256)
        if not symbol.isidentifier():
            raise f._bad("symbol", f"{symbol!r:.80} is not an identifier")
        return cls(symbol, f.str("options", max_len=1024))


@dataclass(frozen=True)
class DeepGemmLaunch:
    """One DeepGEMM cache entry: DeepGEMM launches it itself, after finding it by this name in the cache
    the loader seeds (loader/runtimes/deepgemm/cache.py). source is the kernel.cu DeepGEMM generated; calls are the
    (shape, N, K, first M, last M) runs the build saw DeepGEMM pick this entry for (messages, coverage)."""

    entry: str
    source: str
    calls: tuple[tuple[str, int, int, int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"entry": self.entry, "source": self.source, "calls": [list(c) for c in self.calls]}

    @classmethod
    def from_json(cls, f: _Fields) -> DeepGemmLaunch:
        entry = f.str("entry", max_len=256)
        stem, dot, digest = entry.partition(".")
        if not (dot and stem.isidentifier() and digest and set(digest) <= _HEX):
            raise f._bad("entry", f"= {entry!r:.80} is not a DeepGEMM cache entry name (<kernel>.<hex digest>)")
        calls = []
        for c in f.get("calls", list):
            if not (isinstance(c, list) and len(c) == 5 and isinstance(c[0], str)
                    and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 1 << 40 for x in c[1:])):
                raise f._bad("calls", "holds a call that is not [shape, N, K, first M, last M]")
            calls.append((c[0], c[1], c[2], c[3], c[4]))
        source = f.get("source", str)  # C++ text: newlines are part of it
        if len(source) > 1 << 16 or "\0" in source:
            raise f._bad("source", "is not a DeepGEMM kernel.cu (too long or holds NUL)")
        return cls(entry, source, tuple(calls))


@dataclass(frozen=True)
class KernelRecord:
    """One kernel function: identity, which runtime compiled it, and its source digest.

    id is "module:qualname" (never the bare function name: many vLLM kernels are named
    `kernel`). source_hash is Triton's `JITFunction.cache_key` (source plus dependencies)
    or, for TileLang, the sha256 of the kernel function's source text; the loader refuses
    to serve a kernel whose live source no longer has this digest. A Triton kernel's info may hold
    `source_parts` (optional; what that cache_key was made of, so that the loader can prove it unchanged
    without Triton's AST walk: loader/runtimes/triton/source_parts.py); without it the loader asks cache_key.
    An autotuned Triton kernel's info may hold `autotune` (optional; its tuning keys, configs and winners:
    loader/bundle/autotune.py), checked here, at open, and kept parsed as `autotune`.
    """

    id: str
    runtime: str
    source_hash: str
    params: tuple[str, ...]
    info: dict[str, Any] = field(default_factory=dict)
    autotune: AutotuneRecord | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "source_hash": self.source_hash, "params": list(self.params), "info": self.info}

    @classmethod
    def from_json(cls, kid: str, f: _Fields) -> KernelRecord:
        module, _, qualname = kid.partition(":")
        if len(kid) > 512 or not _dotted(module) or not _dotted(qualname) or any(
            p.startswith("__") for p in qualname.split(".")
        ):
            raise f._bad("id", f"{kid!r:.80} is not module:qualname")
        runtime = f.str("runtime")
        if runtime not in RUNTIMES:
            raise f._bad("runtime", f"= {runtime!r} is not one of {tuple(RUNTIMES)}")
        params = f.get("params", list)
        try:
            names_ok = all(map(str.isidentifier, params))
        except TypeError:  # not a str
            names_ok = False
        if len(params) > 4096 or not names_ok:
            raise f._bad("params", "holds a name that is not an identifier")
        info = f.get("info", dict)
        autotune = None
        if "autotune" in info:  # only the Triton room reads it; checked for every record alike
            autotune = AutotuneRecord.from_json(info["autotune"], f"{f.where}.info.autotune", f.source)
        return cls(kid, runtime, f.str("source_hash", max_len=128), tuple(params), info, autotune)


@dataclass(frozen=True)
class Entry:
    """One compiled specialization: kernel + exact key -> cubin + how to launch it."""

    kernel: str
    key: Any  # JSON form; decoded by the runtime's key module (triton_key / tilelang_key)
    variant: str
    blob: str
    launch: Any  # the runtime's launch record (RUNTIMES[runtime].parse): TritonLaunch, TileLangLaunch, ...
    origin: str = "declared"
    # the key as the runtime's key module decodes it, where validation decoded it already (Triton: the
    # hashable key the server looks up); not part of the entry's identity or JSON form
    decoded: Any = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "key": self.key,
            "variant": self.variant,
            "blob": self.blob,
            "launch": self.launch.to_json(),
            "origin": self.origin,
        }


@dataclass(frozen=True)
class Manifest:
    """The whole manifest: the index's facts plus every kernel's entries (writer, tools, tests)."""

    format: int
    producer: Producer
    target: Target
    deployment: dict[str, Any]
    kernels: dict[str, KernelRecord]
    entries: tuple[Entry, ...]
    blobs: dict[str, BlobRef]

    def to_json(self) -> dict[str, Any]:
        """The logical JSON form (one object; `nojit inspect --json`), not the file's split form."""
        return {
            "format": self.format,
            "producer": self.producer.to_json(),
            "target": self.target.to_json(),
            "deployment": self.deployment,
            "kernels": {k: v.to_json() for k, v in self.kernels.items()},
            "entries": [e.to_json() for e in self.entries],
            "blobs": {k: v.to_json() for k, v in self.blobs.items()},
        }


@dataclass(frozen=True)
class Index:
    """What a bundle file holds, without the entries: read and fully checked at open."""

    format: int
    producer: Producer
    target: Target
    deployment: dict[str, Any]
    kernels: dict[str, KernelRecord]
    blobs: dict[str, BlobRef]
    sections: dict[str, SectionRef]  # kernel id -> its entries in the file

    @property
    def entry_count(self) -> int:
        return sum(s.entries for s in self.sections.values())

    def to_json(self) -> dict[str, Any]:
        kernels = {k: {**v.to_json(), "section": self.sections[k].to_json()} for k, v in self.kernels.items()}
        return {
            "format": self.format,
            "producer": self.producer.to_json(),
            "target": self.target.to_json(),
            "deployment": self.deployment,
            "kernels": kernels,
            "blobs": {k: v.to_json() for k, v in self.blobs.items()},
        }

    @classmethod
    def from_json(cls, obj: Any, source: str, file_size: int) -> Index:
        f = _Fields(obj, "manifest", source)
        fmt = f.int("format", 0, 1 << 30)
        if fmt != FORMAT_VERSION:
            raise format_error(source, fmt)
        blobs = _blob_table(f.get("blobs", dict), source, file_size)
        kernels: dict[str, KernelRecord] = {}
        sections: dict[str, SectionRef] = {}
        for kid, rec in f.get("kernels", dict).items():
            kf = _Fields(rec, f"manifest.kernels[{kid!r}]", source)
            kernels[kid] = KernelRecord.from_json(kid, kf)
            sections[kid] = SectionRef.from_json(kf.sub("section"), file_size)
        return cls(
            format=fmt,
            producer=Producer.from_json(f.sub("producer")),
            target=Target.from_json(f.sub("target")),
            deployment=f.get("deployment", dict),
            kernels=kernels,
            blobs=blobs,
            sections=sections,
        )


_HEX_RUN = re.compile("[0-9a-f]*")
_BLOB_FIELDS = ("offset", "length", "size")


def _blob_table(table: dict[str, Any], source: str, file_size: int) -> dict[str, BlobRef]:
    """The blob table, the largest part of the index: each digest and size checked as _Fields would, in bulk
    (one regex over all digests, a type test per size) so that opening stays cheap; a failure is then
    located and reported by _Fields."""
    shas = list(table)
    if not all(len(sha) == 64 for sha in shas) or not _HEX_RUN.fullmatch("".join(shas)):
        bad = next(sha for sha in shas if len(sha) != 64 or not _HEX_RUN.fullmatch(sha))
        raise _Fields(table[bad], f"manifest.blobs.{bad[:12]}", source)._bad("sha256", "is not a sha256 hex digest")
    cap = min(file_size, MAX_CUBIN_BYTES + (1 << 20))
    blobs: dict[str, BlobRef] = {}
    for sha, ref in table.items():
        try:
            offset, length, size = ref["offset"], ref["length"], ref["size"]
            ok = type(offset) is int and type(length) is int and type(size) is int and (
                0 <= offset <= file_size and 1 <= length <= cap and 1 <= size <= MAX_CUBIN_BYTES)
        except (TypeError, KeyError):
            ok = False
        if not ok:
            bf = _Fields(ref, f"manifest.blobs.{sha[:12]}", source)
            bf.int("offset", 0, file_size), bf.int("length", 1, cap), bf.int("size", 1, MAX_CUBIN_BYTES)
        if offset + length > file_size:
            raise _Fields(ref, f"manifest.blobs.{sha[:12]}", source)._bad(
                "length", f"runs past the end of the file ({offset}+{length} > {file_size} bytes)")
        blobs[sha] = BlobRef(sha, offset, length, size)
    return blobs


def format_error(source: str, fmt: int) -> Exception:
    from nojit.loader.errors import BundleMismatchError

    older = " (format 1: one manifest, read whole at every start; nojit before the indexed layout)" if fmt == 1 else ""
    return BundleMismatchError(
        f"{source}: bundle format {fmt}{older}, this nojit reads format {FORMAT_VERSION}",
        fix="rebuild the bundle with this nojit (`nojit build`, same deployment: the compile cache makes it quick), "
        "or install the nojit that built it",
    )


def _check_section_shape(record: KernelRecord, ref: SectionRef, obj: Any, source: str) -> None:
    """A section is a list of as many entries as the index says."""
    where = f"manifest.kernels[{record.id!r}].section"
    if not isinstance(obj, list):
        raise BundleCorruptError(f"{source}: manifest field {where} is not a list of entries", fix=_REBUILD)
    if len(obj) != ref.entries:
        raise BundleCorruptError(f"{source}: manifest field {where} holds {len(obj)} entries, the index says "
                                 f"{ref.entries}", fix=_REBUILD)


def parse_section(record: KernelRecord, ref: SectionRef, obj: Any, blobs: dict[str, BlobRef],
                  source: str) -> tuple[Entry, ...]:
    """One kernel's entries (its section's JSON list), every field checked as at open in format 1."""
    _check_section_shape(record, ref, obj, source)
    entries = [_entry_from_json(i, e, record, blobs, source) for i, e in enumerate(obj)]
    _check_kernel_entries(record, entries, source)
    return tuple(entries)


def parse_section_part(record: KernelRecord, ref: SectionRef, obj: Any, blobs: dict[str, BlobRef], source: str,
                       variant: str) -> tuple[Entry, ...]:
    """One variant's entries of the section, each checked as parse_section checks it (the section's shape and
    count every time; the "exact" part also takes every entry that is not a well-formed generic one, so that each
    entry is validated by one part or the other and a malformed one at the kernel's first use)."""
    _check_section_shape(record, ref, obj, source)
    if variant == "generic":
        picked = [(i, e) for i, e in enumerate(obj) if type(e) is dict and e.get("variant") == "generic"]
    else:
        picked = [(i, e) for i, e in enumerate(obj) if not (type(e) is dict and e.get("variant") == "generic")]
    entries = [_entry_from_json(i, e, record, blobs, source) for i, e in picked]
    _check_kernel_entries(record, entries, source)  # keys are distinct per variant: a part holds all of its own
    return tuple(entries)


# Per-kernel validation: each function below reads one entry, or one kernel's entries, and
# nothing else of the manifest: it runs at the kernel's first use (parse_section).
def _entry_from_json(i: int, e: Any, record: KernelRecord, blobs: dict[str, BlobRef], source: str) -> Entry:
    """One entry of `record`'s section, with every field a launch reads checked against the record."""
    ef = _Fields(e, f"manifest.kernels[{record.id!r}].section[{i}]", source)
    kernel = record.id
    blob = _sha(ef, "blob")
    if blob not in blobs:
        raise ef._bad("blob", f"names a blob {blob[:12]} the manifest does not list")
    variant = ef.str("variant")
    if variant not in VARIANTS:
        raise ef._bad("variant", f"= {variant!r:.40} is not one of {VARIANTS}")
    if "key" not in ef.obj:
        raise ef._bad("key", "is missing")
    key = _check_json_value(ef.obj["key"], ef)
    launch_record = RUNTIMES[record.runtime]
    launch = launch_record.parse(ef.sub("launch"))
    decoded = launch_record.check_key(ef, key, launch, record)
    return Entry(kernel, key, variant, blob, launch, ef.str("origin", max_len=1024), decoded)


def entry_section_json(e: Entry) -> dict[str, Any]:
    """An entry as its kernel's section stores it (the kernel is the section's)."""
    d = e.to_json()
    del d["kernel"]
    return d


def _check_triton_key(ef: _Fields, key: Any, launch: TritonLaunch, record: KernelRecord) -> Any:
    """The key decodes, has one item per parameter, and the launch passes exactly its run-time items, typed alike.
    Returns the decoded key."""
    from nojit.loader.bundle.triton_key import key_from_json

    try:
        decoded = key_from_json(key)
        spec, _options = decoded
    except ValueError as exc:
        raise ef._bad("key", f"is not a Triton key: {exc}") from None
    if len(spec) != len(record.params):
        raise ef._bad("key", f"has {len(spec)} items for {len(record.params)} parameters")
    runtime = [i for i, (ty, _) in enumerate(spec) if ty != "constexpr"]
    if [i for i, _ in launch.args] != runtime:
        raise ef._bad("launch.args", f"passes parameters {[i for i, _ in launch.args]}, the key's run-time "
                      f"parameters are {runtime}")
    for index, code in launch.args:
        ty = spec[index][0]
        want = "p" if ty.startswith("*") else TRITON_TYPE_CODES.get(ty)
        if code != want:
            raise ef._bad("launch.args", f"passes parameter {index} ({ty}) as {code!r}, expected {want!r}")
    return decoded


def _check_cute_key(ef: _Fields, key: Any, launch: CuteLaunch, record: KernelRecord) -> None:
    from nojit.loader.bundle.cutedsl_key import validate

    try:
        validate(key)
    except ValueError as exc:
        raise ef._bad("key", f"is not a CuTeDSL key: {exc}") from None


def _check_fi_cute_key(ef: _Fields, key: Any, launch: CuteLaunch, record: KernelRecord) -> None:
    from nojit.loader.bundle.fi_cute_key import kernel_of, validate

    try:
        validate(key)
    except ValueError as exc:
        raise ef._bad("key", f"is not a FlashInfer CuTeDSL cache key: {exc}") from None
    if kernel_of(key) != record.id:
        raise ef._bad("key", f"is a key of {kernel_of(key)[:200]}, not of its kernel")


def _check_tilelang_key(ef: _Fields, key: Any, launch: TileLangLaunch, record: KernelRecord) -> None:
    from nojit.loader.bundle.tilelang_key import key_from_json

    try:
        key_from_json(key)
    except ValueError as exc:
        raise ef._bad("key", f"is not a TileLang key: {exc}") from None


def _check_kernel_entries(record: KernelRecord, entries: list[Entry], source: str) -> None:
    """Across one kernel's entries: no key twice, and one TileLang tensor signature (the server reads the first)."""
    seen: set[tuple[bytes, str]] = set()
    for e in entries:
        ident = (canonical_json(e.key), e.variant)
        if ident in seen:
            raise BundleCorruptError(f"{source}: kernel {record.id} has two {e.variant} entries for key "
                                     f"{ident[0][:200].decode()}", fix=_REBUILD)
        seen.add(ident)
    check_entries = RUNTIMES[record.runtime].check_entries
    if check_entries is not None:
        check_entries(record, entries, source)


def _check_deepgemm_key(ef: _Fields, key: Any, launch: DeepGemmLaunch, record: KernelRecord) -> None:
    """The key is the entry name, or a call recorded by NOJIT_MODE=record."""
    if not (key == launch.entry or isinstance(key, dict)):
        raise ef._bad("key", f"names {str(key)[:80]!r}, its launch serves {launch.entry}")


def _check_flashinfer_key(ef: _Fields, key: Any, launch: FlashInferLaunch, record: KernelRecord) -> None:
    if launch.kind == "module" and key != launch.module:
        raise ef._bad("key", "is not the FlashInfer module's name")


def _check_humming_key(ef: _Fields, key: Any, launch: HummingLaunch, record: KernelRecord) -> None:
    if not (isinstance(key, dict) and key.get("class") == record.id and isinstance(key.get("args"), dict)):
        raise ef._bad("key", "is not {class: <this kernel>, args: {...}} (a Humming kernel's constructor arguments)")


def _check_tilelang_entries(record: KernelRecord, entries: list[Entry], source: str) -> None:
    """One TileLang tensor signature per kernel (the server reads the first entry's)."""
    if entries:
        names = [t["name"] for t in entries[0].launch.tensor_params]
        for e in entries[1:]:
            if [t["name"] for t in e.launch.tensor_params] != names:
                raise BundleCorruptError(f"{source}: kernel {record.id}: entries disagree on its tensor parameters",
                                         fix=_REBUILD)


@dataclass(frozen=True)
class LaunchRecord:
    """How the manifest reads one runtime's entries: its launch record and the checks of an entry's key."""

    parse: Callable[[_Fields], Any]  # the entry's "launch" object -> the runtime's launch record
    check_key: Callable[[_Fields, Any, Any, KernelRecord], Any]  # raises on a bad key; the decoded key or None
    check_entries: Callable[[KernelRecord, list[Entry], str], None] | None = None  # across one kernel's entries
    provenance: Provenance = Provenance("its compiler")  # what built the entries, what serving them needs


# The runtimes a manifest may name, in the order the startup line lists them (one line per runtime). A
# runtime outside the package (a test's) is added for a scope with `registered`.
RUNTIMES: dict[str, LaunchRecord] = {
    "triton": LaunchRecord(TritonLaunch.from_json, _check_triton_key, provenance=Provenance(
        "Triton's ptxas", producer_compiler="ptxas", producer_version="triton")),
    "tilelang": LaunchRecord(TileLangLaunch.from_json, _check_tilelang_key, _check_tilelang_entries, Provenance(
        "TileLang's nvcc", "nvcc_version", arch_fields=("nvcc_flags",), producer_version="tilelang",
        optional_install=True)),
    "cutedsl": LaunchRecord(CuteLaunch.from_json, _check_cute_key, provenance=Provenance(
        "CuTeDSL's compiler", packages=tuple((tool, tool) for tool in TOOL_FACTS["cutedsl"]))),
    "flashinfer_cute": LaunchRecord(CuteLaunch.from_json, _check_fi_cute_key, provenance=Provenance(  # cached_compile
        "CuTeDSL's compiler", packages=tuple((tool, tool) for tool in TOOL_FACTS["flashinfer_cute"]))),
    "deepgemm": LaunchRecord(DeepGemmLaunch.from_json, _check_deepgemm_key, provenance=Provenance(
        "DeepGEMM's nvcc", "nvcc_version", producer_compiler="nvcc", vendored_in="vllm")),
    "flashinfer": LaunchRecord(FlashInferLaunch.from_json, _check_flashinfer_key, provenance=Provenance(
        "FlashInfer's nvcc", "nvcc", arch_fields=("cuda_arch",),
        packages=(("flashinfer_version", "flashinfer-python"),))),
    "humming": LaunchRecord(HummingLaunch.from_json, _check_humming_key, provenance=Provenance(
        "Humming's NVRTC", "nvrtc", packages=(("humming_version", "humming-kernels"),),
        library=("nvrtc", "nvidia-cuda-nvrtc", "NVRTC"))),
}


@contextlib.contextmanager
def registered(runtime: str, record: LaunchRecord) -> Iterator[LaunchRecord]:
    """Manifests may name `runtime` for the scope of the with block."""
    if runtime in RUNTIMES:
        raise ValueError(f"runtime {runtime!r} already has a launch record")
    RUNTIMES[runtime] = record
    try:
        yield record
    finally:
        del RUNTIMES[runtime]


def _dotted(name: str) -> bool:
    return bool(name) and all(part.isidentifier() for part in name.split("."))


def _check_json_value(value: Any, f: _Fields, depth: int = 0) -> Any:
    """Keys are small JSON trees: bounded depth, finite numbers only."""
    if depth > 16:
        raise f._bad("key", "is nested too deeply")
    if isinstance(value, float) and not math.isfinite(value):
        raise f._bad("key", "holds a non-finite number")
    if isinstance(value, (list, dict)):
        for v in value if isinstance(value, list) else value.values():
            if v is None or type(v) is str or type(v) is int or type(v) is bool:  # a leaf that can only be too deep
                if depth >= 16:
                    raise f._bad("key", "is nested too deeply")
            else:
                _check_json_value(v, f, depth + 1)
    elif not (value is None or isinstance(value, (bool, int, float, str))):
        raise f._bad("key", f"holds a {type(value).__name__}")
    return value
