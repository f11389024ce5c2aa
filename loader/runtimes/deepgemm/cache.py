"""DeepGEMM's own JIT cache, seeded from the bundle: the key scheme is DeepGEMM's, the files nojit's.

DeepGEMM 2.8.1 (vLLM's vendored copy) looks a kernel up as
`$DG_JIT_CACHE_DIR/cache/<kernel>.<digest>/kernel.cubin` (with `.committed` beside it), where the
digest covers the generated source, the flags and the text of `nvcc --version` (measured: the
same source under another nvcc version text gets another digest; the nvcc path and DeepGEMM's
install path do not change it). The bundle holds each entry under that exact name, so DeepGEMM's
own lookup finds it. The digest also covers the `deep_gemm/` headers the generated kernel.cu
includes: DeepGEMM reads them from `<package>/include/deep_gemm/` on every lookup, a hit included
(measured: 16 headers for sm90_fp8_gemm_1d2d; cute/ and cutlass/ are not read), so the installed
package must keep them (check_headers). The directory is written once per bundle (named by the section's digest), in a folder only this user
can write (loader/private_dir.py), every cubin checked against its sha256 on its descriptor each time it is
opened, and the entries left read-only.

The bundle's DeepGEMM section (a plain dict in the manifest):
    {"deep_gemm_version": "2.8.1", "nvcc_version": "<text of nvcc --version>", "sm_count": 132,
     "entries": {"<kernel>.<digest>": {"cubin": "<blob sha256>", "source": "<kernel.cu text>"}},
     "keys": [[op, shape_name, n, k, m_first, m_last, entry], ...]}
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from nojit.loader.errors import BundleCorruptError, BundleMismatchError
from nojit.loader.private_dir import PrivateDir, open_private

STUB_NVCC = "#!/bin/sh\n# nojit: DeepGEMM's compiler is answered in process; this file is never run.\nexit 127\n"


def section_digest(section: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(section, sort_keys=True).encode()).hexdigest()[:24]


def default_base() -> str:
    """NOJIT_DEEPGEMM_DIR, else <runtime dir>/deepgemm (this user's 0700 folder: nobody else can add entries)."""
    base = os.environ.get("NOJIT_DEEPGEMM_DIR")
    if not base:
        from nojit.loader.strict.firewall import runtime_dir

        base = os.path.join(runtime_dir(), "deepgemm")
    return os.path.abspath(base)


def cache_root(section: dict[str, Any], base: str | None = None) -> str:
    return os.path.join(os.path.abspath(base) if base else default_base(), section_digest(section))


def _write_once(folder: PrivateDir, name: str, data: bytes, mode: int) -> None:
    if folder.sha256(name) is None:
        folder.write(name, data, mode)


def seed(section: dict[str, Any], read_blob: Callable[[str], bytes], bundle_path: str, base: str | None = None) -> str:
    """Materialize every entry; returns the DG_JIT_CACHE_DIR to use. Idempotent across ranks. Every folder is
    one only this user can write and every file is written and checked through its descriptors
    (loader/private_dir.py), so what DeepGEMM later reads by path is what was checked here."""
    root = cache_root(section, base)
    for name in section["entries"]:
        if "/" in name or name.startswith("."):
            raise BundleCorruptError(f"bundle {bundle_path}: bad DeepGEMM entry name {name!r}",
                                     fix="rebuild the bundle with `nojit build`")
    with open_private(root) as top:
        with top.child("cache") as cache, top.child("tmp"), top.child("bin") as bin_dir:  # tmp: where DeepGEMM stages a miss
            _write_once(bin_dir, "nvcc", STUB_NVCC.encode(), 0o555)
            for name, entry in section["entries"].items():
                with cache.child(name) as d:
                    cubin_path = os.path.join(d.path, "kernel.cubin")
                    # hashed once: on the descriptor it was written through, or as it lies (a later process)
                    digest = d.sha256("kernel.cubin")
                    if digest is None:
                        digest = d.write("kernel.cubin", read_blob(entry["cubin"]), 0o444)
                    if digest != entry["cubin"]:
                        raise BundleCorruptError(
                            f"DeepGEMM entry {name}: {cubin_path} does not match its sha256 {entry['cubin'][:16]}...",
                            fix=f"remove {root} (it is rebuilt from the bundle {bundle_path})")
                    _write_once(d, "kernel.cu", entry["source"].encode(), 0o444)
                    _write_once(d, ".committed", b"", 0o444)
    return root


def check_headers(package_dir: str, bundle_path: str) -> None:
    """DeepGEMM hashes its own headers into every key; without them each call fails deep inside it
    (deep_jit parser.hpp: "failed to open: " with an empty name), so say so before serving."""
    headers = os.path.join(package_dir, "include", "deep_gemm")
    if not os.path.isdir(headers):
        raise BundleMismatchError(
            f"DeepGEMM at {package_dir} has no headers ({headers}): its cache key hashes them, so no entry of "
            f"bundle {bundle_path} can be found",
            fix="install vLLM's vendored DeepGEMM with its include/ folder unchanged (the build hashed those headers)")


def headers_digest(package_dir: str) -> str:
    """DeepGEMM's version and every header under include/deep_gemm: what DeepGEMM hashes into each entry
    name besides the generated source, so the bundle's kernel records carry it as their source digest."""
    h = hashlib.sha256()
    with open(os.path.join(package_dir, "__init__.py"), "rb") as f:
        h.update(f.read())
    headers = os.path.join(package_dir, "include", "deep_gemm")
    for folder, dirs, names in sorted(os.walk(headers)):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(folder, name)
            h.update(os.path.relpath(path, headers).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def section_of(records: Mapping[str, Any], entries_of: Callable[[str], Iterable[Any]],
               kernel_ids: list[str]) -> dict[str, Any]:
    """The section (module docstring) for the bundle's DeepGEMM kernels: entries and keys from their
    entries' launches (entries_of: kernel id -> its Entry records), the facts DeepGEMM's key depends on
    from their kernel records (one value each)."""
    section: dict[str, Any] = {"entries": {}, "keys": []}
    for kid in kernel_ids:
        info = records[kid].info
        for fact in ("deep_gemm_version", "nvcc_version", "sm_count", "pdl", "use_ue8m0"):
            if section.setdefault(fact, info.get(fact)) != info.get(fact):
                raise BundleCorruptError(f"DeepGEMM kernels of the bundle disagree on {fact}",
                                         fix="rebuild the bundle with `nojit build`")
    for kid in kernel_ids:
        op = kid.rpartition(":")[2]
        for e in entries_of(kid):
            launch = e.launch
            section["entries"][launch.entry] = {"cubin": e.blob, "source": launch.source}
            section["keys"].extend([op, *call, launch.entry] for call in launch.calls)
    section["keys"].sort()
    return section


def find_key(section: dict[str, Any], op: str, n: int, k: int, m: int, shape: str | None = None) -> str | None:
    """The entry the build saw DeepGEMM pick for (op, n, k, m) (of the named shape: two mHC call sites share
    N and K and differ in their split count), for messages and checks."""
    for row in section["keys"]:
        if row[0] == op and row[2] == n and row[3] == k and row[4] <= m <= row[5] and shape in (None, row[1]):
            return row[6]
    return None


def compress_keys(keys: list[dict]) -> list[list]:
    """[{op, name, n, k, m, entry}] -> rows with runs of consecutive M on one entry merged."""
    rows: list[list] = []
    for key in sorted(keys, key=lambda x: (x["op"], x["name"], x["n"], x["k"], x["m"])):
        last = rows[-1] if rows else None
        if (last and last[0] == key["op"] and last[1] == key["name"] and last[2] == key["n"]
                and last[3] == key["k"] and last[6] == key["entry"] and last[5] + 1 == key["m"]):
            last[5] = key["m"]
        else:
            rows.append([key["op"], key["name"], key["n"], key["k"], key["m"], key["m"], key["entry"]])
    return rows
