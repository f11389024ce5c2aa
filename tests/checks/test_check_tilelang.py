"""CPU checks of the TileLang GPU check (tests/gpu/checks/check_tilelang.py): before it runs on an H200, its
references must be vLLM's formulas, its tolerances must pass kernel-like rounding and fail real errors,
and its launch path must work with TileLang blocked and vLLM imported from a carried copy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support.common import GPU_CHECKS, ROOT, have, run_cli

sys.path.insert(0, GPU_CHECKS)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import check_tilelang as ct  # noqa: E402

needs_vllm = pytest.mark.skipif(not have("vllm"), reason="needs vLLM (its kernels/mhc/torch.py)")
EPS = {"rms_eps": 1e-6, "hc_pre_eps": 1e-6, "hc_sinkhorn_eps": 1e-6, "hc_post_mult_value": 2.0, "sinkhorn_repeat": 20}
H, HC = 256, 4


def _vllm_torch_ref():
    """vLLM's kernels/mhc/torch.py loaded alone (no vLLM package import)."""
    base = importlib.util.find_spec("vllm").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("_vllm_mhc_torch", os.path.join(base, ct.TORCH_REF.split(".", 1)[1]
                                                                                    .replace(".", os.sep) + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def vref():
    if not have("vllm"):
        pytest.skip("needs vLLM")
    mod = _vllm_torch_ref()
    return mod, ct.Float64Reference(mod)


def _keys() -> dict[str, dict]:
    pre = {"hidden_size": H, **EPS, "norm_eps": 1e-6, "n_splits": 3, "hc_mult": HC, "gemm_last_dim": -1}
    return {
        "mhc_pre_big_fuse_with_norm_tilelang": {**pre, "use_pre_mix_in": False, "save_pre_mix": False, "rms_numel": 0,
                                                "split_mode": "fused", "write_aux": False},
        "mhc_pre_big_fuse_broadcast_with_norm_tilelang": {**pre, "n_splits": 2},
        "mhc_post_tilelang": {"hc": HC, "hidden": H, "n_thr": 128, "h_blk": 1024},
        "mhc_fused_tilelang": {"hc": HC, "hidden": H, "n_out": 24, "n_thr": 32, "h_blk": 256, "tile_n": 2,
                               "split_k": 1},
        "hc_head_fuse_tilelang": {"hidden_size": H, "rms_eps": 1e-6, "hc_eps": 1e-6, "hc_mult": HC, "n_thr": 128,
                                  "h_blk": 1024},
    }


def _case(kernel: str, ref, t: int = 5, split_k: int | None = None, seed: int = 0) -> ct.Case:
    return ct.BUILDERS[kernel](_keys()[kernel], t, split_k, ct.Rand(seed, "cpu"), ref)


def _close(a, b, rtol: float, atol: float = 0.0) -> bool:
    return bool(((a.double() - b.double()).abs() <= atol + rtol * b.double().abs()).all())


def test_deepgemm_k_ranges_follow_its_split_rule():
    r = ct.deepgemm_k_ranges(16384, 33)  # 256 blocks of 64: 25 splits of 8 blocks, then 8 of 7
    assert [b - a for a, b in r] == [512] * 25 + [448] * 8
    assert r[0][0] == 0 and r[-1][1] == 16384 and all(r[i][1] == r[i + 1][0] for i in range(32))
    assert ct.deepgemm_k_ranges(4096, 16) == [(256 * i, 256 * (i + 1)) for i in range(16)]
    assert ct.deepgemm_k_ranges(128, 4) == [(0, 64), (64, 128), (128, 128), (128, 128)]  # empty splits write zeros


@needs_vllm
def test_float64_reference_runs_vllms_torch_formulas(vref):
    """Same code objects in float64: agree with vLLM's fp32 run to fp32 precision, bf16 outputs to one rounding."""
    mod, ref = vref
    g = torch.Generator().manual_seed(1)
    res = torch.randn(6, HC, H, generator=g).bfloat16()
    fn = torch.randn(24, HC * H, generator=g) / (HC * H) ** 0.5
    scale, base = torch.rand(3, generator=g) + 0.5, torch.randn(24, generator=g) * 0.5
    p32, c32, li_bf16 = mod.mhc_pre_torch(res, fn, scale, base, *EPS.values())
    p64, c64, y64 = ref.mhc_pre(res.double(), fn.double(), scale.double(), base.double(), *EPS.values())
    assert p64.dtype == c64.dtype == y64.dtype == torch.float64
    assert _close(p32, p64, 1e-5, 1e-6) and _close(c32, c64, 1e-5, 1e-6)
    assert _close(li_bf16, y64, 2 ** -8, 1e-6) and not torch.equal(y64, li_bf16.double())  # unrounded in float64
    comb, post = torch.rand(6, HC, HC, generator=g), torch.rand(6, HC, 1, generator=g) * 2
    x = torch.randn(6, H, generator=g).bfloat16()
    out = mod.mhc_post_torch(x, res, post, comb)
    out64 = ref.mhc_post(x.double(), res.double(), post.double(), comb.double())
    assert out.dtype == torch.bfloat16 and out64.dtype == torch.float64 and _close(out, out64, 2 ** -8, 1e-6)


def _sinkhorn(logits, repeat: int, eps: float):
    c = torch.softmax(logits, -1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def _direct_pre(case: ct.Case, key: dict, k: int, x_streams):
    """The pre kernels' body written out from their inputs (the split partials), in float64."""
    t = case.num_tokens
    n = case.named
    mixes = n["gemm_out_mul"].double().sum(0) * torch.rsqrt(n["gemm_out_sqrsum"].double().sum(0) / k + 1e-6)[:, None]
    s, b = n["hc_scale"].double(), n["hc_base"].double()
    pre = torch.sigmoid(mixes[:, :HC] * s[0] + b[:HC]) + 1e-6
    post = torch.sigmoid(mixes[:, HC:2 * HC] * s[1] + b[HC:2 * HC]) * 2.0
    comb = _sinkhorn((mixes[:, 2 * HC:] * s[2] + b[2 * HC:]).view(t, HC, HC), 20, 1e-6)
    y = (pre[:, :, None] * x_streams).sum(1)
    w = n["norm_weight"].double()
    li = y.bfloat16().double() * torch.rsqrt(y.square().mean(-1, keepdim=True) + 1e-6) * w
    return {"post_mix": post, "comb_mix": comb.reshape(t, HC * HC), "layer_input": li}


@needs_vllm
@pytest.mark.parametrize("kernel", sorted(ct.BUILDERS))
def test_case_reference_matches_the_kernel_body_written_out(vref, kernel):
    """Each case's reference (torch.py in float64 + kernel steps) against the kernel body's own formulas."""
    _, ref = vref
    key = _keys()[kernel]
    case = _case(kernel, ref, split_k=4 if kernel == "mhc_fused_tilelang" else None)
    got = case.reference()
    n = case.named
    if kernel == "mhc_pre_big_fuse_with_norm_tilelang":
        want = _direct_pre(case, key, HC * H, n["residual"].double())
    elif kernel == "mhc_pre_big_fuse_broadcast_with_norm_tilelang":
        x = n["residual"].double()
        want = _direct_pre(case, key, H, x[:, None, :].expand(-1, HC, -1))
        want["residual_out"] = x[:, None, :].expand(-1, HC, -1)
    elif kernel == "mhc_post_tilelang":
        want = {"x": torch.einsum("tij,tih->tjh", n["a"].double(), n["b"].double())
                + n["c"].double()[:, :, None] * n["d"].double()[:, None, :]}
    elif kernel == "mhc_fused_tilelang":
        new_r = torch.einsum("tij,tih->tjh", n["comb_mix"].double(), n["residual_in"].double()) \
            + n["post_mix"].double()[:, :, None] * n["x_in"].double()[:, None, :]
        w = n["weight_t"].double()
        parts = [slice(s * H // 4, (s + 1) * H // 4) for s in range(4)]
        want = {"residual_out": new_r,
                "yp_out": torch.stack([torch.einsum("tjh,njh->tn", new_r[..., p], w[..., p]) for p in parts]),
                "rp_out": torch.stack([new_r[..., p].square().sum((1, 2)) for p in parts])}
        assert _close(got["yp_out"].sum(0), new_r.reshape(5, -1) @ w.reshape(24, -1).T, 1e-12, 1e-12)
    else:
        res = n["residual"].double()
        x = res.reshape(5, -1)
        mixes = x @ n["fn"].double().T * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
        pre = torch.sigmoid(mixes * n["hc_scale"].double()[0] + n["hc_base"].double()) + 1e-6
        want = {"out": (pre[:, :, None] * res).sum(1)}
    assert set(got) == set(want) == set(case.outputs)
    for name in want:
        assert got[name].shape == case.outputs[name].t.shape
        if name == "layer_input":  # the bf16 rounding point may fall either side between the two routes
            assert _close(got[name], want[name], 2 ** -7, 1e-6), name
        else:  # the partial sums were rounded to fp32 once: ~1e-7 relative in the mixes
            assert _close(got[name], want[name], 1e-6, 1e-7), name


def _kernel_like(kernel: str, case: ct.Case, mod):
    """What an fp32 kernel returns (vLLM's fp32 torch.py plus the kernel's bf16 rounding points)."""
    n = case.named
    if kernel == "mhc_pre_big_fuse_with_norm_tilelang":
        res = n["residual"]
        post, comb, _, pre = mod.mhc_pre_delayed_torch(res, case.sources["fn"], n["hc_scale"], n["hc_base"],
                                                       *EPS.values())
        ol = (pre[:, :, None] * res.float()).sum(1)
        li = (ol.bfloat16().float() * torch.rsqrt(ol.square().mean(-1, keepdim=True) + 1e-6)
              * n["norm_weight"].float()).bfloat16()
        return {"post_mix": post.reshape(5, HC), "comb_mix": comb.reshape(5, -1), "layer_input": li}
    new_r = torch.einsum("tij,tih->tjh", n["comb_mix"], n["residual_in"].float()) \
        + n["post_mix"][:, :, None] * n["x_in"].float()[:, None, :]
    s = case.split_k
    r = new_r.reshape(5, HC, s, -1)
    w = n["weight_t"].reshape(24, HC, s, -1)
    return {"yp_out": torch.einsum("tjsh,njsh->stn", r, w), "rp_out": r.square().sum((1, 3)).T,
            "residual_out": new_r.bfloat16()}


@needs_vllm
@pytest.mark.parametrize("kernel", ["mhc_pre_big_fuse_with_norm_tilelang", "mhc_fused_tilelang"])
def test_tolerances_pass_fp32_rounding_and_fail_real_errors(vref, kernel):
    mod, ref = vref
    case = _case(kernel, ref, split_k=2 if kernel == "mhc_fused_tilelang" else None, seed=3)
    want, got = case.reference(), _kernel_like(kernel, case, mod)
    for name, tol in case.tolerances.items():
        assert ct.compare(got[name], want[name], tol)["ok"], name
        bad = got[name].contiguous().clone()
        flat = bad.view(-1)
        flat[flat.numel() // 2] += 0.03 * float(want[name].abs().max()) if bad.dtype == torch.bfloat16 \
            else 2e-4 * float(want[name].abs().max())
        assert not ct.compare(bad, want[name], tol)["ok"], f"{name}: one wrong element passed"
        flat[flat.numel() // 2] = float("nan")
        assert not ct.compare(bad, want[name], tol)["ok"], f"{name}: NaN passed"


def test_guarded_buffers_see_unwritten_and_out_of_bounds_writes():
    g = ct.Guarded((3, 4), torch.bfloat16, "cpu")
    assert g.unwritten() == 12 and g.guards_intact()
    g.t.fill_(1.0)
    assert g.unwritten() == 0 and g.guards_intact()
    g.flat[ct.GUARD + 12] = 0.0  # one element past the end
    assert not g.guards_intact()
    f = ct.Guarded((5,), torch.float32, "cpu")
    assert f.unwritten() == 5 and torch.isnan(f.t).all()


# ----------------------------------------------------------------------------------------------------------
# The launch path on this CPU box: TileLang blocked, vLLM from a carried copy, launches captured.

@pytest.fixture(scope="module")
def tl_small(tmp_path_factory):
    """A real TileLang bundle of mhc_post and mhc_fused (NOJIT_TEST_TILELANG_BUNDLE overrides), and a carried copy."""
    if not (have("vllm") and have("tilelang")):
        pytest.skip("needs vLLM and TileLang")
    import prepare_device

    d = tmp_path_factory.mktemp("tlcheck")
    bundle = os.environ.get("NOJIT_TEST_TILELANG_BUNDLE")
    if not bundle:
        bundle = str(d / "small.nojit")
        run_cli("build", "--runtime", "tilelang", "--kernels", "mhc_post_tilelang,mhc_fused_tilelang", "-o", bundle,
                "--cache-dir", str(d / "cache"), "--quiet")
    prepare_device.copy_vllm_tilelang_sources(str(d / "vllm_src"))
    return {"bundle": bundle, "src": str(d / "vllm_src"), "dir": d}


def _dry_run(tl, *extra: str, prelude: str = "") -> tuple[subprocess.CompletedProcess, dict]:
    out = tl["dir"] / "dry.json"
    argv = ["--bundle", tl["bundle"], "--vllm-src", tl["src"], "--dry-run", "--sizes", "1,7,64", "--json", str(out),
            *extra]
    code = f"import sys; sys.path.insert(0, {GPU_CHECKS!r}); import check_tilelang as ct\n" \
           f"{prelude}\nsys.exit(ct.main({argv!r}))"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=900)
    return p, (json.loads(out.read_text()) if out.exists() else {})


@pytest.mark.slow
def test_dry_run_serves_every_entry_as_planned(tl_small):
    p, report = _dry_run(tl_small)
    assert p.returncode == 0 and "RESULT: PASS" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
    assert report["enable_pdl"] is True and report["tilelang_loaded"] == [] and report["compile_attempts"] == []
    assert report["serving_processes"] == [] and report["launches"] > 0
    assert report["launches_by_c_path"] == report["launches"]  # every planned launch went through the C plan
    assert all(c.get("owner", "same") == "same" for r in report["entries"] for c in r["cases"])
    kernels = {r["kernel"] for r in report["entries"]}
    assert {"mhc_post_tilelang", "mhc_fused_tilelang"} <= kernels


@pytest.mark.slow
def test_dry_run_fails_on_a_swapped_argument(tl_small):
    """Two same-typed tensors swapped (mhc_post's residual and out): nojit's host checks pass, the plan check fails."""
    prelude = ("real = ct.build_post\n"
               "def swapped(*a):\n"
               "    c = real(*a); args = list(c.args); args[1], args[4] = args[4], args[1]; c.args = tuple(args)\n"
               "    return c\n"
               "ct.BUILDERS['mhc_post_tilelang'] = swapped")
    p, report = _dry_run(tl_small, "--kernels", "mhc_post", prelude=prelude)
    assert p.returncode == 1 and "RESULT: FAIL" in p.stdout, p.stdout[-3000:]
    assert any("launch" in e for r in report["entries"] for c in r["cases"] for e in c["errors"])


@pytest.mark.slow
def test_dry_run_refuses_a_changed_kernel_source(tl_small, tmp_path):
    """The carried copy must be vLLM's file byte for byte where it matters: an edited kernel body is refused."""
    import shutil

    src = tmp_path / "vllm_src"
    shutil.copytree(tl_small["src"], src)
    path = src / "vllm" / "model_executor" / "kernels" / "mhc" / "tilelang_kernels.py"
    text = path.read_text()
    path.write_text(text.replace("    # rename for shorter code\n", "    # renamed for shorter code\n", 1))
    p, report = _dry_run({**tl_small, "src": str(src)}, "--kernels", "mhc_post")
    # refused where the loader first meets the kernel (install or its first call), by the typed source check
    said = p.stdout + p.stderr
    assert p.returncode == 1 and "source changed" in said and "mhc_post" in said, said[-3000:]
