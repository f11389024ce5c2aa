"""Issue 24, Must show 1: Qwen3.5 on the CPU box. The plan of the built-in Qwen3.5 deployment holds every kernel
the model's call sites reach; a Qwen3.5 worker's startup (vLLM's plugin loader, the runner's warmup registry,
vLLM's own `qwen_triton_warmup` and Mamba's batch_memcpy warmup) resolves everything from the bundle in strict
mode: 0 compiles, exec-traced; and strict mode refuses Inductor, vLLM's default for this model, at the registry's
construction with one message naming the switch and its cost.

One module-scoped build (the kernels of qwen_triton_warmup, batch_memcpy and one runner owner: about 16 keys)
serves every test here; NOJIT_TEST_QWEN_BUNDLE=BUNDLE (plan at BUNDLE.plan.json) reuses a bundle built with the
whole deployment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have, run_cli
from tests.loader.test_vllm_strict_startup import compiler_runs

DEPLOYMENT = os.path.join(ROOT, "aot", "data", "qwen3.5-35b-a3b-fp8-h200.toml")
SCENARIO = os.path.join(ROOT, "tests", "probes", "probe_qwen_startup.py")
WARMUP_KERNELS = ("layer_norm_fwd_kernel,_causal_conv1d_fwd_kernel,_fused_post_conv_kernel,"
                  "fused_sigmoid_gating_delta_rule_update_kernel,batch_memcpy_kernel,_topp_sb_stats_kernel")
WARMUP_ORIGIN = "derived:model_executor/warmup/qwen_triton_warmup.py:386"

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")]


@pytest.fixture(scope="module")
def qwen_bundle(tmp_path_factory):
    prebuilt = os.environ.get("NOJIT_TEST_QWEN_BUNDLE")
    if prebuilt:
        return {"bundle": prebuilt, "plan": prebuilt + ".plan.json"}
    d = tmp_path_factory.mktemp("qwen")
    bundle, plan = str(d / "qwen.nojit"), str(d / "qwen.plan.json")
    run_cli("build", "--deployment", DEPLOYMENT, "--runtime", "triton", "--kernels", WARMUP_KERNELS, "--no-generic",
            "-o", bundle, "--emit-plan", plan, "--cache-dir", str(d / "cache"), "--quiet")
    return {"bundle": bundle, "plan": plan}


def run_scenario(tmp_path, qwen_bundle, *extra: str, nojit: bool = True) -> tuple[dict, list | None]:
    cache = tmp_path / "triton-cache"
    cache.mkdir()
    out = tmp_path / "report.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(cache), "NOJIT_MODE": "strict",
           "VLLM_PLUGINS": "nojit"}
    if nojit:
        env["NOJIT_BUNDLE"] = qwen_bundle["bundle"]
    else:
        env.pop("NOJIT_BUNDLE", None)
    cmd = [sys.executable, SCENARIO, "--plan", qwen_bundle["plan"], "--out", str(out), *extra,
           *([] if nojit else ["--no-nojit"])]
    trace = tmp_path / "exec.trace"
    strace = shutil.which("strace")
    if strace:
        cmd = [strace, "-f", "-qq", "-e", "trace=execve,execveat", "-o", str(trace), *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert out.exists(), f"the scenario wrote no report (exit {p.returncode})\n{p.stderr[-4000:]}"
    report = json.loads(out.read_text())
    report["stderr"] = p.stderr
    programs = None
    if strace:
        import re

        report["exec_refused"] = [line for line in trace.read_text().splitlines() if "exec" in line and "EACCES" in line]
        programs = [(path, re.findall(r'"((?:[^"\\]|\\.)*)"', argv)) for path, argv in
                    re.findall(r'exec(?:ve|veat)\((?:\d+, )?"([^"]*)", \[(.*?)\]', trace.read_text())]
    return report, programs


def plan_keys(plan_path: str, origin: str | None = None) -> set[tuple[str, str]]:
    plan = json.load(open(plan_path))
    return {(r["kernel"], json.dumps(r["key"], sort_keys=True)) for r in plan["requests"]
            if r["variant"] == "exact" and (origin is None or r["origin"] == origin)}


def test_plan_holds_every_kernel_the_call_sites_reach(tmp_path):
    """The whole deployment planned (no compile): every kernel a Qwen row names is planned with keys, and the
    GDN kernels carry the keys vLLM's own qwen_triton_warmup launches."""
    plan_path = tmp_path / "plan.json"
    run_cli("build", "--deployment", DEPLOYMENT, "--runtime", "triton", "--plan-only", "--emit-plan", str(plan_path),
            "-o", str(tmp_path / "q.nojit"), "--cache-dir", str(tmp_path / "cache"), "--quiet")
    from nojit.aot.models.qwen3_5 import derived

    plan = json.load(open(plan_path))
    planned = {r["kernel"] for r in plan["requests"] if r["variant"] == "exact"}
    rowed = set(derived.SITES.kernels) | set(derived.WARMUP.kernels) | set(derived.MOE.kernels) | {derived.ROPE}
    assert rowed <= planned, sorted(rowed - planned)
    warm = {k for k, _ in plan_keys(str(plan_path), WARMUP_ORIGIN)}
    assert warm == set(derived.WARMUP.kernels), warm
    moe = [r for r in plan["requests"] if r["kernel"] == derived.FUSED_MOE and r["variant"] == "exact"]
    assert len(moe) > 10  # one per tile config vLLM's lookup picks over M, times the int classes
    runner = {k.split(":")[0] for k in planned if k.startswith("vllm.v1.worker")}
    assert "vllm.v1.worker.mamba_utils" in runner and "vllm.v1.worker.gpu.model_states.mamba_hybrid" in runner
    print(f"plan: {len(planned)} kernels, {sum(r['variant'] == 'exact' for r in plan['requests'])} exact keys")


def test_qwen_startup_in_strict_mode_compiles_nothing(tmp_path, qwen_bundle):
    report, programs = run_scenario(tmp_path, qwen_bundle)
    assert "error" not in report, report["error"]["trace"] + report["stderr"][-3000:]
    served = {tuple(x) for x in report["served"]}
    warm = plan_keys(qwen_bundle["plan"], WARMUP_ORIGIN)
    assert warm, "the plan holds no qwen_triton_warmup keys: the check would prove nothing"
    assert warm <= served, sorted(warm - served)  # every key vLLM's own warmup launches came from the bundle
    assert served <= plan_keys(qwen_bundle["plan"]), sorted(served - plan_keys(qwen_bundle["plan"]))
    assert report["compiles"]["triton"] == 0
    # The launches went through the bundle's servers (served above: each recorded where the server's run returned
    # its entry; the one-call C path launches without the dry launcher's Python hook, so launches are not counted)
    assert report["dry"]["loads"] > 0
    assert report["nojit"]["unserved"] == [] and report["nojit"]["keys"].get("Triton", 0) > 0
    assert report["triton_cache_before"] == [] and report["triton_cache_after"] == []
    assert report["triton_real_driver_created"] is False
    assert "mode strict" in report["stderr"]
    if programs is None:
        pytest.skip("strace is not installed: the exec trace was not checked")
    compiles, _ = compiler_runs(programs, report)
    assert programs and compiles == [], compiles
    assert report["exec_refused"] == [], report["exec_refused"]


def test_the_counters_see_compiles_without_nojit(tmp_path, qwen_bundle):
    """The control: the same startup without nojit compiles (so zero above means nothing compiled). Triton's JIT
    compiles each warmup key, then cannot launch it on the CPU box (the build's offline driver refuses the launch):
    the compiles are counted before that."""
    report, _ = run_scenario(tmp_path, qwen_bundle, nojit=False)
    assert report["compiles"]["triton"] > 0, report.get("error", {}).get("trace")
    print(f"compiled without nojit: {report['compiles']['triton']}")


def test_strict_mode_refuses_inductor_with_the_switch_and_its_cost(tmp_path, qwen_bundle):
    """vLLM's own rule for this architecture: not among the breakable-CUDA-graph architectures, so O2 gives
    VLLM_COMPILE (Inductor). The registry's construction refuses it, before anything compiles. The negative
    control is the startup test above (its config has no Inductor: it starts), and DeepSeek-V4's architecture is
    vLLM's breakable default (mode NONE)."""
    from vllm.config.compilation import CompilationMode
    from vllm.config.vllm import DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES

    from nojit.aot.deployment import load_deployment

    archs = set(load_deployment(DEPLOYMENT).hf_config["architectures"])
    assert not archs & DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES  # so vLLM's default is VLLM_COMPILE for it
    assert "DeepseekV4ForCausalLM" in DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES
    report, programs = run_scenario(tmp_path, qwen_bundle, "--compilation-mode", str(int(CompilationMode.VLLM_COMPILE)))
    assert report.get("error", {}).get("type") == "PreflightError", report.get("error") or report["stderr"][-2000:]
    message = report["error"]["message"]
    assert "Inductor" in message and "VLLM_USE_BREAKABLE_CUDAGRAPH=1" in message and '"mode": 0' in message
    assert "What it costs:" in message and "fix:" in message
    assert report["compiles"]["triton"] == 0
    if programs is not None:
        assert compiler_runs(programs, report)[0] == []
    print(message)
