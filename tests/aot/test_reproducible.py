"""Cubins that do not depend on the install path (aot/reproducible.py).

The same kernel source at two paths, as vLLM is in two virtual environments: Triton writes
the path into the cubin's line table, so the cubins differ; with canonical source names (what
build workers and the GPU check's JIT reference use) they are the same bytes. Each compile
runs in its own process with its own Triton cache (Triton's cache key ignores the path).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from nojit.aot.reproducible import canonical_source_name

pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

COMPILE = r"""
import importlib.util, sys
path, canonical, out = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
from nojit.aot.runtimes.triton.compiler import compile_key, install_offline_driver
install_offline_driver()
if canonical:
    from nojit.aot.reproducible import canonical_source_paths
    canonical_source_paths()
spec = importlib.util.spec_from_file_location("triton_test_kernels", path)
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
key = ((("*fp32", "D"), ("*fp32", "D"), ("i32", "D"), ("i32", "D"), ("constexpr", ("int", 1024))), ())
open(out, "wb").write(compile_key(module.row_logsumexp, key).cubin)
"""


def test_canonical_source_name_is_the_path_below_site_packages():
    assert canonical_source_name("/a/.venv/lib/python3.11/site-packages/vllm/x/y.py") == "vllm/x/y.py"
    assert canonical_source_name("/usr/lib/python3/dist-packages/triton/language/standard.py") == \
        "triton/language/standard.py"
    assert canonical_source_name("/tmp/.device/kernels/k.py") == "k.py"


def _cubin(tmp_path, source: str, canonical: bool) -> bytes:
    tag = f"{abs(hash(source))}-{int(canonical)}"
    out = tmp_path / f"{tag}.cubin"
    env = {**os.environ, "TRITON_CACHE_DIR": str(tmp_path / f"cache-{tag}")}
    subprocess.run([sys.executable, "-c", COMPILE, source, "1" if canonical else "0", str(out)], env=env, check=True,
                   capture_output=True, timeout=600)
    return out.read_bytes()


def test_same_source_at_two_install_paths_gives_the_same_cubin(tmp_path):
    sources = []
    for venv in ("venv-a/lib/python3.11/site-packages", "elsewhere/venv-b/lib/python3.12/site-packages"):
        target = tmp_path / venv / "nojit_repro" / "triton_test_kernels.py"
        target.parent.mkdir(parents=True)
        shutil.copyfile(os.path.join(ROOT, "tests", "support", "triton_test_kernels.py"), target)
        sources.append(str(target))
    raw = [_cubin(tmp_path, s, canonical=False) for s in sources]
    assert raw[0] != raw[1]  # the install path is in the line table
    assert sources[0].encode()[: -len("/triton_test_kernels.py")] in raw[0]
    canonical = [_cubin(tmp_path, s, canonical=True) for s in sources]
    assert canonical[0] == canonical[1]
    assert b"site-packages" not in canonical[0] and b"nojit_repro" in canonical[0]  # still names the source
    assert _sass(tmp_path, raw[0]) == _sass(tmp_path, canonical[0])  # the machine code is untouched


def _sass(tmp_path, cubin: bytes) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    if not os.path.exists(tool):
        pytest.skip("Triton ships no cuobjdump here")
    path = tmp_path / "sass.cubin"
    path.write_bytes(cubin)
    sass = subprocess.run([tool, "-sass", str(path)], capture_output=True, text=True, check=True).stdout
    assert "Function" in sass
    return sass
