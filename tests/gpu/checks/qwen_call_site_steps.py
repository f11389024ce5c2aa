"""The steps check_call_sites.py drives for Qwen3.5 (`--steps-module qwen_call_site_steps`; issue 24, must-show 2).

vLLM 0.33.0's own call sites, from the carried copy (vllm_mount): the GDN layer's core is
`QwenGatedDeltaNetAttention._forward_core_fused_norm_packed` itself (the path `forward_cuda` takes for a bf16 model
with MTP, qwen_gdn_linear_attn.py:1151), bound to a layer object that holds what vLLM's __init__ would (head counts,
the Mamba cache laid out as the runner lays it out, conv weights, A_log, dt_bias, the gated norm), and run under a
forward context whose attention metadata is vLLM's own GDNAttentionMetadata (gdn_attn.py:89), filled as its builder
fills it (causal_conv1d's program table from vLLM's compute_causal_conv1d_metadata). vLLM's code then picks the branch
(prefill-only, spec-decode-only, packed non-spec decode, prefills mixed with spec decodes or with plain decodes) and
launches causal_conv1d_fn / _update, fused_post_conv_prep, fused_sigmoid_gating_delta_rule_update, the packed
recurrent decode and the gated RMSNorm (layer_norm_fwd) with the arguments it computes. The full-attention layers'
fused_qk_rmsnorm_rope_gate and the routed experts' fused_moe_kernel (vLLM's try_get_optimal_moe_config, its
_prepare_expert_assignment and invoke_fused_moe_triton_kernel, as TritonExperts.apply calls them) run on the same
tokens; the Mamba prefix-cache copy (batch_memcpy) in the mixed step.

Shapes are the deployment's: `facts.json` (NOJIT_QWEN_FACTS; written on the build box by
tools/prepare_qwen_device.py with the model room's own functions, `deployment_facts` below).

On the CPU (tests/checks/test_check_qwen_call_sites.py) the steps run with Triton's launches recorded, not
interpreted (`check_call_sites.py --dry-keys`): Triton's interpreter stops in causal_conv1d_update ("Did you forget to
add @triton.jit?"), so `--interpret` runs only the attention and MoE launches of these steps.

Not Triton, not carried, stood in by plain torch (their outputs are not what this check compares; the Triton
launches after them read what they wrote, identically in both runs): vLLM's CUDA ops moe_align_block_size (the
expert alignment, filled in torch as its docstring defines it), fused_gdn_decode_post_conv_mtp (the spec-decode
core: `out` gets the output gate) and silu_and_mul + the FP8 activation quantization between the two expert GEMMs;
FlashInfer's chunked GDN prefill (the layer's chunk_gated_delta_rule: returns v and the initial state).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import types
from typing import Any

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
FACTS_ENV = "NOJIT_QWEN_FACTS"
DEFAULT_FACTS = os.path.join(ROOT, ".device-qwen", "facts.json")

GDN = "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"
GDN_ATTN = "vllm.v1.attention.backends.gdn_attn"
FM = "vllm.model_executor.layers.fused_moe.fused_moe"
ALIGN = "vllm.model_executor.layers.fused_moe.moe_align_block_size"
QK = "vllm.model_executor.layers.fused_qk_norm_rope"
MAMBA_UTILS = "vllm.v1.worker.mamba_utils"
CALL_SITE_MODULES = (GDN, GDN_ATTN, FM, ALIGN, QK, MAMBA_UTILS, "vllm.envs")
PREFIX = "model.layers.0.linear_attn"

_m: dict[str, Any] = {}
INDIRECT: dict[str, list[torch.Tensor]] = {}  # set by check_call_sites (tensors written through address tables)
ERRORS: list[str] = []
IMPORT_ERRORS: list[str] = []


# ------------------------------------------------------------------------------------------- facts (build box)
def deployment_facts(ref: str) -> dict[str, Any]:
    """What the steps need of a Qwen deployment, from the model room's own functions (needs vLLM: run on the box,
    in a process of its own, since the deployment rules install the deployment's platform)."""
    from nojit.aot.deployment import load_deployment
    from nojit.aot.models import model_for
    from nojit.aot.models.qwen3_5.config import gdn_facts, text_config
    from nojit.aot.models.qwen3_5.moe import block_fp8
    from nojit.aot.vllm_env import import_kernel_module

    d = load_deployment(ref)
    model_for(d.hf_config, d.hf_config_source).check_deployment(d)
    f, tc, tp = gdn_facts(d), text_config(d.hf_config), d.tensor_parallel_size
    heads, kv_heads = int(tc["num_attention_heads"]) // tp, max(1, int(tc["num_key_value_heads"]) // tp)
    head_dim = int(tc.get("head_dim") or int(tc["hidden_size"]) // int(tc["num_attention_heads"]))
    rope = tc.get("rope_parameters") or tc.get("rope_scaling") or {}
    rotary = int(head_dim * float(rope.get("partial_rotary_factor", tc.get("partial_rotary_factor", 1.0))))
    activation = tc.get("output_gate_type", "silu")
    facts: dict[str, Any] = {
        "deployment": d.name, "device_name": d.platform.device_name, "dtype": d.dtype, "tp": tp, "max_num_batched_tokens": d.max_num_batched_tokens,
        "max_num_seqs": d.max_num_seqs, "spec_tokens": d.num_speculative_tokens if d.spec_decode else 0,
        "gdn": {"h": f.h, "hv": f.hv, "k": f.k, "v": f.v, "width": f.conv_kernel_size,
                "conv_dtype": str(f.conv_dtype).removeprefix("torch."),
                "state_dtype": str(f.state_dtype).removeprefix("torch."), "conv_state_len": f.conv_state_len,
                "page_bytes": f.page_bytes, "eps": float(tc.get("rms_norm_eps", 1e-6)),
                "hidden_act": tc.get("hidden_act", "silu"),
                "norm_activation": "silu" if activation == "swish" else activation},
        "attention": {"heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "rotary": rotary,
                      "mrope_section": rope.get("mrope_section") if rope.get("mrope_interleaved") else None,
                      "max_position": int(tc["max_position_embeddings"]), "eps": float(tc.get("rms_norm_eps", 1e-6))},
        "moe": None,
    }
    block = block_fp8(d)
    if block is not None and "num_experts" in tc:
        e, n = int(tc["num_experts"]), int(tc["moe_intermediate_size"]) // tp
        fm = import_kernel_module(FM)
        facts["moe"] = {"experts": e, "top_k": int(tc["num_experts_per_tok"]), "hidden": int(tc["hidden_size"]),
                        "n": n, "block": list(block),
                        # the tile-config file vLLM's lookup reads for this shape on the deployment's device
                        "config_file": fm.get_config_file_name(e, n, "fp8_w8a8", list(block))}
    return facts


def load_facts() -> dict[str, Any]:
    path = os.environ.get(FACTS_ENV, DEFAULT_FACTS)
    with open(path) as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------ imports
# vllm_mount stands in for these packages (DeepSeek-V4's call sites import them for types only); here they hold the
# call sites themselves and are loaded from the carried copy.
REAL_PACKAGES = ("vllm.model_executor.layers.mamba", "vllm.third_party.flash_linear_attention.ops")


def _real_packages() -> None:
    import vllm_mount

    for name in REAL_PACKAGES:
        vllm_mount.STUBS.pop(name, None)
    vllm_mount.EMPTY_PACKAGES = vllm_mount.EMPTY_PACKAGES - set(REAL_PACKAGES)


def mount_qwen(vllm_src: str) -> Any:
    """vllm_mount.mount with REAL_PACKAGES loaded from the copy; once per process (the build's kernel shims call it
    for every kernel module: tools/prepare_qwen_device.py)."""
    import vllm_mount

    _real_packages()
    for finder in sys.meta_path:
        if isinstance(finder, vllm_mount.VllmFinder):
            return finder
    return vllm_mount.mount(vllm_src)


def kernel_modules(vllm_src: str, kernel_ids: list[str]) -> dict[str, Any]:
    """Which kernels of a plan import from the mounted copy (their module, their qualname), and the files loaded."""
    from nojit.loader.resolve import resolve_object

    finder = mount_qwen(vllm_src)
    _platform_answers()
    ok, failed = [], {}
    for kid in kernel_ids:
        try:
            resolve_object(kid, import_module=importlib.import_module)
            ok.append(kid)
        except Exception as exc:  # noqa: BLE001 - listed: the kernel is left out of the device plan
            failed[kid] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return {"ok": ok, "failed": failed, "files": sorted(set(finder.loaded))}


def import_call_sites() -> list[Any]:
    """Import the call-site modules (mounted vLLM copy); a failure is listed (the check fails), the rest go on."""
    _real_packages()
    _platform_answers()
    for name in CALL_SITE_MODULES:
        try:
            _m[name] = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - reported, and the check fails
            IMPORT_ERRORS.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
    _platform_answers()
    if ALIGN in _m:
        _m[ALIGN].ops = _AlignStandIn()
    if GDN in _m:
        _m[GDN].supports_fused_mtp_decode = lambda: True  # the H200 build of vLLM has the CUDA op
        _m[GDN].fused_mtp_decode_impl = lambda: _fused_mtp_stand_in
    return list(_m.values())


def _platform_answers() -> None:
    """The device name vLLM's MoE tile-config lookup asks (vllm_mount's platform stub has none): the GPU's own, and
    without one (the CPU half of this check) the deployment's."""

    def name(device_id: int = 0) -> str:
        return torch.cuda.get_device_name(device_id) if torch.cuda.is_available() else load_facts()["device_name"]

    platforms = sys.modules.get("vllm.platforms")
    if platforms is not None:
        platforms.current_platform.get_device_name = name


class _AlignStandIn:
    """vLLM's CUDA moe_align_block_size (not carried) in torch, as moe_align_block_size.py's docstring defines it:
    each expert's routed rows in order, padded to block_size with the sentinel topk_ids.numel()."""

    @staticmethod
    def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_size: int, sorted_ids: torch.Tensor,
                             expert_ids: torch.Tensor, num_tokens_post_pad: torch.Tensor, expert_map: Any = None,
                             scatter_idx: Any = None) -> None:
        flat = topk_ids.reshape(-1).long()
        counts = torch.bincount(flat, minlength=num_experts)
        padded = (counts + block_size - 1) // block_size * block_size
        starts = torch.cumsum(padded, 0) - padded
        order = torch.argsort(flat, stable=True)
        group_start = torch.cumsum(counts, 0) - counts
        rank = torch.arange(flat.numel(), device=flat.device) - group_start[flat[order]]
        sorted_ids.fill_(flat.numel())
        sorted_ids[starts[flat[order]] + rank] = order.to(sorted_ids.dtype)
        blocks = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block_size)
        expert_ids.fill_(0)
        expert_ids[: blocks.numel()] = blocks.to(expert_ids.dtype)
        num_tokens_post_pad.fill_(int(padded.sum()))


def _fused_mtp_stand_in(**kw: Any) -> None:
    """vLLM's CUDA fused_gdn_decode_post_conv_mtp (not carried): `out` gets the output gate."""
    kw["out"].copy_(kw["output_gate"])


def _chunk_stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: Any, beta: Any,
                    initial_state: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashInfer's chunked GDN prefill (CuTeDSL, not Triton; checked elsewhere): (v, the initial state)."""
    return v.clone(), initial_state.clone()


# ------------------------------------------------------------------------------------------------ inputs
def _gen(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


DRY = False  # check_call_sites --dry-keys: nothing is launched, so the large tensors need no data


def _randn(shape: tuple, dtype: torch.dtype, g: torch.Generator, device: str, scale: float = 1.0) -> torch.Tensor:
    if DRY and torch.Size(shape).numel() >= 1 << 20:
        return torch.empty(shape, dtype=dtype, device=device)
    return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)


def _i32(values: list[int], device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def gdn_layer(f: dict[str, Any], device: str, g: torch.Generator, num_blocks: int) -> types.SimpleNamespace:
    """A QwenGatedDeltaNetAttention as its __init__ leaves it for this deployment, vLLM's methods bound to it.
    The cache: one padded page per block, conv state then recurrent state (stand_in.gdn_cache's layout)."""
    gd, dtype, tp = f["gdn"], getattr(torch, f["dtype"]), f["tp"]
    h, hv, k, v, width = gd["h"], gd["hv"], gd["k"], gd["v"], gd["width"]
    conv_dtype, state_dtype = getattr(torch, gd["conv_dtype"]), getattr(torch, gd["state_dtype"])
    conv_dim, page = 2 * h * k + hv * v, gd["page_bytes"]
    raw = torch.zeros((num_blocks * page,), dtype=torch.uint8, device=device)
    csize, ssize = conv_dtype.itemsize, state_dtype.itemsize
    conv = raw.view(conv_dtype).as_strided((num_blocks, gd["conv_state_len"], conv_dim), (page // csize, conv_dim, 1), 0)
    conv_bytes = gd["conv_state_len"] * conv_dim * csize
    ssm = raw.view(state_dtype).as_strided((num_blocks, hv, v, k), (page // ssize, v * k, k, 1), conv_bytes // ssize)
    conv.copy_(_randn(tuple(conv.shape), conv_dtype, g, device, 0.5))
    ssm.copy_(_randn(tuple(ssm.shape), state_dtype, g, device, 0.1))
    envs = _m["vllm.envs"]
    layer = types.SimpleNamespace(
        prefix=PREFIX, tp_size=tp, tp_rank=0, num_k_heads=h * tp, num_v_heads=hv * tp, head_k_dim=k, head_v_dim=v,
        key_dim=h * tp * k, value_dim=hv * tp * v, disable_tp_for_ba_proj=False, kv_cache=[conv, ssm], raw_cache=raw,
        conv1d=types.SimpleNamespace(weight=_randn((conv_dim, 1, width), dtype, g, device, 0.5), bias=None),
        activation=gd["hidden_act"], A_log=_randn((hv,), torch.float32, g, device, 0.5),
        dt_bias=_randn((hv,), dtype, g, device, 0.5),
        norm=types.SimpleNamespace(weight=_randn((v,), dtype, g, device, 0.2) + 1, bias=None, eps=gd["eps"],
                                   group_size=None, norm_before_gate=True, activation=gd["norm_activation"]),
        layer_norm_epsilon=gd["eps"], enable_packed_recurrent_decode=envs.VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE,
        gdn_decode_kernel=envs.VLLM_GDN_DECODE_KERNEL.strip().lower(),
        enable_fused_gdn_spec_decode=f["spec_tokens"] > 0, chunk_gated_delta_rule=_chunk_stand_in,
    )
    cls = _m[GDN].QwenGatedDeltaNetAttention
    for name in ("_forward_core_fused_norm_packed", "_forward_core_fused_norm", "_forward_core",
                 "_forward_core_decode_non_spec", "_forward_core_decode_spec_fused_norm",
                 "_forward_core_decode_spec_post_conv_fused_norm", "_can_use_fused_gdn_mtp_decode",
                 "_rms_norm_gated_cuda", "rearrange_mixed_qkv", "split_ba", "_warmup_prefill_kernels"):
        setattr(layer, name, types.MethodType(getattr(cls, name), layer))
    return layer


# ------------------------------------------------------------------------------------------------ batches
def gdn_metadata(f: dict[str, Any], decodes: int, spec: int, prefills: list[tuple[int, int]], device: str,
                 g: torch.Generator) -> tuple[Any, int]:
    """vLLM's GDNAttentionMetadata for one step, as GDNAttentionMetadataBuilder.build fills it (decode-first order:
    spec decodes or plain decodes, then prefills). prefills: (computed tokens, new tokens) per prefill request.
    Block ids: request i owns blocks 2i and 2i+1 (its current and speculative state slot)."""
    gdn_attn = _m[GDN_ATTN]
    q = f["spec_tokens"] + 1
    lens = [q] * spec + [1] * decodes + [n for _, n in prefills]
    reqs = len(lens)
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    total = qsl[-1]
    kw: dict[str, Any] = dict(num_prefills=len(prefills), num_prefill_tokens=sum(n for _, n in prefills),
                              num_decodes=decodes, num_decode_tokens=decodes, num_spec_decodes=spec,
                              num_spec_decode_tokens=spec * q, num_actual_tokens=total)
    blocks = [[2 * i, 2 * i + 1] for i in range(reqs)]
    if spec:
        masks = [True] * spec + [False] * (reqs - spec)
        kw["spec_sequence_masks"] = torch.tensor(masks, device=device)
        kw["spec_sequence_masks_cpu"] = torch.tensor(masks)
        kw["spec_query_start_loc"] = _i32(qsl[: spec + 1], device)
        kw["spec_state_indices_tensor"] = _i32([b[:q] for b in blocks[:spec]], device)
        kw["num_accepted_tokens"] = torch.randint(1, q + 1, (spec,), generator=g, device=device, dtype=torch.int32)
        kw["spec_token_indx"] = torch.arange(spec * q, device=device)
        kw["non_spec_token_indx"] = torch.arange(spec * q, total, device=device)
        if spec == reqs:
            kw["uniform_spec_sequence_length"] = q
    non_spec = [i for i in range(reqs) if i >= spec]
    if non_spec:
        starts = [qsl[i] - qsl[spec] for i in non_spec] + [total - qsl[spec]]
        kw["non_spec_query_start_loc"] = _i32(starts, device)
        kw["non_spec_state_indices_tensor"] = _i32([blocks[i][0] for i in non_spec], device)
    if prefills:
        computed = [0] * decodes + [c for c, _ in prefills]
        kw["has_initial_state"] = torch.tensor([c > 0 for c in computed], device=device)
        cpu = torch.tensor(starts, dtype=torch.int32)
        kw["nums_dict"], kw["batch_ptr"], kw["token_chunk_offset_ptr"] = gdn_attn.compute_causal_conv1d_metadata(
            cpu, device=torch.device(device))
        first = decodes if not spec else 0
        pre = [s - starts[first] for s in starts[first:]]
        kw["prefill_query_start_loc"] = _i32(pre, device)
        kw["prefill_state_indices"] = _i32([blocks[i][0] for i in non_spec[first:]], device)
        kw["prefill_has_initial_state"] = torch.tensor([c > 0 for c in computed[first:]], device=device)
    return gdn_attn.GDNAttentionMetadata(**kw), total


def gdn_forward(f: dict[str, Any], meta: Any, total: int, device: str, g: torch.Generator,
                layer: types.SimpleNamespace) -> dict[str, torch.Tensor]:
    """forward_cuda's part 2 for a bf16 model with MTP: the fused-norm packed core, vLLM's own method."""
    gd = f["gdn"]
    dtype = getattr(torch, f["dtype"])
    conv_dim = 2 * gd["h"] * gd["k"] + gd["hv"] * gd["v"]
    mixed_qkvz = _randn((total, conv_dim + gd["hv"] * gd["v"]), dtype, g, device, 0.5)
    ba = _randn((total, 2 * gd["hv"]), dtype, g, device)
    core = torch.zeros((total, gd["hv"], gd["v"]), dtype=dtype, device=device)
    sys.modules["vllm.forward_context"].CURRENT.attn_metadata = {PREFIX: meta}
    try:
        layer._forward_core_fused_norm_packed(mixed_qkvz, ba, core)
    finally:
        sys.modules["vllm.forward_context"].CURRENT.attn_metadata = None
    return {"gdn_core": core, "gdn_conv_state": layer.kv_cache[0], "gdn_ssm_state": layer.kv_cache[1]}


def attention(f: dict[str, Any], positions: list[int], device: str, g: torch.Generator) -> dict[str, torch.Tensor]:
    """models/qwen3_next.py:407-431: q_gate and k are views of the qkv projection; M-RoPE positions are the
    runner's (3, max_num_tokens + 1) int64 buffer (gpu/mm/rope.py:52), 1-D otherwise."""
    at, dtype = f["attention"], getattr(torch, f["dtype"])
    heads, kv, hd, rot = at["heads"], at["kv_heads"], at["head_dim"], at["rotary"]
    t = len(positions)
    qkv = _randn((t, (2 * heads + 2 * kv) * hd), dtype, g, device)
    q_gate, k, _ = qkv.split([2 * heads * hd, kv * hd, kv * hd], dim=-1)
    weight = _randn((hd,), dtype, g, device, 0.1)
    cache = _randn((at["max_position"], rot), dtype, g, device).clamp(-1, 1)
    section = at["mrope_section"]
    buffer = torch.zeros((3, f["max_num_batched_tokens"] + 1), dtype=torch.int64, device=device)
    buffer[:, :t] = torch.tensor(positions, device=device)
    pos = buffer[:, :t] if section else buffer[0, :t]
    out = _m[QK].fused_qk_rmsnorm_rope_gate(q_gate, k, weight, weight, cache, pos, at["eps"], heads, kv, hd, rot,
                                            norm_beta=1.0, mrope_section=section)
    return {f"attn_out{i}": o for i, o in enumerate(out)} | {"attn_qkv": qkv}


def routed_experts(f: dict[str, Any], m: int, device: str, g: torch.Generator) -> dict[str, torch.Tensor]:
    """TritonExperts.apply's launches (experts/triton_moe.py:322) for m tokens: vLLM's tile config for m, its
    expert assignment, w13 then w2 through invoke_fused_moe_triton_kernel."""
    mo = f["moe"]
    if mo is None:
        return {}
    fm, tl = _m[FM], sys.modules["vllm.triton_utils"].tl
    e, top_k, hidden, n, block = mo["experts"], mo["top_k"], mo["hidden"], mo["n"], mo["block"]
    fp8, dtype = torch.float8_e4m3fn, getattr(torch, f["dtype"])
    w13 = _randn((e, 2 * n, hidden), fp8, g, device, 0.5)
    w2 = _randn((e, hidden, n), fp8, g, device, 0.5)
    s13 = torch.rand((e, -(-2 * n // block[0]), -(-hidden // block[1])), generator=g, device=device) * 0.01
    s2 = torch.rand((e, -(-hidden // block[0]), -(-n // block[1])), generator=g, device=device) * 0.01
    config = fm.try_get_optimal_moe_config(w13.size(), w2.size(), top_k, "fp8_w8a8", m, block_shape=block)
    topk_ids = torch.rand((m, e), generator=g, device=device).topk(top_k, dim=-1).indices.to(torch.int32)
    topk_weights = torch.rand((m, top_k), generator=g, device=device).softmax(-1)
    sorted_ids, expert_ids, post = fm._prepare_expert_assignment(topk_ids, config, m, top_k, e, None,
                                                                  block_shape=block, ignore_invalid_experts=False)
    a1 = _randn((m, hidden), fp8, g, device)
    a1_scale = torch.rand((m, -(-hidden // block[1])), generator=g, device=device) * 0.1 + 0.01
    cache1 = torch.empty((m, top_k, 2 * n), dtype=dtype, device=device)
    cache3 = torch.empty((m, top_k, hidden), dtype=dtype, device=device)
    common = dict(compute_type=tl.bfloat16 if dtype == torch.bfloat16 else tl.float16, use_fp8_w8a8=True,
                  use_int8_w8a8=False, use_int8_w8a16=False, use_int4_w4a16=False, per_channel_quant=False,
                  block_shape=block)
    fm.invoke_fused_moe_triton_kernel(a1, w13, cache1, a1_scale, s13, topk_weights, sorted_ids, expert_ids, post,
                                      False, top_k, config, **common)
    # silu_and_mul and the per-128 FP8 quantization (CUDA ops): torch
    act = (torch.nn.functional.silu(cache1[..., :n].float()) * cache1[..., n:].float()).reshape(m * top_k, n)
    groups = act.reshape(m * top_k, -1, block[1])
    a2_scale = (groups.abs().amax(-1).clamp(min=1e-6) / 448.0).float()
    a2 = (groups / a2_scale[..., None]).reshape(m * top_k, n).to(fp8)
    fm.invoke_fused_moe_triton_kernel(a2, w2, cache3, a2_scale, s2, topk_weights, sorted_ids, expert_ids, post,
                                      True, 1, config, **common)
    return {"moe_w13_out": cache1, "moe_w2_out": cache3}


def prefix_cache_copy(layer: types.SimpleNamespace, device: str, g: torch.Generator) -> dict[str, torch.Tensor]:
    """The Mamba prefix-cache state copies (v1/worker/mamba_utils.py:1391 -> batch_memcpy): whole pages of the
    layer's cache from blocks 0, 2, 4 to spare pages, u64 addresses and int32 sizes."""
    page = layer.raw_cache.numel() // (layer.kv_cache[0].shape[0])
    spare = torch.zeros((3, page), dtype=torch.uint8, device=device)
    src = [layer.raw_cache.data_ptr() + b * page for b in (0, 2, 4)]
    dst = [spare[i].data_ptr() for i in range(3)]
    INDIRECT["batch_memcpy_kernel"] = [spare]
    _m[MAMBA_UTILS].batch_memcpy(torch.tensor(src, dtype=torch.uint64, device=device),
                                 torch.tensor(dst, dtype=torch.uint64, device=device),
                                 _i32([page] * 3, device))
    return {"prefix_copy": spare}


# ------------------------------------------------------------------------------------------------ steps
def _site(name: str, call: Any) -> dict[str, torch.Tensor]:
    try:
        return call() or {}
    except Exception as exc:  # noqa: BLE001 - reported per call site; the step goes on
        ERRORS.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
        return {}


def _step(device: str, seed: int, decodes: int = 0, spec: int = 0, prefills: tuple[tuple[int, int], ...] = (),
          copy: bool = False) -> dict[str, torch.Tensor]:
    f = load_facts()
    if f["spec_tokens"] == 0 and spec:
        raise ValueError(f"{f['deployment']} has no speculative decoding: no spec-decode step")
    g = _gen(device, seed)
    reqs = spec + decodes + len(prefills)
    layer = gdn_layer(f, device, g, num_blocks=2 * reqs + 6)
    meta, total = gdn_metadata(f, decodes, spec, list(prefills), device, g)
    out: dict[str, torch.Tensor] = {}
    if copy:
        out |= _site("prefix_cache_copy", lambda: prefix_cache_copy(layer, device, g))
    out |= _site("gdn", lambda: gdn_forward(f, meta, total, device, g, layer))
    q = f["spec_tokens"] + 1
    positions = ([100 + j for _ in range(spec) for j in range(q)] + [200] * decodes
                 + [c + j for c, n in prefills for j in range(n)])
    out |= _site("attention", lambda: attention(f, positions, device, g))
    out |= _site("moe", lambda: routed_experts(f, total, device, g))
    return out


def prefill(device: str, seed: int) -> dict[str, torch.Tensor]:
    """Prefill-only: three prompts, one continuing a cached prefix (has_initial_state)."""
    return _step(device, seed, prefills=((0, 7), (512, 300), (0, 1709)))


def decode(device: str, seed: int) -> dict[str, torch.Tensor]:
    """Decode with MTP: 64 requests verifying one draft each (spec-only: conv update + vLLM's CUDA MTP core)."""
    return _step(device, seed + 1, spec=64)


def decode_no_draft(device: str, seed: int) -> dict[str, torch.Tensor]:
    """Decode without drafts: 5 requests, the packed recurrent decode; 5 x top-8 x 4 <= 256 experts: the MoE's
    naive expert assignment (no alignment, fused_moe_kernel with sorted_token_ids None)."""
    return _step(device, seed + 2, decodes=5)


def mixed(device: str, seed: int) -> dict[str, torch.Tensor]:
    """Prefills mixed with spec decodes (MTP), and a prefix-cache copy."""
    return _step(device, seed + 3, spec=16, prefills=((0, 37), (1088, 500)), copy=True)


def mixed_no_draft(device: str, seed: int) -> dict[str, torch.Tensor]:
    """Prefills mixed with plain decodes (split non-spec: sigmoid-gating update on the decodes)."""
    return _step(device, seed + 4, decodes=5, prefills=((0, 64), (0, 255)))


STEPS = {"prefill": prefill, "decode": decode, "decode_no_draft": decode_no_draft, "mixed": mixed,
         "mixed_no_draft": mixed_no_draft}
