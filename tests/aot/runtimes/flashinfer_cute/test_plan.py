"""FlashInfer's CuTeDSL GDN prefill keys for the built-in Qwen3.5 deployment, planned by vLLM's fi_chunk_gated_delta_rule
and FlashInfer's own wrappers on the stand-in H200 (no GPU here): which kernels, which keys, which chunk shapes reach
them; the key codec against FlashInfer's own key objects."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have, run_cli

pytestmark = pytest.mark.skipif(not (have("vllm") and have("cutlass") and have("flashinfer")),
                                reason="needs vLLM, FlashInfer and nvidia-cutlass-dsl")
QWEN = os.path.join(ROOT, "aot", "data", "qwen3.5-35b-a3b-fp8-h200.toml")
CP = ("CPDeltaRuleTPrecomputeSm90", "CPDeltaRuleMNPrecomputeSm90", "CPDeltaRuleFixupHmmaSm90", "CPDeltaRulePrefillSm90")


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fiplan") / "plan.json")
    run_cli("build", "--deployment", QWEN, "--runtime", "flashinfer_cute", "--plan-only", "--emit-plan", path, "--quiet")
    with open(path) as f:
        return json.load(f)


def test_plan_has_every_key_flashinfer_looks_up(plan):
    """7 keys of 5 kernels: FlashInfer's CP route (4 kernels) for 1-2 sequences (1 or 2 x 32 value heads x 2 < 132
    SMs, should_use_cp_host's HBM threshold), its fused kernel for 3 or more; each prefill kernel with and without
    checkpoints (prefix caching's align mode). Chunk size does not change a key: 1 to 8192 tokens reach the same 7."""
    reqs = plan["requests"]
    by = {}
    for r in reqs:
        name = r["kernel"].rpartition(":")[2]
        attrs = dict(r["key"][2])
        by.setdefault(name, []).append((attrs.get("needs_checkpointing", ["bool", None])[1], r["extra"]["call"]))
        assert r["key"][0] == "fi_cute" and r["key"][1][0] == r["kernel"] and r["variant"] == "exact"
        assert r["key"][3] == [["cutlass.base_dsl.compiler:EnableTVMFFI", ["bool", True]],
                               ["cutlass.base_dsl.compiler:GPUArch", ["str", "sm_90a"]]]  # FlashInfer's _SM90_COMPILE_OPTIONS
        assert attrs["cu_seqlens_dtype"] == ["torch", "int64"]  # vLLM's int32 query_start_loc, made int64 by vLLM
    assert sorted(by) == sorted([*CP, "_FullyFusedDeltaRuleSm90"]) and len(reqs) == 7
    assert sorted(c for c, _ in by["CPDeltaRulePrefillSm90"]) == [False, True]
    assert sorted(c for c, _ in by["_FullyFusedDeltaRuleSm90"]) == [False, True]
    for name in CP:
        assert all(call["seqs"] <= 2 for _, call in by[name])
    assert all(call["seqs"] >= 3 for _, call in by["_FullyFusedDeltaRuleSm90"])
    fused = dict(next(r["key"][2] for r in reqs if r["kernel"].endswith("_FullyFusedDeltaRuleSm90")))
    assert fused["dtype"] == ["cutlass", "BFloat16"] and fused["state_dtype"] == ["cutlass", "Float32"]
    assert fused["needs_alpha"] == fused["needs_beta"] == fused["needs_init_state"] == ["bool", True]
    kernel = plan["kernels"][next(r["kernel"] for r in reqs if r["kernel"].endswith("_FullyFusedDeltaRuleSm90"))]
    assert kernel["runtime"] == "flashinfer_cute" and kernel["info"]["sources"][0].endswith(".delta_rule_sm90")


CODEC = """
import json
from nojit.loader.bundle.canonical import canonical_json
from nojit.loader.bundle.fi_cute_key import key_to_json, key_text
import torch, cutlass
from flashinfer.gdn_kernels.delta_rule_dsl import delta_rule_sm90 as m
# FlashInfer's own key object for vLLM's plain prefill (bf16, fp32 state, alpha/beta/initial state, int64 cu_seqlens)
k = m._get_prefill_kernel(True, True, True, False, cutlass.BFloat16, initial_state_dtype=torch.float32,
                          state_dtype=torch.float32, checkpoint_state_dtype=torch.float32, use_state_indices=False,
                          cu_seqlens_dtype=torch.int64, state_indices_dtype=None, checkpoint_cu_starts_dtype=None,
                          state_inner_strides=None, init_state_inner_strides=None)
from flashinfer.gdn_kernels.delta_rule_dsl.custom_compile_cache import _compile_options_key
key = (k._get_compile_key(), _compile_options_key(m._SM90_COMPILE_OPTIONS))
print(json.dumps({"key": key_to_json(key), "text": key_text(key_to_json(key))}))
"""


def test_planned_key_is_flashinfers_own(plan):
    """The planned key of the plain fused prefill equals what FlashInfer's own _get_prefill_kernel and
    _compile_options_key give for vLLM's arguments (computed here without the planner)."""
    p = subprocess.run([sys.executable, "-c", CODEC], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    planned = [r["key"] for r in plan["requests"] if r["kernel"].endswith("_FullyFusedDeltaRuleSm90")]
    assert out["key"] in planned
    assert out["text"].startswith("_FullyFusedDeltaRuleSm90(needs_alpha=True, needs_beta=True, needs_init_state=True, "
                                  "needs_checkpointing=False, dtype=BFloat16")


def test_key_structure_checks(plan):
    """The manifest's checks of a key: its structure, and the kernel it names (an entry is filed under that kernel)."""
    from nojit.loader.bundle import fi_cute_key

    r = next(r for r in plan["requests"] if r["kernel"].endswith("_FullyFusedDeltaRuleSm90"))
    fi_cute_key.validate(r["key"])
    assert fi_cute_key.kernel_of(r["key"]) == r["kernel"]
    for bad in (["fi_cute", [], [], []], ["fi_cute", ["x:y"], [["a", ["nope", 1]]], []], ["cute", ["x:y"], [], []]):
        with pytest.raises(ValueError):
            fi_cute_key.validate(bad)
