"""tests/gpu/checks/check_autotune.py's Qwen case set (NOJIT_AUTOTUNE_CASES=qwen) on the CPU box: its plan role
enumerates, through Triton's own Autotuner, exactly the 6 autotuned kernels of FLA's chunk path the Qwen rows plan
(one tuning key each), from a mounted vLLM copy as on the device; and the check skips cleanly without a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.aot.models.qwen3_5.test_fla_prefill import REACHED
from tests.support.common import ROOT, have

CHECK = os.path.join(ROOT, "tests", "gpu", "checks", "check_autotune.py")
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NOJIT_AUTOTUNE_CASES": "qwen"}


@pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")
def test_the_qwen_cases_reach_the_six_autotuned_kernels(tmp_path):
    import vllm

    site = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))  # the installed copy, mounted as on the GPU
    out = tmp_path / "role.json"
    p = subprocess.run([sys.executable, CHECK, "--role", "plan", "--vllm-src", site, "--json-out", str(out),
                        "--out", str(tmp_path / "plan.json"), "--device", "cpu"],
                       capture_output=True, text=True, timeout=600, env=ENV)
    assert p.returncode == 0, p.stderr[-3000:]
    role = json.loads(out.read_text())
    assert role["kernels"] == {k: 1 for k in REACHED}, role["kernels"]


def test_the_check_skips_without_a_gpu(tmp_path):
    p = subprocess.run([sys.executable, CHECK, "--vllm-src", str(tmp_path), "--work", str(tmp_path / "w")],
                       capture_output=True, text=True, timeout=300, env=ENV)
    assert p.returncode == 0 and "SKIP" in p.stdout, p.stdout + p.stderr[-2000:]
