"""The H200 check's MQA-logits cases (tests/gpu/checks/check_deepgemm.py) on the CPU, with DeepGEMM replaced by its own
test formula: the harness passes an exact implementation and fails a wrong one (one logit off), so a PASS on the
device means the kernel matched. Only the harness is under test here; the kernels are checked on the H200."""

from __future__ import annotations

import os
import sys
import types

import pytest

from tests.support.common import GPU_CHECKS

torch = pytest.importorskip("torch")


def _harness(monkeypatch):
    path = os.path.join(GPU_CHECKS, "check_deepgemm.py")
    source = open(path).read().replace('"cuda"', '"cpu"')
    module = types.ModuleType("check_deepgemm_cpu")
    exec(compile(source, path, "exec"), module.__dict__)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    module._device_ms = lambda torch, fn, iters: (fn(), 0.0)[1]
    numeric = types.ModuleType("deep_gemm.testing.numeric")
    numeric.calc_diff = lambda x, y: 1 - 2 * (x.double() * y.double()).sum() / (x.double() ** 2 + y.double() ** 2).sum()
    for name, mod in (("deep_gemm", types.ModuleType("deep_gemm")), ("deep_gemm.testing", types.ModuleType("t")),
                      ("deep_gemm.testing.numeric", numeric)):
        monkeypatch.setitem(sys.modules, name, mod)
    return module


class FormulaDeepGemm:
    """DeepGEMM's MQA logits ops by their documented semantics (vllm/utils/deep_gemm.py), on the CPU."""

    def __init__(self, harness, wrong: bool = False) -> None:
        self.h, self.wrong = harness, wrong

    def fp8_fp4_mqa_logits(self, q, kv, weights, ks, ke, max_k):
        full = self.h._logits_ref(torch, q[0].float(), kv[0].float() * kv[1][:, None], weights)
        out = torch.empty(q[0].shape[0], max_k)
        for i in range(out.shape[0]):
            out[i, :int(ke[i] - ks[i])] = full[i, int(ks[i]):int(ke[i])]
        out[0, 0] += 0.01 * float(full.abs().max()) if self.wrong else 0.0
        return out

    def get_paged_mqa_logits_metadata(self, context_lens, block_kv, slots):
        return torch.zeros(slots + 1, 2, dtype=torch.int32)

    def fp8_fp4_paged_mqa_logits(self, q, kv_cache, weights, context_lens, table, schedule, max_context):
        total, block_kv, _, width = kv_cache.shape
        dim, s0 = width - 4, kv_cache.stride(0)
        values = torch.as_strided(kv_cache, (total, block_kv * dim), (s0, 1)).contiguous()
        scales = torch.as_strided(kv_cache, (total, block_kv * 4), (s0, 1), kv_cache.storage_offset() + block_kv * dim)
        k = (values.view(torch.float8_e4m3fn).float().view(total, block_kv, dim)
             * scales.contiguous().view(torch.float32).view(total, block_kv, 1))
        batch, next_n = context_lens.shape
        out, peak = torch.empty(batch * next_n, max_context), 0.0
        for b in range(batch):
            n = int(context_lens[b].max())
            kb = k[table[b, :-(-n // block_kv)].long()].reshape(-1, dim)[:n]
            rows = self.h._logits_ref(torch, q[0][b].float(), kb, weights[b * next_n:(b + 1) * next_n])
            out[b * next_n:(b + 1) * next_n, :n], peak = rows, max(peak, float(rows.abs().max()))
        out[-1, 0] += 0.01 * peak if self.wrong else 0.0  # one logit off by 1% of the largest
        return out


@pytest.mark.parametrize("wrong", [False, True])
def test_logits_cases_pass_an_exact_kernel_and_fail_a_wrong_one(monkeypatch, wrong) -> None:
    from nojit.aot.deployment import load_deployment
    from nojit.aot.runtimes.deepgemm.shapes import indexer_shapes, op_row

    h = _harness(monkeypatch)
    dg = FormulaDeepGemm(h, wrong)
    seen = set()
    for op, shapes in indexer_shapes(load_deployment()).items():
        for shape in shapes:
            row = op_row(op, shape, [5], 132)
            if "max_context_len" in row:
                row["max_context_len"] = 30000  # the deployment's 262144 columns: memory the CPU box need not spend
            case = h._mqa_logits_case if op == "fp8_fp4_mqa_logits" else h._paged_mqa_logits_case
            result = case(dg, torch, row, 5, 0, True, 1)
            assert result["ok"] is (not wrong), (op, result)
            assert not wrong or result["max_err_rel"] > 5e-3
            seen.add(op)
    assert seen == {"fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata"}


QWEN_SHAPES = ["linear_attn.in_proj_qkvz", "linear_attn.out_proj", "self_attn.qkv_proj", "self_attn.o_proj", "mlp"]


def test_prepare_tool_takes_the_entries_the_qwen_plan_has_at_those_m(tmp_path) -> None:
    """tools/prepare_deepgemm_device.py --deployment <Qwen3.5>: its shapes are the model's (not DeepSeek-V4's), its names
    select by their first words, and the entries it compiles for --ms are the ones `nojit build --plan-only` plans for
    those M (max_num_batched_tokens cut to 600 so the plan enumerates in seconds)."""
    import json

    from nojit.aot.deployment import load_deployment
    from tests.support.common import ROOT, need_deepgemm_toolkit, run_cli

    need_deepgemm_toolkit()
    text = open(os.path.join(ROOT, "aot", "data", "qwen3.5-35b-a3b-fp8-h200.toml")).read()
    assert "max_num_batched_tokens = 8192" in text
    toml = tmp_path / "qwen.toml"
    toml.write_text(text.replace("max_num_batched_tokens = 8192", "max_num_batched_tokens = 600"))
    run_cli("build", "--deployment", str(toml), "--runtime", "deepgemm", "--plan-only", "--emit-plan",
            str(tmp_path / "plan.json"), "--quiet")
    calls = [(c, r["key"]) for r in json.load(open(tmp_path / "plan.json"))["requests"] for c in r["extra"]["calls"]]
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from prepare_deepgemm_device import choose, select_shapes

    d, ms = load_deployment(str(toml)), [32, 33, 64, 100, 513, 600]
    shapes, chosen, only = choose(d, QWEN_SHAPES, ms, str(tmp_path / "work"))
    names = {c[0] for c, _ in calls}
    assert list(shapes) == ["fp8_gemm_nt"] and chosen == names and len(names) == 6
    assert only == {key for c, key in calls if any(c[3] <= m <= c[4] for m in ms)}
    assert len(only) < len({key for _, key in calls})  # those M reach fewer entries than the plan holds
    assert {n.split(" ")[1] for n in select_shapes(sorted(names), ["mlp"])} == {"gate_up_proj", "down_proj"}
    assert len(select_shapes(sorted(names), ["mlp down_proj", "self_attn.o_proj"])) == 2
    with pytest.raises(SystemExit, match="(?s)attention.wq_b: no such DeepGEMM shape.*linear_attn.in_proj_qkvz"):
        select_shapes(sorted(names), ["attention.wq_b"])  # DeepSeek-V4's default names fail loudly here
