"""Compile one DeepGEMM cache entry with DeepGEMM's own generated source and its own nvcc flags.

The flags are the ones DeepGEMM wrote into the entry's meta.json during enumeration, with the
installed DeepGEMM's folder as the placeholder `<deep_gemm>` (portable_flags), so a plan made on
one box compiles on another. Only the compiler (the real nvcc whose `--version` text is in the
entry's name), the source path and the output path are DeepGEMM's choice no longer.

Compiles go through a content-addressed cache (<cache_dir>/deepgemm/<digest>.cubin): the digest
covers everything that changes the output (DeepGEMM's entry name, which already hashes source,
flags and nvcc text; the source; the flags; the nvcc version text), so a rebuild compiles nothing
it compiled before. Each compile runs in its own folder and the cubin appears by rename, so
parallel workers (and builds) sharing a cache never see a partial file.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from importlib.util import find_spec

from nojit.aot.errors import BuildError

PLACEHOLDER = "<deep_gemm>"


@dataclass(frozen=True)
class CompiledEntry:
    name: str           # DeepGEMM's cache directory name: <kernel>.<digest>
    cubin: bytes
    seconds: float      # 0.0 when the cache answered
    cached: bool


PACKAGE_SETTING = "NOJIT_DEEPGEMM_PACKAGE"


def deep_gemm_dir() -> str:
    """The vendored DeepGEMM package folder whose include/ the compiles read: the installed one (found without
    importing its extension), or the folder NOJIT_DEEPGEMM_PACKAGE names, so that a plan's entries (`nojit build
    --from-plan`, whose requests carry DeepGEMM's generated source and flags) compile on a box without vLLM."""
    given = os.environ.get(PACKAGE_SETTING)
    if given:
        if not os.path.isdir(os.path.join(given, "include", "deep_gemm")):
            raise BuildError(f"{PACKAGE_SETTING}={given} has no include/deep_gemm folder",
                             fix="point it at a copy of vLLM 0.33.0's vllm/third_party/deep_gemm with its include/ "
                             "(deep_gemm, cute and cutlass headers)")
        return os.path.abspath(given)
    spec = find_spec("vllm.third_party.deep_gemm")
    if spec is None or not spec.origin:
        raise BuildError("vLLM's vendored DeepGEMM (vllm.third_party.deep_gemm) is not installed",
                         fix="install vLLM 0.33.0, or build without DeepGEMM (--runtime triton,tilelang)")
    return os.path.dirname(os.path.abspath(spec.origin))


def portable_flags(flags: list[str], package: str) -> list[str]:
    return [f.replace(package, PLACEHOLDER) for f in flags]


def local_flags(flags: list[str], package: str) -> list[str]:
    return [f.replace(PLACEHOLDER, package) for f in flags]


def cache_digest(name: str, source: str, flags: list[str], nvcc_version: str) -> str:
    text = json.dumps([name, source, flags, nvcc_version], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def compile_entry(name: str, source: str, flags: list[str], nvcc: str, nvcc_version: str,
                  cache_dir: str) -> CompiledEntry:
    """`flags` in portable form; returns the cubin, from the cache when it holds this digest."""
    store = os.path.join(cache_dir, "deepgemm")
    os.makedirs(store, exist_ok=True)
    cached = os.path.join(store, cache_digest(name, source, flags, nvcc_version) + ".cubin")
    if os.path.exists(cached):
        with open(cached, "rb") as f:
            return CompiledEntry(name, f.read(), 0.0, True)
    work = tempfile.mkdtemp(prefix=f"{name}.", dir=store)
    try:
        src, out = os.path.join(work, "kernel.cu"), os.path.join(work, "kernel.cubin")
        with open(src, "w") as f:
            f.write(source)
        cmd = [nvcc, src, "--cubin", "--output-file", out, *local_flags(flags, deep_gemm_dir())]
        start = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
        seconds = time.monotonic() - start
        if proc.returncode != 0 or not os.path.exists(out) or os.path.getsize(out) == 0:
            raise BuildError(f"nvcc failed for DeepGEMM entry {name}: {proc.stderr.strip()[-1500:]}",
                             fix="check the nvcc version (DeepGEMM 2.8.1 wants CUDA 12.8+) and DeepGEMM's include/")
        with open(out, "rb") as f:
            cubin = f.read()
        os.replace(out, cached)  # same filesystem: atomic; a concurrent writer of the same digest writes the same bytes
        return CompiledEntry(name, cubin, seconds, False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
