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

from conftest import needs_vllm

pytestmark = needs_vllm

FILTER = ("deepseek_v4,mla.sparse_swa,mla.compressor_utils,mla.indexer,fused_qk_rmsnorm,attention.ops.common,"
          "attention.ops.metadata,dsv4_topk")
COMBINE = "cache_utils:CombineTopkSwaIndicesKernel.kernel"
SAVE = "save_partial_states:SavePartialStatesKernel.kernel"
INDEXER_COMPRESS = "fused_compress_quant_cache:_fused_kv_compress_norm_rope_insert_indexer_attn"
PACK = "ops.common:PackSeqTritonKernel.kernel"
REGISTRY = {  # kernel id suffix -> keys from vLLM's declarations (default deployment)
    "sparse_swa:ComputePrefillMetadataKernel.kernel": 11,
    "sparse_swa:_compute_swa_indices_and_lens_kernel": 1,
    "compressor_utils:CompressedSlotMappingKernel.kernel": 2,
    "indexer:PrepareUniformDecodeKernel.kernel": 27,
    "indexer:BuildPrefillChunkMetadataKernel.kernel": 108,
    "fused_qk_rmsnorm:FusedQKVRMSNormKernel.kernel": 1,
    "fused_inv_rope_fp8_quant:FusedInvRopeFP8QuantKernel.kernel": 1,
    "cache_utils:ComputeGlobalTopkIndicesAndLensKernel.kernel": 8,
    COMBINE: 27,
    "sparse_mla:BuildC128ATopkMetadataKernel.kernel": 1,
    SAVE: 3,
    INDEXER_COMPRESS: 1,
    "fused_mtp_input_rmsnorm:FusedMTPInputRMSNormKernel.kernel": 1,
    "fused_mtp_input_rmsnorm:MTPSharedHeadRMSNormKernel.kernel": 1,
    "ops.common:UnpackSeqTritonKernel.kernel": 1,
}
DERIVED = {  # kernel id suffix -> keys nojit adds from the call sites
    COMBINE: 18,  # 2 missing alignment rows x 9 (TOP_K, COMPRESS_RATIO, PADDED_TOP_K) groups
    SAVE: 3,  # launch_pdl=False
    INDEXER_COMPRESS: 1,  # real KV_BLOCK_STRIDE, launch_pdl=False
    "attention:_fill_short_context_topk_indices": 1,
    "dsv4_topk:_dsv4_topk_kernel": 2,  # HAS_PADDING True / False
    "metadata:_token_request_mapping_kernel": 1,
}
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
from nojit.loader.install import jit_function_of
from nojit.aot.runtimes.triton.compiler import key_for_call
from nojit.loader.triton_key import ArgSpecializer, key_to_json, make_binder, options_key

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
        opts = {**opts, "debug": opts.get("debug", fn.debug) or False, "instrumentation_mode": ""}
        binds.append({"kernel": row.kernel, "triton": triton_key, "nojit": key_to_json((spec, options_key(opts)))})
with open(out_path, "w") as f:
    json.dump({"plan": main.to_json(), "nocute": [r["kernel"] for r in nocute.requests], "binds": binds}, f)
"""


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict[str, Any]:
    path = str(tmp_path_factory.mktemp("dsv4") / "dsv4.json")
    p = subprocess.run([sys.executable, "-c", SCRIPT, path, FILTER], capture_output=True, text=True, env=dict(os.environ))
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


def test_every_dsv4_kernel_is_planned(result):
    expected = {**REGISTRY, PACK: 1}  # PackSeq's PAD_VALUE is a -inf constexpr, carried tagged
    got = {s: len(requests(result, s, "registry")) for s in expected}
    assert got == expected
    got = {s: len(requests(result, s, "derived")) for s in DERIVED}
    assert got == DERIVED
    for r in result["plan"]["requests"]:
        if r["origin"].startswith("derived"):
            assert result["plan"]["kernels"][r["kernel"]]["info"]["site"], r["kernel"]


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
