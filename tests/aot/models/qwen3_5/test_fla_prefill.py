"""`--gdn-prefill-backend triton` for Qwen3.5 (issue 24): FLA's autotuned chunk kernels planned, plan level only.

The triton deployment's plan must hold every autotuned kernel FLA's `chunk_gated_delta_rule` reaches, each with
exactly the configs Triton's own Autotuner of that kernel considers on the H200, and its tuning key. The expected
side is independent of the rows: the kernel list is read from FLA's chunk.py, the configs from vLLM's Autotuner
objects imported in a process of their own whose GPU answers are written here (one H200: Triton's driver
reports 232448 bytes of opt-in shared memory, as cuDeviceGetAttribute does there), the tuning keys from Triton's
rule (the `key` arguments' values, then each tensor argument's dtype) with the layer's head counts and dims.
The default (FlashInfer) deployment's plan is unchanged. Each plan runs in its own process (one build process,
one platform: aot/vllm_env.py).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.common import have, run_cli

pytestmark = pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")
DEFAULT = "builtin:qwen3.5-35b-a3b-fp8-h200.toml"
TRITON = "builtin:qwen3.5-35b-a3b-fp8-h200-gdn-triton.toml"
FLA = "vllm.third_party.flash_linear_attention.ops"
# What FLA's chunk_gated_delta_rule_fwd launches (ops/chunk.py:23-85) for vLLM's call: g is [1, T, H] (the scalar
# cumsum, cumsum.py:216-240), chunk size FLA_CHUNK_SIZE = 64 (solve_tril's 64x64 merge, solve_tril.py:496-503),
# use_qk_l2norm_in_kernel=False (no l2norm).
REACHED = (
    f"{FLA}.cumsum:chunk_local_cumsum_scalar_kernel",
    f"{FLA}.chunk_scaled_dot_kkt:chunk_scaled_dot_kkt_fwd_kernel",
    f"{FLA}.solve_tril:merge_16x16_to_64x64_inverse_kernel",
    f"{FLA}.wy_fast:recompute_w_u_fwd_kernel",
    f"{FLA}.chunk_delta_h:chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
    f"{FLA}.chunk_o:chunk_fwd_kernel_o",
)
# The layer (Qwen3.5-35B-A3B, TP 1): 32 value heads, head dims 128; FLA's BT = 64, one varlen batch.
KEY_VALUES = {"B": 1, "H": 32, "K": 128, "V": 128, "BT": 64, "IS_VARLEN": True, "REVERSE": False}

AUTOTUNERS = r"""
import json, os, sys, types
os.environ["CUDA_VISIBLE_DEVICES"] = ""
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.runtime import driver

class H200:  # what Triton's driver answers on one H200
    utils = types.SimpleNamespace(get_device_properties=lambda i: {"max_shared_mem": 232448, "multiprocessor_count": 132})
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cuda", 0)
    def get_current_device(self): return 0
    def is_active(self): return True

driver.set_active(H200())
torch.cuda.device_count = lambda: 1
torch.cuda.get_device_name = lambda device=None: "NVIDIA H200"
torch.cuda.get_device_capability = lambda device=None: (9, 0)
from nojit.aot.vllm_env import PlatformFacts, install_deployment_platform
install_deployment_platform(PlatformFacts())
from triton.runtime.autotuner import Autotuner
from nojit.loader.bundle.autotune import config_to_json
import importlib
out = {}
for kid in sys.argv[1:]:
    module, name = kid.split(":")
    obj = getattr(importlib.import_module(module), name)
    while not isinstance(obj, Autotuner):
        obj = obj.fn
    assert obj.early_config_prune is None and obj.perf_model is None, kid  # Triton's prune_configs keeps them all
    out[kid] = {"configs": [config_to_json(c.all_kwargs()) for c in obj.configs], "keys": list(obj.keys),
                "plain": [c.all_kwargs() for c in obj.configs]}
print("AUTOTUNERS " + json.dumps(out))
"""


def _plan(deployment: str, path: str, runtimes: str = "triton,flashinfer_cute") -> dict:
    run_cli("build", "--deployment", deployment, "--runtime", runtimes, "--plan-only", "--emit-plan", path,
            "-o", path + ".nojit", "--quiet")
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    d = tmp_path_factory.mktemp("fla-plans")
    return {"triton": _plan(TRITON, str(d / "triton.plan.json")), "default": _plan(DEFAULT, str(d / "default.plan.json"))}


@pytest.fixture(scope="module")
def autotuners():
    p = subprocess.run([sys.executable, "-c", AUTOTUNERS, *REACHED], capture_output=True, text=True, timeout=600)
    line = [x for x in p.stdout.splitlines() if x.startswith("AUTOTUNERS ")]
    assert p.returncode == 0 and line, p.stderr[-3000:]
    return json.loads(line[0].removeprefix("AUTOTUNERS "))


def _canon(configs: list[dict]) -> list[str]:
    return sorted(json.dumps(c, sort_keys=True) for c in configs)


def problems(plan: dict, autotuners: dict) -> list[str]:
    """Where the plan's autotuned kernels differ from Triton's own Autotuners (empty: none)."""
    from nojit.loader.bundle.autotune import tuning_key_from_json

    out = []
    tuned = {k: v["info"]["autotune"] for k, v in plan["kernels"].items() if "autotune" in v.get("info", {})}
    if set(tuned) != set(autotuners):
        out.append(f"autotuned kernels {sorted(set(tuned) ^ set(autotuners))} are in one side only")
    for kid, want in autotuners.items():
        at = tuned.get(kid)
        if at is None:
            continue
        if _canon(at["configs"]) != _canon(want["configs"]):
            out.append(f"{kid}: configs {len(at['configs'])} planned, {len(want['configs'])} Triton's")
        if len(at["keys"]) != 1:
            out.append(f"{kid}: {len(at['keys'])} tuning keys")
        for k in at["keys"]:
            if sorted(k["configs"]) != list(range(len(want["configs"]))):
                out.append(f"{kid}: tuning key {k['key']} has configs {k['configs']}")
            key = tuning_key_from_json(k["key"])
            values = dict(zip(want["keys"], key))
            if any(values[n] != KEY_VALUES[n] for n in want["keys"] if n in KEY_VALUES):
                out.append(f"{kid}: tuning key {key} is not the layer's {KEY_VALUES}")
            if not all(isinstance(x, str) and x.startswith("torch.") for x in key[len(want["keys"]):]):
                out.append(f"{kid}: tuning key {key} does not end with the tensor dtypes")
        exact = [r for r in plan["requests"] if r["kernel"] == kid and r["variant"] == "exact"]
        if len(exact) != len(want["configs"]):  # every config one exact key of the inner kernel
            out.append(f"{kid}: {len(exact)} exact keys for {len(want['configs'])} configs")
    return out


def test_tritons_autotuners_hold_the_h200s_config_lists(autotuners):
    """The expected side itself: FLA picks its large-shared-memory lists on the H200 (check_shared_mem: 232448 >=
    102400) and Hopper's warps for chunk_o; 88 configs over the 6 kernels."""
    o = autotuners[f"{FLA}.chunk_o:chunk_fwd_kernel_o"]["plain"]
    assert {c["BK"] for c in o} == {64, 128} and {c["num_warps"] for c in o} == {2, 4}, o[:2]
    assert {k: len(v["configs"]) for k, v in autotuners.items()} == dict(zip(REACHED, (4, 27, 12, 9, 12, 24)))


def test_the_triton_plan_holds_every_autotuned_kernel_with_tritons_configs_and_keys(plans, autotuners):
    assert problems(plans["triton"], autotuners) == []
    from nojit.loader.bundle.autotune import tuning_key_from_json

    keys = {k: tuning_key_from_json(v["info"]["autotune"]["keys"][0]["key"]) for k, v in plans["triton"]["kernels"].items()
            if "autotune" in v["info"]}
    print("tuning keys:", json.dumps(keys))


def test_a_plan_missing_a_row_or_a_config_fails_the_comparison(plans, autotuners):
    """Mistake controls: the same comparison on the plan with one kernel's rows dropped, with one config dropped,
    and on the default plan (no FLA rows) reports each."""
    import copy

    plan = plans["triton"]
    dropped = copy.deepcopy(plan)
    kid = REACHED[2]
    del dropped["kernels"][kid]
    dropped["requests"] = [r for r in dropped["requests"] if r["kernel"] != kid]
    assert any("one side only" in p for p in problems(dropped, autotuners))
    short = copy.deepcopy(plan)
    short["kernels"][REACHED[5]]["info"]["autotune"]["configs"].pop()
    assert any("configs 23 planned, 24 Triton's" in p for p in problems(short, autotuners))
    assert problems(plans["default"], autotuners)


def test_backends_plan_only_their_own_prefill(plans):
    """FlashInfer's CuTeDSL rows plan nothing with the triton backend; FLA's chunk kernels nothing with the default
    (whose counts are those README states: 51 Triton kernels, 159 exact keys, 403 with the generic entries, and 7
    flashinfer_cute keys)."""
    tri, default = plans["triton"], plans["default"]
    runtimes = lambda plan: {v["runtime"] for v in plan["kernels"].values()}  # noqa: E731
    assert "flashinfer_cute" not in runtimes(tri) and "flashinfer_cute" in runtimes(default)
    assert not set(REACHED) & set(default["kernels"])
    triton_requests = [r for r in default["requests"] if default["kernels"][r["kernel"]]["runtime"] == "triton"]
    triton_kernels = {r["kernel"] for r in triton_requests}
    fi = [r for r in default["requests"] if default["kernels"][r["kernel"]]["runtime"] == "flashinfer_cute"]
    assert (len(triton_kernels), sum(r["variant"] == "exact" for r in triton_requests), len(triton_requests),
            len(fi)) == (51, 159, 403, 7)
    assert "gdn_prefill_backend" not in default["deployment"] and tri["deployment"]["gdn_prefill_backend"] == "triton"
    # the rest of the model is planned as by default, on its own block size (1056: no FlashInfer alignment)
    assert {k for k in tri["kernels"]} - set(REACHED) == triton_kernels
    assert tri["deployment"]["block_size"] == 1056


def test_fla_imported_before_the_stand_in_answers_is_refused():
    """FLA imported with no GPU answers picks its small-shared-memory lists: the build refuses to plan from it."""
    body = """
from nojit.aot.errors import BuildError
from nojit.aot.models.qwen3_5.fla_host import import_fla
from nojit.aot.vllm_env import PlatformFacts, import_kernel_module, install_deployment_platform
install_deployment_platform(PlatformFacts())
o = import_kernel_module("vllm.third_party.flash_linear_attention.ops.chunk_o")
assert o.BKV_LIST == [32, 64], o.BKV_LIST  # the positive control: the small list without the answers
try:
    import_fla(PlatformFacts())
except BuildError as e:
    assert "before nojit answered" in str(e), e
    print("REFUSED")
import_fla(PlatformFacts(), check=False)  # resolving the backend (the FlashInfer prefill) needs no FLA lists
print("RESOLVES")
"""
    p = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "REFUSED" in p.stdout and "RESOLVES" in p.stdout, p.stderr[-3000:]
