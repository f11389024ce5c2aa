"""tests/gpu/checks/check_gdn_prefill.py's CPU half: its float64 reference against transformers' own gated delta rule,
the device folder tools/prepare_gdn_device.py makes, every bundled object linked and loaded here, and a clean skip
of the launch phase without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have, run_cli

CHECK = os.path.join(ROOT, "tests", "gpu", "checks", "check_gdn_prefill.py")
QWEN = os.path.join(ROOT, "aot", "data", "qwen3.5-35b-a3b-fp8-h200.toml")
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, CHECK, *args], capture_output=True, text=True, timeout=600, env=ENV)


@pytest.mark.skipif(not have("transformers"), reason="needs transformers")
def test_reference_matches_transformers_recurrence():
    p = _run("--reference-self-test")
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    errs = json.loads(p.stdout.strip().splitlines()[-1])["reference_vs_transformers"]
    assert errs["o"] < 1e-4 and errs["state"] < 1e-4


@pytest.mark.skipif(not (have("vllm") and have("cutlass") and have("flashinfer") and have("tvm_ffi")
                         and shutil.which("g++")), reason="needs vLLM, FlashInfer, nvidia-cutlass-dsl, tvm_ffi and g++")
def test_device_folder_links_here_and_the_launch_skips_without_gpu(tmp_path):
    bundle = str(tmp_path / "gdn.nojit")
    run_cli("build", "--deployment", QWEN, "--runtime", "flashinfer_cute", "--kernels", "_FullyFusedDeltaRuleSm90",
            "-o", bundle, "--cache-dir", str(tmp_path / "cache"), "-j", "2", "--quiet")
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from prepare_gdn_device import prepare

    out = tmp_path / "dev"
    m = prepare(bundle, str(out), wheel=False)
    assert len(m["bundle"]["entries"]) == 2 and (out / "gdn.nojit").read_bytes() == open(bundle, "rb").read()
    p = _run("--dir", str(out), "--link-only")
    assert p.returncode == 0 and "linked and loaded 2 flashinfer_cute objects (2 _FullyFusedDeltaRuleSm90)" in p.stdout, \
        p.stdout + p.stderr[-2000:]
    p = _run("--dir", str(out))  # no GPU here: the launch phase is skipped, not failed and not passed
    assert p.returncode == 3 and "SKIP: no CUDA device" in p.stdout and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert _run("--dir", str(out), "--skip-ok").returncode == 0
    (out / "gdn.nojit").write_bytes(b"x" + (out / "gdn.nojit").read_bytes()[1:])  # a damaged carried bundle
    p = _run("--dir", str(out), "--link-only")
    assert p.returncode != 0 and "sha256 differs" in p.stdout + p.stderr
