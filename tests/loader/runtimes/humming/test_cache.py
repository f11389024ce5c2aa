"""Humming's kernel cache key is bound to the machine (header mtimes, install paths, NVRTC version); nojit's
seed (loader/runtimes/humming/cache.py) lets Humming compute the serving machine's key itself, so a bundled cubin is
found by Humming's own lookup with no compile and no process. Humming's NVRTC path compiles on this GPU-less
box (NVRTC from the nvidia-cuda-nvrtc wheel; its builtins library found through LD_LIBRARY_PATH)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have

pytestmark = pytest.mark.skipif(not have("humming"), reason="needs humming-kernels")


def _nvrtc_lib_dir() -> str | None:
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations if spec else []):
        for sub in ("cu13/lib", "cuda_nvrtc/lib"):
            d = os.path.join(base, sub)
            if os.path.isdir(d) and any(n.startswith("libnvrtc-builtins") for n in os.listdir(d)):
                return d
    return None


def test_seeded_cubin_is_found_under_the_serving_key(tmp_path):
    lib = _nvrtc_lib_dir()
    if lib is None:
        pytest.skip("the nvidia-cuda-nvrtc wheel is not installed")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{lib}:{os.environ.get('LD_LIBRARY_PATH', '')}", "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "probes", "probe_humming_cache.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["cubin_is_elf"] and out["cubin_bytes"] > 0  # Humming's own NVRTC child compiled it here
    assert out["build_key"] != out["serving_key"]  # a cache copied from the build box would miss
    assert out["hit_path_is_seeded"] and out["hit_sha256_is_bundled"] and out["seeded_read_only"]
    assert out["processes_while_serving"] == []
    assert out["miss"] == "Humming tried to compile (cache miss)"  # the check can fail: a miss reaches _compile
    assert out["nvrtc"].startswith("nvrtc+") and len(out["headers_digest"]) == 64
