"""The build side's one entry point for DeepGEMM: enumerate, compile, and return the bundle section.

`build_deepgemm_section(deployment, work)` returns (section, cubins, stats): the manifest section that
loader/deepgemm_cache.py documents and the cubins by sha256 for the bundle's blob store. `only`
limits which entries are compiled (tests, a shared box): every key is still enumerated and listed,
and the keys whose entry was not compiled are returned in `section["not_compiled"]` so coverage
can show them as missing.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import vllm.envs as envs
import vllm.third_party.deep_gemm as dg

from nojit.aot.deployment import Deployment
from nojit.aot.runtimes.deepgemm.compile import compile_entries
from nojit.aot.runtimes.deepgemm.enumerate import enumerate_keys
from nojit.loader.deepgemm_cache import compress_keys


def build_deepgemm_section(d: Deployment, work: str, jobs: int = 1, only: set[str] | None = None,
                           ms: list[int] | None = None, extra_keys: list[dict] | None = None
                           ) -> tuple[dict[str, Any], dict[str, bytes], dict[str, float]]:
    start = time.monotonic()
    en = enumerate_keys(d, work, ms=ms, extra_keys=extra_keys)
    enumerated = time.monotonic()
    names = sorted(en.entries())
    chosen = [n for n in names if only is None or n in only]
    compiled = compile_entries(en.cache_dir, chosen, en.nvcc, work + "/cubins", jobs=jobs)
    cubins = {hashlib.sha256(c.cubin).hexdigest(): c.cubin for c in compiled}
    section = {
        "deep_gemm_version": dg.__version__,
        "nvcc": en.nvcc,
        "nvcc_version": en.nvcc_version,
        "sm_count": d.platform.sm_count,
        "pdl": d.platform.pdl,
        "use_ue8m0": bool(envs.VLLM_USE_DEEP_GEMM_E8M0),  # as the enumeration worker passed it
        "entries": {c.name: {"cubin": hashlib.sha256(c.cubin).hexdigest(), "source": c.source} for c in compiled},
        "keys": compress_keys(en.keys),
        "not_compiled": sorted(set(names) - set(chosen)),
    }
    stats = {"enumerate_s": round(enumerated - start, 1), "compile_s": round(time.monotonic() - enumerated, 1),
             "nvcc_s_per_entry": round(sum(c.seconds for c in compiled) / max(1, len(compiled)), 1)}
    return section, cubins, stats
