"""The H200 check of Humming's GEMM kernels (tests/gpu/checks/check_humming_gemm.py): its reference and its comparison on
the CPU. The reference equals a row-by-row float64 product; Humming's tolerance passes the reference itself and
fails a NaN-poisoned output, one wrong value and the output of another expert routing (the check's control). Only
the harness is under test here; the kernels are launched on the H200 by the `humming-gemm` step."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.support.common import GPU_CHECKS

torch = pytest.importorskip("torch")


def _check():
    path = os.path.join(GPU_CHECKS, "check_humming_gemm.py")
    spec = importlib.util.spec_from_file_location("check_humming_gemm_cpu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("op", ["w13", "w2"])
def test_reference_and_tolerance(op):
    c = _check()
    gen = torch.Generator().manual_seed(0)
    experts, n, k, tokens, top_k = 8, 32, 256, 3, 4
    w = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=gen)
    s = torch.randint(120, 128, (experts, n, k // 32), dtype=torch.uint8, generator=gen)
    topk = torch.rand((tokens, experts), generator=gen).argsort(dim=1)[:, :top_k]
    flat = topk.reshape(-1)
    per_token = top_k if op == "w13" else 1
    x = torch.randn((tokens if op == "w13" else tokens * top_k, k), generator=gen).to(torch.bfloat16)
    q, scale = c.quant_fp8_groups(x, 128)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (x.size(0), k // 128)
    xd = c.dequant_fp8_groups(q, scale, 128)
    assert float((xd - x.double()).abs().max()) <= float(x.double().abs().max()) / 16  # one FP8 step at most
    ref = c.reference(xd, flat, w, s, per_token)
    wd = c.dequant_mxfp4(w, s)
    brute = torch.stack([xd[r // per_token] @ wd[flat[r]].T for r in range(flat.numel())])
    assert torch.equal(ref, brute)

    out = ref.to(torch.bfloat16)
    assert c.humming_close(out, ref, stream_k=False)[0]
    poisoned = out.clone()
    poisoned[1, 2] = float("nan")
    assert not c.humming_close(poisoned, ref, stream_k=True)[0]
    off = out.clone()
    off[0, 0] += 1.0 + abs(float(off[0, 0]))
    assert not c.humming_close(off, ref, stream_k=False)[0]
    other = torch.roll(flat.view(tokens, top_k), shifts=1, dims=0).reshape(-1)
    assert not c.humming_close(out, c.reference(xd, other, w, s, per_token), stream_k=True)[0]


def test_mxfp4_decoding_and_intervals():
    c = _check()
    pair = torch.arange(16, dtype=torch.uint8).view(1, 16) | (15 << 4)  # low nibble: element 2i
    decoded = c.dequant_mxfp4(pair, torch.full((1, 1), 128, dtype=torch.uint8)).view(16, 2)
    assert decoded[:, 0].tolist() == [2 * v for v in c.E2M1] and (decoded[:, 1] == -12.0).all()
    table = [[0, 32, {}], [32, 1184, {}], [1184, 2592, {}]]
    assert [c.interval_of(table, m) for m in (1, 32, 33, 1184, 2592, 2593)] == [0, 0, 1, 1, 2, None]
