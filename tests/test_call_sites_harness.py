"""CPU checks of the call-site GPU check's parts: the vLLM mount and `nojit coverage --observed`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import run_cli

from nojit.aot.observed_coverage import ObservedRow, read_observed, render
from nojit.aot.plan import Plan

HERE = os.path.dirname(os.path.abspath(__file__))


def test_mount_imports_vllm_call_site_from_files_with_stubbed_platform() -> None:
    vllm = pytest.importorskip("vllm")
    site = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from vllm_mount import mount\n"
        "f = mount(%r)\n"
        "import vllm.v1.worker.gpu.sample.min_p as m, vllm.platforms as p\n"
        "k = m._min_p_kernel\n"
        "print(k.fn.__module__ + ':' + k.fn.__qualname__, type(p.current_platform).__name__,"
        " 'v1/worker/gpu/sample/min_p.py' in f.loaded, 'vllm/__init__' in ' '.join(f.loaded))\n"
    ) % (os.path.join(HERE, "gpu"), site)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-4:] == ["vllm.v1.worker.gpu.sample.min_p:_min_p_kernel", "CudaLikePlatform", "True",
                                       "False"]


def test_observed_keys_read_and_rendered(tmp_path) -> None:
    path = tmp_path / "observed.jsonl"
    key = {"spec": [["*fp32", "D"]], "options": [["num_warps", ["int", 4]]]}
    lines = [{"kernel": "m:k", "runtime": "triton", "key": key, "outcome": "exact"},
             {"kernel": "m:k", "runtime": "triton", "key": key, "outcome": "exact"},
             {"kernel": "m:gone", "runtime": "triton", "key": None, "outcome": "miss"}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    observed = read_observed(str(path))
    assert {k: len(v) for k, v in observed.items()} == {"m:k": 1}
    text = render([ObservedRow("m:k", observed=1, planned=0, exact=0, missing=["K"], unplanned=["K"])])
    assert "reached, not planned (an enumerator defect)" in text and "reached, not served by the bundle" in text


def test_observed_file_that_is_not_jsonl_says_so(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not JSON"):
        read_observed(str(path))


def test_coverage_observed_lists_planned_and_unplanned_keys(small_build, tmp_path) -> None:
    """`nojit coverage --observed` against a typed plan: a planned key is counted, an unplanned one fails the run."""
    plan = Plan.read(small_build["plan"])
    planned = next(r for r in plan.requests if r.variant == "exact")
    unplanned = json.loads(json.dumps(planned.key))
    unplanned["spec"][0] = ["*fp64", "D"]
    path = tmp_path / "observed.jsonl"
    path.write_text("".join(json.dumps({"kernel": planned.kernel, "runtime": "triton", "key": k, "outcome": "exact"})
                            + "\n" for k in (planned.key, unplanned)))
    out = run_cli("coverage", small_build["bundle"], "--plan", small_build["plan"], "--observed", str(path),
                  check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    observed_table = out.stdout.split("observed keys (reached on real steps)")[1]
    row = next(line for line in observed_table.splitlines() if line.startswith(planned.kernel))
    assert row.split()[1:4] == ["2", "1", "1"], row  # observed, planned, reached & exact
    assert "reached, not planned (an enumerator defect)" in out.stdout
