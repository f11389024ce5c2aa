"""CPU half of the Qwen3.5 call-site GPU check (tests/gpu/checks/qwen_call_site_steps.py, issue 24 must-show 2):
the deployment's facts, the branches vLLM's own GDN code takes for each step, every key the steps reach against the
built-in deployment's plan (and the failure when one is not planned), the table's verdicts, the MoE alignment stand-in,
and the prepare tool's shims."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.common import GPU_CHECKS, have

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QWEN = "builtin:qwen3.5-35b-a3b-fp8-h200.toml"
needs_vllm = pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")

TINY = {"deployment": "tiny", "device_name": "NVIDIA H200", "dtype": "bfloat16", "tp": 1,
        "max_num_batched_tokens": 8192, "max_num_seqs": 1024, "spec_tokens": 1,
        "gdn": {"h": 2, "hv": 4, "k": 16, "v": 16, "width": 4, "conv_dtype": "bfloat16", "state_dtype": "float32",
                "conv_state_len": 4, "page_bytes": 8192, "eps": 1e-6, "hidden_act": "silu", "norm_activation": "silu"},
        "attention": {"heads": 2, "kv_heads": 1, "head_dim": 32, "rotary": 8, "mrope_section": [2, 1, 1],
                      "max_position": 4096, "eps": 1e-6},
        "moe": {"experts": 8, "top_k": 2, "hidden": 256, "n": 128, "block": [128, 128], "config_file": "none.json"}}


def _site() -> str:
    import vllm

    return os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))


@needs_vllm
def test_facts_are_the_builtin_deployments() -> None:
    """The shapes the steps use come from the model room's own functions (GDN heads and padded page, M-RoPE,
    block-FP8 experts and the tile-config file vLLM's lookup reads on the H200)."""
    code = (f"import json, sys; sys.path.insert(0, {GPU_CHECKS!r}); import qwen_call_site_steps as q; "
            f"print(json.dumps(q.deployment_facts({QWEN!r})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    f = json.loads(p.stdout.strip().splitlines()[-1])
    g = f["gdn"]
    assert (g["h"], g["hv"], g["k"], g["v"], g["width"], g["conv_state_len"]) == (16, 32, 128, 128, 4, 4)
    assert (g["conv_dtype"], g["state_dtype"], g["page_bytes"]) == ("bfloat16", "float32", 1088 * 2048)
    assert f["attention"] | {"eps": 0} == {"heads": 16, "kv_heads": 2, "head_dim": 256, "rotary": 64,
                                           "mrope_section": [11, 11, 10], "max_position": 262144, "eps": 0}
    assert f["moe"] == {"experts": 256, "top_k": 8, "hidden": 2048, "n": 512, "block": [128, 128],
                        "config_file": "E=256,N=512,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"}
    assert (f["spec_tokens"], f["device_name"], f["max_num_batched_tokens"]) == (1, "NVIDIA H200", 8192)


BRANCHES = '''
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from vllm_mount import mount
mount(sys.argv[2])
import qwen_call_site_steps as q
q.DRY = True
q.import_call_sites()
assert not q.IMPORT_ERRORS, q.IMPORT_ERRORS
from nojit.aot.runtimes.triton.compiler import offline_driver
from nojit.aot.runtimes.triton.enumeration import recording_jit_calls
out = {}
with offline_driver(), torch.inference_mode():
    for name, step in q.STEPS.items():
        q.ERRORS.clear()
        with recording_jit_calls() as calls:
            step("cpu", 1)
        out[name] = {"kernels": sorted({fn.fn.__qualname__ for fn, _, _ in calls}), "errors": list(q.ERRORS)}
print(json.dumps(out))
'''


@needs_vllm
def test_each_step_takes_vllms_own_branch(tmp_path) -> None:
    """vLLM's GDN code, not the check, picks the path from the metadata: prefill-only (conv fwd, post-conv prep,
    gated norm), MTP decode (conv update, then vLLM's CUDA core: no Triton recurrence, no norm), decode without
    drafts (the packed recurrent decode), prefills mixed with spec decodes (conv update + conv fwd, sigmoid gating)
    or with plain decodes (the split sigmoid-gating update); every step also reaches QK-norm/RoPE and fused_moe."""
    facts = tmp_path / "facts.json"
    facts.write_text(json.dumps(TINY))
    p = subprocess.run([sys.executable, "-c", BRANCHES, GPU_CHECKS, _site()], capture_output=True, text=True,
                       timeout=600, env={**os.environ, "NOJIT_QWEN_FACTS": str(facts)})
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    common = {"_fused_qk_rmsnorm_rope_gate_kernel", "fused_moe_kernel"}
    want = {
        "prefill": {"_causal_conv1d_fwd_kernel", "_fused_post_conv_kernel", "layer_norm_fwd_kernel"},
        "decode": {"_causal_conv1d_update_kernel"},
        "decode_no_draft": {"_causal_conv1d_update_kernel", "fused_recurrent_gated_delta_rule_packed_decode_kernel",
                            "layer_norm_fwd_kernel"},
        "mixed": {"batch_memcpy_kernel", "_causal_conv1d_update_kernel", "_causal_conv1d_fwd_kernel",
                  "_fused_post_conv_kernel", "fused_sigmoid_gating_delta_rule_update_kernel", "layer_norm_fwd_kernel"},
        "mixed_no_draft": {"_causal_conv1d_fwd_kernel", "_fused_post_conv_kernel",
                           "fused_sigmoid_gating_delta_rule_update_kernel", "layer_norm_fwd_kernel"},
    }
    assert {n: set(s["kernels"]) for n, s in got.items()} == {n: k | common for n, k in want.items()}
    assert all(not s["errors"] for s in got.values()), got


@pytest.fixture(scope="module")
def qwen_payload(tmp_path_factory):
    """The built-in deployment's plan (`nojit build --plan-only`) and facts, as tools/prepare_qwen_device.py makes
    them (without the copy and the wheels)."""
    if not have("vllm"):
        pytest.skip("vLLM is not installed")
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import prepare_qwen_device as tool

    d = tmp_path_factory.mktemp("qwen")
    tool.plan(QWEN, str(d / "plan.json"))
    (d / "facts.json").write_text(json.dumps(tool.facts(QWEN)))
    return d


def _dry(d, plan: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, os.path.join(GPU_CHECKS, "check_call_sites.py"), "--dry-keys",
                           "--steps-module", "qwen_call_site_steps", "--vllm-src", _site(), "--plan", plan],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "NOJIT_QWEN_FACTS": str(d / "facts.json")})


def test_every_key_the_steps_reach_is_planned_and_an_unplanned_one_fails(qwen_payload) -> None:
    """The box's pre-check of the GPU run: each key the steps reach (keyed as Triton's JIT keys it) is in the
    deployment's plan; with one of them taken out of the plan the same run fails and names it."""
    d = qwen_payload
    p = _dry(d, str(d / "plan.json"))
    assert p.returncode == 0 and "DRY KEYS: PASS (9 kernels" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    plan = json.loads((d / "plan.json").read_text())
    reached = [line for line in p.stdout.splitlines() if "batch_memcpy_kernel" in line]
    assert reached and "1/1 keys planned" in reached[0], p.stdout
    memcpy = "vllm.v1.worker.mamba_utils:batch_memcpy_kernel"
    plan["requests"] = [r for r in plan["requests"] if r["kernel"] != memcpy]  # reached, no longer planned
    (d / "holed.json").write_text(json.dumps(plan))
    p = _dry(d, str(d / "holed.json"))
    assert p.returncode == 1 and "DRY KEYS: FAIL" in p.stdout, p.stdout[-3000:]
    assert "batch_memcpy_kernel" in p.stdout and "0/1 keys planned" in p.stdout and "reached, not planned" in p.stdout


def _launch(step: str, kernel: str, key: dict, written: int = 4, outcome: str = "exact") -> dict:
    return {"step": step, "kernel": kernel, "key": key, "outcome": outcome, "written": {"out": written},
            "in_place": [], "hashes": {"out": "h"}, "pre": {}}


def test_table_fails_a_kernel_reached_but_not_planned_or_writing_nothing() -> None:
    """compare() is the GPU check's verdict: identical launches of planned keys pass; the same launches of a key the
    plan lacks fail that kernel (and the run), as do a launch that wrote nothing and one the bundle missed."""
    sys.path.insert(0, GPU_CHECKS)
    import check_call_sites as c
    from nojit.loader.bundle.canonical import canonical_json

    k = {"spec": [["*bf16", "D"]], "options": [["num_warps", ["int", 4]]]}
    kid = "vllm.x:kern"
    jit = {"launches": [_launch("prefill", kid, k)]}
    planned = {kid: {canonical_json(k).decode()}}
    rows, ok = c.compare(jit, {"launches": [_launch("prefill", kid, k)]}, planned)
    assert ok and rows[0]["ok"] and rows[0]["planned"] == 1 and rows[0]["exact"] == 1
    rows, ok = c.compare(jit, {"launches": [_launch("prefill", kid, k)]}, {})  # reached, planned nowhere
    assert not ok and not rows[0]["ok"] and rows[0]["planned"] == 0
    nothing = {"launches": [_launch("prefill", kid, k, written=0)]}
    rows, ok = c.compare(nothing, {"launches": [_launch("prefill", kid, k, written=0)]}, planned)
    assert not ok and rows[0]["written"] == 0  # a key whose launches wrote nothing proves nothing
    rows, ok = c.compare(jit, {"launches": [_launch("prefill", kid, k, outcome="miss")]}, planned)
    assert not ok and rows[0]["missing"] == 1


def test_alignment_stand_in_is_vllms_documented_layout() -> None:
    """moe_align_block_size's docstring example (experts 1-4, block 4): each expert's rows padded with the sentinel."""
    sys.path.insert(0, GPU_CHECKS)
    import torch

    from qwen_call_site_steps import _AlignStandIn

    topk = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    sorted_ids, expert_ids = torch.empty(31, dtype=torch.int32), torch.empty(8, dtype=torch.int32)
    post = torch.empty(1, dtype=torch.int32)
    _AlignStandIn.moe_align_block_size(topk, 5, 4, sorted_ids, expert_ids, post)
    assert int(post) == 16
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]
    assert expert_ids[:4].tolist() == [1, 2, 3, 4] and set(sorted_ids[16:].tolist()) == {12}


def test_prepare_tool_shims_reexport_vllms_module_and_restrict_the_plan(tmp_path) -> None:
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import prepare_qwen_device as tool

    full = {"kernels": {"vllm.a.b:_k": {"runtime": "triton"}, "vllm.c:K.kernel": {"runtime": "triton"},
                        "vllm.gone:g": {"runtime": "triton"}},
            "requests": [{"kernel": "vllm.a.b:_k"}, {"kernel": "vllm.gone:g"}, {"kernel": "vllm.c:K.kernel"}]}
    tool.write_shims(full, ["vllm.a.b:_k", "vllm.c:K.kernel"], str(tmp_path / "kernels"), str(tmp_path / "p.json"))
    mapping = json.loads((tmp_path / "kernels" / "map.json").read_text())
    assert mapping == {"vllm.a.b:_k": {"file": "vllm_a_b.py", "qualname": "_k"},
                       "vllm.c:K.kernel": {"file": "vllm_c.py", "qualname": "K.kernel"}}
    shim = (tmp_path / "kernels" / "vllm_a_b.py").read_text()
    compile(shim, "shim", "exec")
    assert "mount_qwen" in shim and "import_module('vllm.a.b')" in shim and 'not k.startswith("__")' in shim
    plan = json.loads((tmp_path / "p.json").read_text())
    assert sorted(plan["kernels"]) == ["vllm.a.b:_k", "vllm.c:K.kernel"]
    assert [r["kernel"] for r in plan["requests"]] == ["vllm.a.b:_k", "vllm.c:K.kernel"]


ALIASED_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def add_one(x_ptr, y_ptr):
    i = tl.program_id(0)
    tl.store(y_ptr + i, tl.load(x_ptr + i) + 1.0)
'''

ALIASED = '''
import importlib.util, json, sys
import torch
sys.path.insert(0, %r)
import check_call_sites as c
spec = importlib.util.spec_from_file_location("aliased_mod", %r)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
tracer = c.LaunchTracer("jit", "cpu")
c._trace_every_kernel(tracer, [m], True)
x, y = torch.arange(4.0), torch.zeros(4)
m.add_one[(4,)](x, y)  # y store-only: poisoned, then fully written
m.add_one[(4,)](x, x)  # y is x (vLLM's gated RMSNorm: out=x): not poisoned, counted against the pre-state
print(json.dumps({"rows": [(r["written"], r["in_place"]) for r in tracer.launches], "x": x.tolist(), "y": y.tolist()}))
'''


def test_an_output_that_is_also_the_input_is_not_poisoned(tmp_path) -> None:
    """The GDN layer's gated RMSNorm writes its output over its input (layer_norm_fwd(x, out=x)): the tracer must
    not poison it (the kernel would normalize the poison, identically in both runs, and prove nothing)."""
    kernel = tmp_path / "aliased_mod.py"
    kernel.write_text(ALIASED_KERNEL)
    p = subprocess.run([sys.executable, "-c", ALIASED % (GPU_CHECKS, str(kernel))], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["y"] == [1.0, 2.0, 3.0, 4.0] and got["x"] == [1.0, 2.0, 3.0, 4.0]  # x + 1, not poison + 1
    assert got["rows"][0] == [{"y_ptr": 4, "x_ptr": 0}, []]
    assert got["rows"][1] == [{"x_ptr": 4, "y_ptr": 4}, ["x_ptr", "y_ptr"]]
