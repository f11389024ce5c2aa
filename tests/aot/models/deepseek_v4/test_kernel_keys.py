"""Keys of the DeepSeek-V4 model kernels for the default deployment (planning only, nothing compiled).

One subprocess installs the deployment platform, plans the DeepSeek-V4 kernels (vLLM's
declarations plus nojit's derived rows), also plans the CuTeDSL-less fallbacks, and keys
every derived call twice: with Triton's own binder and with the loader's run-time binder
on real (CPU) tensors of the same dtype and alignment. The tests read its JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from tests.support.common import needs_vllm

pytestmark = needs_vllm

FILTER = ("deepseek_v4,mla.sparse_swa,mla.compressor_utils,mla.indexer,fused_qk_rmsnorm,attention.ops.common,"
          "attention.ops.metadata,dsv4_topk")
COMBINE = "cache_utils:CombineTopkSwaIndicesKernel.kernel"
SAVE = "save_partial_states:SavePartialStatesKernel.kernel"
INDEXER_COMPRESS = "fused_compress_quant_cache:_fused_kv_compress_norm_rope_insert_indexer_attn"
PACK = "ops.common:PackSeqTritonKernel.kernel"
# Bytes per block of the block-outermost KV pool for the built-in config (23 C128 + 20 C4
# layers + 1 MTP SWA layer): the widest cache group is the 256-token MLA group, 20 C4 pages
# of 37440 B + 23 C128 pages of 1728 B + 20 indexer pages of 8640 B.
POOL_BLOCK_BYTES = 20 * 37440 + 23 * 1728 + 20 * 8640

SCRIPT = r"""
import json, sys
from dataclasses import replace
import torch
from triton._utils import canonicalize_ptr_dtype
from nojit.aot.build import BuildOptions, plan_deployment
from nojit.aot.deployment import load_deployment
from nojit.aot.runtimes.triton.sources import resolve_kernel
from nojit.aot.runtimes.triton.rows import Tensor
from nojit.aot.models.deepseek_v4.derived import DSV4_DERIVED
from nojit.loader.resolve import jit_function_of
from nojit.aot.runtimes.triton.compiler import key_for_call
from nojit.loader.bundle.triton_key import ArgSpecializer, key_to_json, make_binder, options_key, with_implicit_options

out_path, kernels = sys.argv[1], sys.argv[2].split(",")
d = load_deployment()
def plan(dep, ks):
    return plan_deployment(BuildOptions(output="unused", deployment=dep, runtimes=frozenset({"triton"}), kernels=ks))
main = plan(d, kernels)
nocute = plan(replace(d, cutedsl=False), ["DequantizeAndGatherKCacheKernel", "FusedIndexerQRopeQuantTritonKernel"])

specializer = ArgSpecializer(canonicalize_ptr_dtype, torch.Tensor)
def real(v):
    if isinstance(v, Tensor):
        base = torch.empty(64, dtype=v.dtype)
        return base if v.aligned else base[1:]
    return v
binds = []
for row in DSV4_DERIVED:
    fn = jit_function_of(resolve_kernel(row.kernel, None))
    for call in row.calls(d):
        triton_key = key_to_json(key_for_call(fn, (), dict(call)))
        _bound, spec, opts = make_binder(fn, specializer)(**{k: real(v) for k, v in call.items()})
        opts = with_implicit_options(opts, fn.debug, False, "")
        binds.append({"kernel": row.kernel, "triton": triton_key, "nojit": key_to_json((spec, options_key(opts)))})

# vLLM's own warmup registry, independent of nojit's enumeration: the model rows' registrations go
# into a JitWarmupRegistry and its warmup() launches them, with JITFunction.run recorded.
from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
from nojit.aot.models.deepseek_v4 import TRITON
from nojit.aot.runtimes.triton.enumeration import kernel_id, recording_jit_calls, resolve_owner
registry = JitWarmupRegistry(TRITON.vllm_config(d))
with registry.activate():
    for row in TRITON.owners:
        if any(s in row.kernel for s in kernels):
            owner = resolve_owner(row.owner)
            for registration in row.registrations(d):
                owner.register_warmup(**registration)
with recording_jit_calls() as calls:
    registry.warmup()
declared = sorted({(kernel_id(fn), json.dumps(key_to_json(key_for_call(fn, args, kw)), sort_keys=True))
                   for fn, args, kw in calls})
with open(out_path, "w") as f:
    json.dump({"plan": main.to_json(), "nocute": [r.kernel for r in nocute.requests], "binds": binds,
               "declared": declared}, f)
"""


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict[str, Any]:
    path = str(tmp_path_factory.mktemp("dsv4") / "dsv4.json")
    env = {**os.environ, "VLLM_TRITON_JIT_WARMUP_NUM_THREADS": "1"}  # vLLM's warmup on this thread (recorded)
    p = subprocess.run([sys.executable, "-c", SCRIPT, path, FILTER], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr[-4000:]
    with open(path) as f:
        return json.load(f)


def kid(plan: dict[str, Any], suffix: str) -> str:
    ids = [k for k in plan["kernels"] if k.endswith(suffix)]
    assert len(ids) == 1, f"{suffix}: {ids}"
    return ids[0]


def requests(result: dict[str, Any], suffix: str, origin: str) -> list[dict[str, Any]]:
    plan = result["plan"]
    k = kid(plan, suffix)
    return [r for r in plan["requests"] if r["kernel"] == k and r["origin"].startswith(origin)]


def named(result: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """A request's spec items by parameter name."""
    params = result["plan"]["kernels"][request["kernel"]]["params"]
    return dict(zip(params, request["key"]["spec"]))


def options(request: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, (_ty, value) in request["key"]["options"]}


def constexpr(item: list) -> Any:
    assert item[0] == "constexpr", item
    return item[1][1]


def test_registry_keys_are_vllms_own_warmup(result):
    """The planned registry keys are exactly what vLLM's JitWarmupRegistry launches for the same registrations."""
    plan = result["plan"]
    planned = {(r["kernel"], json.dumps(r["key"], sort_keys=True)) for r in plan["requests"]
               if r["origin"].startswith("registry")}
    declared = {tuple(k) for k in result["declared"]}
    assert declared and planned == declared
    assert {k for k, _ in planned} >= {kid(plan, s) for s in (COMBINE, SAVE, INDEXER_COMPRESS, PACK)}


def test_every_derived_key_names_its_site(result):
    plan = result["plan"]
    derived = [r for r in plan["requests"] if r["origin"].startswith("derived")]
    assert derived
    for r in derived:
        info = plan["kernels"][r["kernel"]]["info"]
        assert info["site"] and len(r["origin"]) > len("derived:"), r["kernel"]
        if "owner" not in info:  # a kernel only derived: its record names the call site its keys come from
            assert r["origin"] == f"derived:{info['site']}", r["kernel"]


def test_combine_gets_the_missing_alignment_rows(result):
    def rows(origin: str) -> set[tuple]:
        out = set()
        for r in requests(result, COMBINE, origin):
            n = named(result, r)
            groups = tuple(constexpr(n[p]) for p in ("TOP_K", "COMPRESS_RATIO", "PADDED_TOP_K"))
            out.add((groups, tuple(n[p][1] for p in ("topk_indices_ptr", "query_start_loc_ptr", "seq_lens_ptr",
                                                    "gather_lens_ptr", "left_visible_ptr"))))
        return out

    registry, derived = rows("registry"), rows("derived")
    assert {a for _g, a in derived} == {("D", "D", "D", "", "D"), ("D", "", "", "", "D")}
    assert {g for g, _a in derived} == {g for g, _a in registry}
    assert len({g for g, _a in derived}) == 9  # ratio 1, ratio 4, 7 C128A widths (128..8192)
    assert not registry & derived


def test_indexer_compressor_uses_the_pool_block_stride(result):
    (reg,), (der,) = requests(result, INDEXER_COMPRESS, "registry"), requests(result, INDEXER_COMPRESS, "derived")
    assert constexpr(named(result, reg)["KV_BLOCK_STRIDE"]) == 8640  # vLLM's round_up(64 * 132, 576): one page
    assert constexpr(named(result, der)["KV_BLOCK_STRIDE"]) == POOL_BLOCK_BYTES == 961344
    assert options(der) == {**options(reg), "launch_pdl": False}
    diff = [p for p, item in named(result, der).items() if named(result, reg)[p] != item]
    assert diff == ["KV_BLOCK_STRIDE"]


def test_save_partial_states_pass_launch_pdl_false(result):
    registry = {json.dumps(r["key"]["spec"]) for r in requests(result, SAVE, "registry")}
    derived = requests(result, SAVE, "derived")
    assert {json.dumps(r["key"]["spec"]) for r in derived} == registry
    assert all(options(r)["launch_pdl"] is False for r in derived)


def test_unregistered_kernels(result):
    (fill,) = requests(result, "attention:_fill_short_context_topk_indices", "derived")
    n = named(result, fill)
    assert [constexpr(n[p]) for p in ("TOP_K", "COMPRESS_RATIO", "PADDED_TOP_K")] == [512, 4, 512]
    assert options(fill)["num_warps"] == 8 and n["output"] == ["*i32", "D"] and n["positions"] == ["*i64", "D"]
    topk = [named(result, r) for r in requests(result, "dsv4_topk:_dsv4_topk_kernel", "derived")]
    assert sorted(constexpr(n["HAS_PADDING"]) for n in topk) == [False, True]
    for n in topk:
        assert n["is_padding_ptr"] == (["*u1", "D"] if constexpr(n["HAS_PADDING"]) else ["constexpr", ["NoneType", None]])
        assert constexpr(n["NUM_EXPERTS"]) == 256 and constexpr(n["launch_pdl"]) is True
        assert n["bias_vl_ptr"] == ["constexpr", ["NoneType", None]] and n["routed_scaling_factor"] == ["fp32", None]
    (mapping,) = requests(result, "metadata:_token_request_mapping_kernel", "derived")
    assert options(mapping)["num_warps"] == 4
    assert [named(result, mapping)[p] for p in ("num_reqs", "num_mapped", "num_tokens")] == [["i32", None]] * 3


def test_derived_calls_bind_with_tritons_binder_and_the_loaders(result):
    planned = {(r["kernel"], json.dumps(r["key"], sort_keys=True)) for r in result["plan"]["requests"]}
    assert result["binds"]
    for b in result["binds"]:
        assert b["triton"] == b["nojit"], b["kernel"]
        assert (b["kernel"], json.dumps(b["triton"], sort_keys=True)) in planned, b["kernel"]


def test_cutedsl_less_fallbacks_are_gated(result):
    assert Counter(k.rpartition(":")[2] for k in result["nocute"]) == {
        "DequantizeAndGatherKCacheKernel.kernel": 5, "FusedIndexerQRopeQuantTritonKernel.kernel": 1}
    assert not any("DequantizeAndGather" in k or "FusedIndexerQRope" in k for k in result["plan"]["kernels"])


def test_c128a_widths():
    from dataclasses import replace

    from nojit.aot.deployment import load_deployment
    from nojit.aot.models.deepseek_v4.derived import _c128a_widths

    d = load_deployment()
    assert _c128a_widths(d) == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert _c128a_widths(replace(d, max_model_len=100_000)) == [128, 256, 512, 896]  # cmax = round_up(782, 128)
    assert _c128a_widths(replace(d, max_model_len=4096)) == [128]
