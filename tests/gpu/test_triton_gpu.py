"""GPU: bundled Triton keys, loader vs Triton JIT, bit for bit (check_triton.py) on NOJIT_TEST_TRITON_BUNDLE.

    NOJIT_TEST_TRITON_BUNDLE=B.nojit [NOJIT_TEST_KERNEL_SOURCES=.device/kernels/map.json] pytest -m gpu tests/gpu

Each check runs in fresh processes (loader: strict mode, empty Triton cache, process audit). Skipped
without a bundle or without an sm_90 GPU (conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def bundle():
    path = os.environ.get("NOJIT_TEST_TRITON_BUNDLE")
    if not path:
        pytest.skip("set NOJIT_TEST_TRITON_BUNDLE to a bundle with Triton entries")
    return path


@pytest.mark.parametrize("variant", ["exact", "generic"])
@pytest.mark.parametrize("kernel", ["ComputePrefillMetadataKernel", "CombineTopkSwaIndicesKernel"])
def test_bundled_keys_match_the_jit_bit_for_bit(bundle, kernel, variant):
    sources = os.environ.get("NOJIT_TEST_KERNEL_SOURCES", os.path.join(ROOT, ".device", "kernels", "map.json"))
    cmd = [sys.executable, os.path.join(HERE, "checks", "check_triton.py"), "--bundle", bundle, "--kernels", kernel,
           "--variant", variant, "--parallel", "1"]
    if os.path.exists(sources):
        cmd += ["--sources", sources]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert "RESULT: PASS" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
