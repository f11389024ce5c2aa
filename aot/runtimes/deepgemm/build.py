"""A DeepGEMM section outside a bundle build, for device checks and CPU tests (tools/prepare_deepgemm_device.py).

`build_deepgemm_section(deployment, work)` enumerates with DeepGEMM's own code for the given M
and compiles the chosen entries through the same compile cache as `nojit build` (compile.py). It
returns (section, cubins, stats): the section loader/runtimes/deepgemm/cache.py documents and the cubins by
sha256. `only` limits which entries are compiled; every key is still enumerated and listed, and
the keys whose entry was not compiled are returned in `section["not_compiled"]`. `shapes` is the model's
rows (enumerate_keys), DeepSeek-V4's by default.
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from nojit.aot.compile_cache import DEFAULT_CACHE_DIR
from nojit.aot.deployment import Deployment
from nojit.aot.runtimes.deepgemm.compile import compile_entry, deep_gemm_dir, portable_flags
from nojit.aot.runtimes.deepgemm.enumerate import enumerate_keys
from nojit.aot.runtimes.deepgemm.shapes import GemmShape
from nojit.loader.runtimes.deepgemm.cache import compress_keys



def build_deepgemm_section(d: Deployment, work: str, jobs: int = 1, only: set[str] | None = None,
                           ms: list[int] | None = None, extra_keys: list[dict] | None = None,
                           cache_dir: str = DEFAULT_CACHE_DIR, shapes: dict[str, list[GemmShape]] | None = None,
                           ) -> tuple[dict[str, Any], dict[str, bytes], dict[str, float]]:
    import vllm.envs as envs
    import vllm.third_party.deep_gemm as dg

    start = time.monotonic()
    en = enumerate_keys(d, work, ms=ms, extra_keys=extra_keys, shapes=shapes)
    enumerated = time.monotonic()
    names = sorted(en.entries())
    chosen = [n for n in names if only is None or n in only]
    package = deep_gemm_dir()

    def one(name: str):
        source, flags = en.entry_inputs(name)
        return source, compile_entry(name, source, portable_flags(flags, package), en.nvcc, en.nvcc_version, cache_dir)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        compiled = list(pool.map(one, chosen))
    cubins = {hashlib.sha256(c.cubin).hexdigest(): c.cubin for _, c in compiled}
    section = {
        "deep_gemm_version": dg.__version__,
        "nvcc": en.nvcc,
        "nvcc_version": en.nvcc_version,
        "sm_count": d.platform.sm_count,
        "pdl": d.platform.pdl,
        "use_ue8m0": bool(envs.VLLM_USE_DEEP_GEMM_E8M0),  # as the enumeration worker passed it
        "entries": {c.name: {"cubin": hashlib.sha256(c.cubin).hexdigest(), "source": source} for source, c in compiled},
        "keys": compress_keys(en.keys),
        "not_compiled": sorted(set(names) - set(chosen)),
    }
    fresh = [c for _, c in compiled if not c.cached]
    stats = {"enumerate_s": round(enumerated - start, 1), "compile_s": round(time.monotonic() - enumerated, 1),
             "compiled": len(fresh), "from_cache": len(compiled) - len(fresh),
             "nvcc_s_per_entry": round(sum(c.seconds for c in fresh) / max(1, len(fresh)), 1)}
    return section, cubins, stats
