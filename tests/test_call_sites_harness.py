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


SPARSE_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def _read(ptr, i):
    return tl.load(ptr + i)


@triton.jit
def sparse_store(out_ptr, acc_ptr, src_ptr):
    i = tl.program_id(0)
    row = out_ptr + 2 * i
    tl.store(row, tl.load(src_ptr + i))  # store-only, every other element of a live buffer
    v = _read(acc_ptr, i)  # read in a helper...
    tl.store(acc_ptr + i, v + 1.0)  # ...and updated in place
'''

TRACE = '''
import importlib.util, json, sys
import torch
sys.path.insert(0, %r)
import check_call_sites as c
spec = importlib.util.spec_from_file_location("sparse_mod", %r)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
tracer = c.LaunchTracer("jit", "cpu")
c._trace_every_kernel(tracer, [m], True)
out, acc, src = torch.full((8,), 3.0), torch.zeros(4), torch.arange(4.0)
m.sparse_store[(4,)](out, acc, src)
row = tracer.launches[0]
print(json.dumps({"io": [sorted(x) for x in tracer._io(m.sparse_store)], "written": row["written"],
                  "in_place": row["in_place"], "out": out.tolist(), "acc": acc.tolist()}))
'''


def test_tracer_counts_sparse_and_in_place_writes_and_keeps_live_data(tmp_path) -> None:
    """A store-only output is poisoned, counted, and its unwritten elements get their data back (bad words into the
    logits); a buffer read in a helper is never poisoned and its in-place update is counted against its pre-state."""
    kernel = tmp_path / "sparse_mod.py"
    kernel.write_text(SPARSE_KERNEL)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", TRACE % (os.path.join(HERE, "gpu"), str(kernel))], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["io"] == [["out_ptr"], ["acc_ptr"]]
    assert got["written"] == {"out_ptr": 4, "acc_ptr": 4, "src_ptr": 0}
    assert got["in_place"] == ["acc_ptr"]
    assert got["out"] == [0.0, 3.0, 1.0, 3.0, 2.0, 3.0, 3.0, 3.0]
    assert got["acc"] == [1.0, 1.0, 1.0, 1.0]
