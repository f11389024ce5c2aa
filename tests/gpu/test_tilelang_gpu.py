"""GPU: the TileLang check (check_tilelang.py) on the bundle in NOJIT_TEST_BUNDLE, for a few sizes.

    NOJIT_TEST_BUNDLE=out/tl.nojit [NOJIT_TEST_VLLM_SRC=.device/vllm_src] pytest -m gpu tests/gpu/test_tilelang_gpu.py

The check runs in a fresh process (it installs nojit, blocks TileLang and mounts the carried vLLM copy,
none of which may leak into this one). Skipped without a bundle, without TileLang entries in it, or
without an sm_90 GPU (conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SIZES = "1,7,64,513"

pytestmark = pytest.mark.gpu


def _vllm_src(tmp_path_factory) -> str:
    """The carried vLLM files: NOJIT_TEST_VLLM_SRC, .device/vllm_src, or a copy of the installed vLLM's."""
    for path in (os.environ.get("NOJIT_TEST_VLLM_SRC"), os.path.join(ROOT, ".device", "vllm_src")):
        if path and os.path.isdir(os.path.join(path, "vllm")):
            return path
    try:
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import prepare_device

        out = str(tmp_path_factory.mktemp("vllm_src"))
        prepare_device.copy_vllm_tilelang_sources(out)
        return out
    except ImportError:
        pytest.skip("no carried vLLM copy (tools/prepare_device.py) and no vLLM installed to copy from")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    bundle = os.environ.get("NOJIT_TEST_BUNDLE")
    if not bundle:
        pytest.skip("set NOJIT_TEST_BUNDLE to a bundle with TileLang kernels")
    from nojit.loader.bundle.file import Bundle

    if not any(k.runtime == "tilelang" for k in Bundle.open(bundle).manifest.kernels.values()):
        pytest.skip(f"{bundle} has no TileLang kernels")
    out = tmp_path_factory.mktemp("tlgpu") / "report.json"
    p = subprocess.run([sys.executable, os.path.join(HERE, "checks", "check_tilelang.py"), "--bundle", bundle, "--vllm-src",
                        _vllm_src(tmp_path_factory), "--sizes", SIZES, "--json", str(out)],
                       capture_output=True, text=True, timeout=1800)
    assert out.exists(), f"check_tilelang.py exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p, json.loads(out.read_text())


def test_every_variant_matches_its_float64_reference(report):
    p, r = report
    failures = [f"{e['kernel']} {e['variant']} N={c['num_tokens']}: {c['errors']}"
                for e in r["entries"] for c in e["cases"] if not c["ok"]]
    failures += [f"{e['kernel']} {e['variant']}: {e['errors']}" for e in r["entries"] if e["errors"]]
    assert not failures, "\n".join(failures[:20])
    assert all(e["ok"] for e in r["entries"]) and r["entries"]


def test_outputs_fully_written_inside_their_buffers(report):
    _, r = report
    outs = [o for e in r["entries"] for c in e["cases"] for o in c.get("outputs", {}).values()]
    assert outs and all(o["unwritten"] == 0 and o["guards"] for o in outs)


def test_served_without_compiles_processes_or_tilelang(report):
    p, r = report
    assert r["enable_pdl"] is True
    assert r["serving_processes"] == [] and r["compile_attempts"] == [] and r["tilelang_loaded"] == []
    assert r["modules_loaded"] >= len(r["entries"])
    assert p.returncode == 0 and "RESULT: PASS" in p.stdout
