"""H200 check of the bundled FlashInfer GDN prefill (sm_90 CuTeDSL, runtime flashinfer_cute) against a float64
gated delta rule.

What runs: each `_FullyFusedDeltaRuleSm90` entry of the bundle (FlashInfer's non-CP prefill: 3 or more sequences on
the H200), its object read through nojit's reader (sha256 against the bundle's digest), linked with g++ against
CuTeDSL's C runtime and libtvm_ffi and loaded with `tvm_ffi.load_module` (the way tests/gpu/checks/
check_cutedsl_launch.py runs CuTeDSL objects), then called with the arguments FlashInfer's own launcher passes
to the function its `cached_compile` returned (flashinfer/gdn_kernels/delta_rule_dsl/delta_rule_sm90.py,
`delta_rule_prefill_dsl_sm90`, 0.7.2.post1 :2620-2644): q as a (T, D, Hq) view with strides (Hq*D, 1, D), k, v
and o as (D, T, H) views with strides (1, H*D, D), alpha and beta flattened, the fp32 state and initial state,
state_indices None, the checkpoints flattened (or None) and their int64 starts, a tensormap workspace of
sm_count x 128 bytes, int64 cu_seqlens, scale, the head counts, num_seqs, total_checkpoints,
checkpoint_every_n_tokens, grid_x = num_seqs x num_sab_heads and the stream.

Why not FlashInfer's own Python: its kernel modules import nvidia-cutlass-dsl at module level (`import cutlass`,
cutlass.pipeline, cute.nvgpu), 486 MB installed with a ~190 MB MLIR library, which cannot be carried to the device
(64 MiB per call) and FlashInfer itself is not installable there. On the CPU box the same bundle IS served to
FlashInfer's own Python (tests/loader/runtimes/flashinfer_cute/test_serving.py: FlashInfer's lookups answered by
nojit, 0 compiles, only the launch mocked); this check supplies the launch.

The reference (written here, float64, from the recurrence's definition, not from FlashInfer or FLA): per sequence
and value head h (q/k head h // (HV / H), vLLM's GVA), with S the [V, K] state starting at the initial state:
    S <- alpha_t S;  u = beta_t (v_t - S k_t);  S <- S + u k_t^T;  o_t = scale S q_t
and, with checkpoints every n tokens, S after each n tokens of the sequence. alpha = exp(g) (vLLM passes exp(g)).
The CPU half (tests/checks/test_check_gdn_prefill.py) checks this reference against transformers' Qwen3.5 MoE
torch fallback (`torch_recurrent_gated_delta_rule`).

Outputs (o, final state, checkpoints) are filled with NaN first; every element must be written and within
tolerance (max |diff| <= 2e-2 x max |ref|: bf16 inputs and outputs, an fp16 inverse inside the kernel); a control
puts one wrong value into the output and the same comparison must reject it. Cases: 3 sequences (200, 64, 17
tokens), 5 sequences (grid_x differs: a grid compiled in would fail here), and the checkpointing key (256, 130, 64
tokens, a checkpoint every 64). Processes started during the calls are counted with an audit hook (must be 0);
CUDA_DISABLE_PTX_JIT=1 keeps the driver from compiling PTX.

    python tests/gpu/checks/check_gdn_prefill.py --dir .device-gdn [--json OUT]       (GPU; tvm_ffi importable)
    python tests/gpu/checks/check_gdn_prefill.py --dir DIR --link-only                (no GPU: unpack, verify, link, load)
    python tests/gpu/checks/check_gdn_prefill.py --reference-self-test                (CPU: the reference vs transformers')
Without a GPU the launch phase is skipped: exit 3 and "SKIP", or 0 with --skip-ok.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
RUNTIME = "flashinfer_cute"
FUSED = "_FullyFusedDeltaRuleSm90"
H, HV, D = 16, 32, 128  # Qwen3.5-35B-A3B at TP 1: 16 key heads, 32 value heads of 128
TOL = 2e-2
SKIPPED = 3


# ---------------------------------------------------------------- the float64 reference
def gated_delta_rule_f64(q: Any, k: Any, v: Any, alpha: Any, beta: Any, init: Any, cu: list[int], scale: float,
                         every: int = 0) -> tuple[Any, Any, Any]:
    """(o [T, HV, V], final state [N, HV, V, K], checkpoints [C, HV, V, K] or None), all float64."""
    import torch

    q, k, v, alpha, beta = (x.double() for x in (q, k, v, alpha, beta))
    hv, h = v.shape[1], q.shape[1]
    heads = torch.arange(hv, device=q.device) // (hv // h)
    o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    finals, ckpts = [], []
    for n in range(len(cu) - 1):
        s = init[n].double().clone()
        for t in range(cu[n], cu[n + 1]):
            kt, qt = k[t][heads], q[t][heads]
            s = alpha[t][:, None, None] * s
            u = beta[t][:, None] * (v[t] - torch.einsum("hvk,hk->hv", s, kt))
            s = s + torch.einsum("hv,hk->hvk", u, kt)
            o[t] = scale * torch.einsum("hvk,hk->hv", s, qt)
            if every and (t - cu[n] + 1) % every == 0:
                ckpts.append(s.clone())
        finals.append(s)
    return o, torch.stack(finals), (torch.stack(ckpts) if ckpts else None)


def inputs(lengths: list[int], seed: int, device: str) -> dict[str, Any]:
    """Normalized q, k (vLLM normalizes before FlashInfer), v, alpha = exp(g) with g < 0, beta in (0, 1)."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    t = sum(lengths)

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, generator=g)

    q = torch.nn.functional.normalize(rnd(t, H, D), dim=-1)
    k = torch.nn.functional.normalize(rnd(t, H, D), dim=-1)
    return {
        "q": q.to(torch.bfloat16).to(device), "k": k.to(torch.bfloat16).to(device),
        "v": (0.5 * rnd(t, HV, D)).to(torch.bfloat16).to(device),
        "alpha": torch.exp(-torch.rand(t, HV, generator=g) * 0.7).to(device),
        "beta": torch.sigmoid(rnd(t, HV)).to(device),
        "init": (0.1 * rnd(len(lengths), HV, D, D)).to(device),
        "cu": [sum(lengths[:i]) for i in range(len(lengths) + 1)],
    }


def relative_error(out: Any, ref: Any) -> float:
    out = out.double()
    if not bool(out.isfinite().all()):
        return math.inf  # an element left NaN (poisoned, not written) or overflowed
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


# ---------------------------------------------------------------- one call as FlashInfer's launcher makes it
def call_fused(fn: Any, x: dict[str, Any], every: int, sm_count: int) -> dict[str, Any]:
    import torch

    dev = x["q"].device
    t, n = x["q"].shape[0], len(x["cu"]) - 1
    o = torch.full((t, HV, D), float("nan"), dtype=torch.bfloat16, device=dev)
    state = torch.full((n, HV, D, D), float("nan"), dtype=torch.float32, device=dev)
    ckpt, starts, total = None, None, 1
    if every:
        per = [(x["cu"][i + 1] - x["cu"][i]) // every for i in range(n)]
        total = sum(per)
        ckpt = torch.full((total, HV, D, D), float("nan"), dtype=torch.float32, device=dev)
        starts = torch.tensor([sum(per[:i]) for i in range(n + 1)], dtype=torch.int64, device=dev)
    cu = torch.tensor(x["cu"], dtype=torch.int64, device=dev)
    tensormaps = torch.empty(sm_count * 128, dtype=torch.uint8, device=dev)
    fn(x["q"].as_strided((t, D, H), (H * D, 1, D)), x["k"].as_strided((D, t, H), (1, H * D, D)),
       x["v"].as_strided((D, t, HV), (1, HV * D, D)), o.as_strided((D, t, HV), (1, HV * D, D)),
       x["alpha"].reshape(-1), x["beta"].reshape(-1), state, x["init"], None,
       ckpt.reshape(-1) if every else None, starts, tensormaps, cu, 1.0 / math.sqrt(D),
       H, H, HV, HV, n, total, every, n * HV, torch.cuda.current_stream().cuda_stream)
    return {"o": o, "state": state, "ckpt": ckpt}


def reference(x: dict[str, Any], every: int) -> tuple[Any, Any, Any]:
    """The float64 recurrence on a case's inputs (scale 1/sqrt(D), FlashInfer's default and vLLM's)."""
    return gated_delta_rule_f64(x["q"], x["k"], x["v"], x["alpha"], x["beta"], x["init"], x["cu"], 1.0 / math.sqrt(D),
                                every)


def compare(out: dict[str, Any], ref: tuple[Any, Any, Any], every: int) -> dict[str, Any]:
    """Written outputs (o [T, HV, V], state, ckpt) against the reference: errors, ok, and the control (one wrong
    value put into o must be rejected by the same comparison)."""
    ref_o, ref_s, ref_c = ref
    errs = {"o": relative_error(out["o"], ref_o), "state": relative_error(out["state"], ref_s)}
    if every:
        errs["checkpoints"] = relative_error(out["ckpt"], ref_c)
    spoiled = out["o"].clone()
    spoiled.view(-1)[len(spoiled.view(-1)) // 2] += float(ref_o.abs().max()) * 4
    return {"ok": all(e <= TOL for e in errs.values()), "errors": errs,
            "control_rejected": relative_error(spoiled, ref_o) > TOL}


CASES = (("3 sequences", [200, 64, 17], 0, 1), ("5 sequences", [129, 64, 3, 300, 80], 0, 2),
         ("checkpoints every 64", [256, 130, 64], 64, 3))
# FlashInfer's CP route: 1 or 2 sequences x 32 value heads is below its H200 parallelism threshold
# (varlen_helper.should_use_cp_host), so its wrapper runs the CP kernels; only check_gdn_flashinfer.py runs these
# (the direct-call step above calls the fused kernel's objects)
CP_CASES = (("1 sequence (CP route)", [1000], 0, 4), ("2 sequences (CP route), checkpoints every 64", [384, 130], 64, 5))


def run_cases(fns: dict[str, tuple[Any, dict]], sm_count: int) -> list[dict[str, Any]]:
    import torch

    results = []
    for name, lengths, every, seed in CASES:
        want = [s for s, (_, key) in fns.items() if key.get("needs_checkpointing") == bool(every)]
        r: dict[str, Any] = {"case": name, "lengths": lengths, "every": every, "symbols": want}
        if not want:
            r.update(ok=False, error="no bundled entry for this key")
            results.append(r)
            continue
        x = inputs(lengths, seed, "cuda")
        ref = reference(x, every)
        try:
            out = call_fused(fns[want[0]][0], x, every, sm_count)
            torch.cuda.synchronize()
            r.update(compare(out, ref, every))
        except Exception as exc:  # noqa: BLE001 - reported per case
            text = str(exc)  # TVM-FFI's argument errors put the reason after the whole signature: keep both ends
            r.update(ok=False, error=f"{type(exc).__name__}: {text if len(text) <= 700 else text[:200] + ' ... ' + text[-400:]}")
        results.append(r)
    return results


def key_attrs(key_json: list) -> dict[str, Any]:
    return {name: v[1] for name, v in key_json[2]}


# ---------------------------------------------------------------- the CPU half: the reference against another
def reference_self_test() -> int:
    """The float64 reference against transformers' own Qwen3.5 MoE `torch_recurrent_gated_delta_rule` (its torch
    fallback, one sequence at a time: [B, T, H, D] inputs, GVA by repeat_interleave as the model does, state [K, V])."""
    import torch
    from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf

    gen = torch.Generator().manual_seed(0)
    h, hv, kd, lengths = 2, 4, 16, [7, 12]
    t = sum(lengths)
    q = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(t, h, kd, generator=gen), dim=-1)
    v = torch.randn(t, hv, kd, generator=gen)
    g = -torch.rand(t, hv, generator=gen)
    beta = torch.sigmoid(torch.randn(t, hv, generator=gen))
    init = 0.1 * torch.randn(len(lengths), hv, kd, kd, generator=gen)  # [N, HV, V, K] (vLLM's layout)
    cu = [0, lengths[0], t]
    o, final, _ = gated_delta_rule_f64(q, k, v, torch.exp(g), beta, init, cu, kd ** -0.5)
    errs = {"o": 0.0, "state": 0.0}
    for n in range(len(lengths)):
        s, e = cu[n], cu[n + 1]
        rep = hv // h
        ho, hs = hf.torch_recurrent_gated_delta_rule(
            q[s:e].repeat_interleave(rep, dim=1)[None], k[s:e].repeat_interleave(rep, dim=1)[None], v[s:e][None],
            g[s:e][None], beta[s:e][None], initial_state=init[n:n + 1].transpose(-1, -2), output_final_state=True)
        errs["o"] = max(errs["o"], relative_error(ho[0], o[s:e]))
        errs["state"] = max(errs["state"], relative_error(hs[0].transpose(-1, -2), final[n]))
    print(json.dumps({"reference_vs_transformers": errs}))
    return 0 if all(e < 1e-4 for e in errs.values()) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))), ".device-gdn"))
    ap.add_argument("--json")
    ap.add_argument("--link-only", action="store_true")
    ap.add_argument("--reference-self-test", action="store_true")
    ap.add_argument("--skip-ok", action="store_true", help="exit 0 when there is no GPU")
    args = ap.parse_args()
    if args.reference_self_test:
        return reference_self_test()
    from check_cutedsl_launch import ProcessCounter, link_and_load, load_manifest

    manifest = load_manifest(args.dir)
    work = tempfile.mkdtemp(prefix="nojit-gdn-link-")
    t0 = time.perf_counter()
    entries, fns = link_and_load(args.dir, manifest, work, RUNTIME)
    fused = {e["symbol"]: (fns[e["symbol"]][1], key_attrs(e["key"])) for e in entries if e["owner"] == FUSED}
    print(f"linked and loaded {len(entries)} {RUNTIME} objects ({len(fused)} {FUSED}) in "
          f"{time.perf_counter() - t0:.1f}s", flush=True)
    if args.link_only:
        return 0 if fused else 1
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device; the launch phase needs the H200")
        return 0 if args.skip_ok else SKIPPED
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    counter = ProcessCounter()
    sys.addaudithook(counter)
    counter.armed = True
    results = run_cases(fused, sm_count)
    counter.armed = False
    for r in results:
        print(f"  {'ok  ' if r['ok'] else 'FAIL'} {r['case']}: {r.get('errors') or r.get('error')}"
              f" control rejected: {r.get('control_rejected')}")
    ok = all(r["ok"] and r.get("control_rejected") for r in results) and not counter.events
    print(f"{sum(r['ok'] for r in results)}/{len(results)} GDN prefill cases within {TOL} of float64; "
          f"processes started during the calls: {len(counter.events)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"entries": entries, "results": results, "processes": counter.events}, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
