"""Keys of vLLM's model-runner kernels (V2 and V1) for the default DeepSeek-V4-Flash deployment.

One plan (`nojit build --plan-only` in a subprocess: planning only, nothing compiled), checked
against sources that do not go through nojit's planner:
- vLLM's own launch wrappers, called with tensors shaped and typed as the runner passes them
  (real CPU tensors, so every data_ptr() alignment is the real one, including the views the
  wrappers slice; meta tensors only where a real one would not fit in memory), with
  JITFunction.run recorded instead of launched. Each call is keyed by Triton's own binder.
  Every call's key is planned, and every derived kernel is reached by at least one call here.
"""

from __future__ import annotations

import importlib
import json
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

from tests.support.common import needs_vllm, run_cli

pytestmark = needs_vllm

RUNNER_FILTER = "vllm.v1.worker,vllm.v1.sample"
NOT_REACHED_WITH_K1 = ("speculator:_prepare_decode_inputs_kernel", "speculator:_update_draft_inputs_kernel")


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("runner")
    path = str(d / "runner.plan.json")
    run_cli("build", "--runtime", "triton", "--no-generic", "--kernels", RUNNER_FILTER, "-o", str(d / "x.nojit"),
            "--emit-plan", path, "--plan-only", "--quiet")
    with open(path) as f:
        return json.load(f)


def planned_keys(plan: dict[str, Any], kernel: str) -> set[str]:
    return {json.dumps(r["key"], sort_keys=True) for r in plan["requests"] if r["kernel"] == kernel}


def one(plan: dict[str, Any], suffix: str) -> str:
    ids = [k for k in plan["kernels"] if k.endswith(suffix)]
    assert len(ids) == 1, f"{suffix}: {ids}"
    return ids[0]


def key_json(fn: Any, args: tuple, kwargs: dict) -> str:
    from nojit.aot.runtimes.triton.compiler import key_for_call
    from nojit.loader.bundle.triton_key import key_to_json

    return json.dumps(key_to_json(key_for_call(fn, args, kwargs)), sort_keys=True)


def test_every_runner_kernel_is_planned_with_a_site(plan):
    for suffix in NOT_REACHED_WITH_K1:
        assert not any(k.endswith(suffix) for k in plan["kernels"])
    for kid, k in plan["kernels"].items():
        assert k["info"]["site"], kid


# ------------------------------------------------------------------ call-site parity on real tensors
META = torch.device("meta")
I32, I64, U64, F32, BF16 = torch.int32, torch.int64, torch.uint64, torch.float32, torch.bfloat16
V, R, NT, MML = 129280, 1024, 8192, 1048576  # vocab, max_num_seqs, max_num_batched_tokens, max_model_len


REAL_LIMIT = 1100 << 20  # bytes: larger buffers (max_model_len wide: 4 GiB) are meta tensors


def t(*shape: int, dtype: torch.dtype = I32) -> torch.Tensor:
    """A tensor as the runner allocates it: real (CPU, allocator-aligned; zeros, so the wrappers' own
    torch ops index validly) unless too large for this box."""
    size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    return torch.zeros(shape, dtype=dtype) if size <= REAL_LIMIT else torch.empty(shape, dtype=dtype, device=META)


class FakePool:
    """A UvaBufferPool stand-in: hands out a fresh (meta) prefix like the real one."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def copy_to_uva(self, x: Any) -> torch.Tensor:
        return t(len(x), dtype=self.dtype)


def record(fn: Any, *args: Any, **kwargs: Any) -> list[tuple[Any, tuple, dict]]:
    from nojit.aot.runtimes.triton.enumeration import recording_jit_calls

    with recording_jit_calls() as calls:
        fn(*args, **kwargs)
    return list(calls)


def runner_launches() -> list[tuple[Any, tuple, dict]]:
    """Launches of vLLM's wrappers with the runner's argument kinds (default deployment, k=1)."""
    ib = importlib.import_module("vllm.v1.worker.gpu.input_batch")
    gumbel = importlib.import_module("vllm.v1.worker.gpu.sample.gumbel")
    logprob = importlib.import_module("vllm.v1.worker.gpu.sample.logprob")
    pen = importlib.import_module("vllm.v1.worker.gpu.sample.penalties")
    minp = importlib.import_module("vllm.v1.worker.gpu.sample.min_p")
    bias = importlib.import_module("vllm.v1.worker.gpu.sample.logit_bias")
    bw = importlib.import_module("vllm.v1.worker.gpu.sample.bad_words")
    rs = importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler")
    rsu = importlib.import_module("vllm.v1.worker.gpu.spec_decode.rejection_sampler_utils")
    spec = importlib.import_module("vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator")
    bt = importlib.import_module("vllm.v1.worker.gpu.block_table")
    bu = importlib.import_module("vllm.v1.worker.gpu.buffer_utils")
    wu = importlib.import_module("vllm.v1.worker.utils")

    n, nl = 5, 9  # requests and logits rows of a verification step (odd: 'other' class)
    out = []
    # input batch (gpu/model_runner.py prepare_inputs, postprocess_sampled)
    out += record(ib.prepare_prefill_inputs, t(NT), t(1, R), t(n, dtype=I64), t(n + 1), t(R, MML), t(R), t(R))
    out += record(ib.prepare_pos_seq_lens, t(n, dtype=I64), t(n + 1), t(R), t(NT, dtype=I64), t(R))
    out += record(ib.combine_sampled_and_draft_tokens, t(NT), t(n, dtype=I64), t(R, 1, dtype=I64), t(n + 1), t(n), t(R),
                  t(R, 1, dtype=I64), t(n + 1), nl)
    out += record(ib.get_num_sampled_and_rejected, t(n), t(n), t(n + 1), t(n, dtype=I64), t(R))
    for sampled in (t(n, dtype=I64).view(-1, 1), t(n, 2, dtype=I64)):
        out += record(ib.post_update, t(n, dtype=I64), t(R), t(R, 1, dtype=I64), t(R, V), sampled, t(n), t(n),
                      t(n + 1), t(R, MML), t(R), None, t(R, 1, dtype=I64))
    out += record(ib.expand_idx_mapping, t(n, dtype=I64), nl, t(n + 1), 2)
    # sampler: raw (bf16) and processed (fp32) logits
    for logits in (t(nl, V, dtype=BF16), t(nl, V, dtype=F32)):
        out += record(gumbel.gumbel_sample, logits, t(nl, dtype=I64), t(R, dtype=F32), t(R, dtype=I64),
                      t(nl, dtype=I64), apply_temperature=False, is_drafting=False)
    lf = t(nl, V, dtype=F32)
    out += record(gumbel.apply_temperature, lf, t(nl, dtype=I64), t(R, dtype=F32))
    out += record(minp.apply_min_p, lf, t(nl, dtype=I64), t(R, dtype=F32))
    out += record(pen.apply_penalties, lf, t(nl, dtype=I64), t(nl), t(nl), t(R, dtype=F32), t(R, dtype=F32),
                  t(R, dtype=F32), t(R, (V + 31) // 32), t(R, V))
    out += record(pen.bincount, t(n, dtype=I64), t(R, MML), t(R), t(R), t(R, (V + 31) // 32), t(R, V), 3000)
    out += record(bias.apply_logit_bias, lf, t(nl, dtype=I64), t(nl, dtype=I64), t(R), t(R, 1024), t(R), t(R, 1024),
                  t(R, 1024, dtype=F32), t(R), t(R), t(R), t(R, 128), False)
    out += record(bw.apply_bad_words, lf, t(nl, dtype=I64), t(R, 1024), t(R, 129), t(R), t(R, MML), t(R), t(R),
                  t(nl), t(nl), 2)
    for num_logprobs in range(21):
        out += record(logprob.compute_topk_scores, t(nl, V, dtype=BF16), num_logprobs, t(nl, dtype=I64))
    # MTP verification (k = 1) and draft prefill
    out += record(rs.gather_draft_sampled, t(NT), t(NT, dtype=I64), t(nl, dtype=I64), t(nl, dtype=I64), t(nl), t(R))
    for logits in (t(nl, V, dtype=BF16), t(2048, V, dtype=F32)):
        rows = logits.shape[0]
        out += record(rsu.rejection_sample, logits, None, t(rows), t(n + 1), t(rows, dtype=I64), t(n, dtype=I64),
                      t(rows, dtype=I64), t(rows), t(R, dtype=F32), t(R, dtype=I64), 1)
    fake_rs = SimpleNamespace(enable_adaptive_verification=False, sampler=SimpleNamespace(logprobs_mode="raw_logprobs"))
    out += record(rs.RejectionSampler._get_logprobs_tensors, fake_rs, t(n, 2, dtype=I64), t(n), t(nl, V, dtype=BF16),
                  t(n + 1), np.arange(n + 1), 5)
    buffers = SimpleNamespace(input_ids=t(NT), positions=t(NT, dtype=I64), query_start_loc=t(R + 1), seq_lens=t(R))
    batch = SimpleNamespace(num_reqs=n, input_ids=t(NT), positions=t(NT, dtype=I64), idx_mapping=t(n, dtype=I64),
                            query_start_loc=t(n + 1), seq_lens=t(n))
    out += record(spec.prepare_prefill_inputs, t(R, dtype=I64), t(dtype=I64), buffers, batch, t(n), t(n),
                  t(R, 1, dtype=I64), t(1, R), R)
    # block tables (DeepSeek-V4: several KV cache groups, sliding-window ones among them)
    groups = 5
    tables = SimpleNamespace(
        num_kv_cache_groups=groups, has_sliding_window_groups=True, sliding_window_reach=t(groups),
        input_block_tables=[t(R, 4096)], input_block_table_ptrs=t(groups, dtype=U64), _num_dirty_rows=0,
        block_table_ptrs=t(groups, dtype=U64), block_table_strides=t(groups, dtype=I64),
        num_blocks=SimpleNamespace(gpu=t(groups, R)), block_sizes_tensor=t(groups),
        slot_mappings=t(groups, NT, dtype=I64), slot_mapping_enabled=t(groups, dtype=torch.bool),
        dcp_sharded=t(groups, dtype=torch.bool), cp_rank=0, cp_size=1, cp_interleave=1)
    out += record(bt.BlockTables.gather_block_tables, tables, t(n, dtype=I64), n, num_computed_tokens=t(R))
    out += record(bt.BlockTables.compute_slot_mappings, tables, t(n, dtype=I64), t(n + 1), t(NT, dtype=I64), 16)
    # staged writes: (gpu buffer, UVA contents?) of the runner's StagedWriteTensors
    for gpu, uva in ((t(R, MML), True), (t(R), False), (t(R, 1024, dtype=F32), False), (t(R, 129), False)):
        staged = SimpleNamespace(
            _staged_write_indices=[0], _staged_write_starts=[0], _staged_write_contents=[1], _staged_write_cu_lens=[1],
            _staged_write_max_len=1, gpu=gpu, dtype=gpu.dtype, device=META, write_indices=FakePool(I32),
            write_starts=FakePool(I32), write_cu_lens=FakePool(I32),
            write_contents=FakePool(gpu.dtype) if uva else None, clear_staged_writes=lambda: None)
        out += record(bu.StagedWriteTensor.apply_write, staged)
    writer = SimpleNamespace(group_ids=FakePool(I32), indices=FakePool(I32), starts=FakePool(I32),
                             cu_lens=FakePool(I32), device=META)
    member = SimpleNamespace(_staged_write_indices=[0], _staged_write_starts=[0], _staged_write_contents=[7],
                             _staged_write_cu_lens=[1], _staged_write_max_len=1, clear_staged_writes=lambda: None)
    out += record(bu.FusedStagedWriter.apply, writer, [member, member], t(2, dtype=U64), t(2, dtype=I64))
    zeroer = SimpleNamespace(device=META, _meta=(t(3, dtype=U64), t(3, dtype=I64), t(3, dtype=I64), 10, 1024, 3))
    out += record(wu.KVBlockZeroer.zero_block_ids, zeroer, [1, 2])
    # top-k/top-p dispatchers (registry keys), as apply_top_k_top_p_triton calls them on fp32 logits.
    # _topk_topp picks its block sizes by logits.device.type (topk_topp_triton.py:936-941): a CPU
    # tensor would take the CPU branch, so these are meta tensors (the CUDA branch).
    tk = importlib.import_module("vllm.v1.sample.ops.topk_topp_triton")

    def m(*shape: int, dtype: torch.dtype = I32) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, device=META)

    stats, parts = m(64 * 32, 4, dtype=F32), m(64, 5, 32, 8, 3, dtype=F32)
    for rows in (1, 7, 64, 65, 2 * R):
        logits = m(rows, V, dtype=F32)
        for top_k, top_p in ((m(rows), None), (m(rows), m(rows, dtype=F32)), (None, m(rows, dtype=F32))):
            # apply_top_k_top_p_triton returns through the split pipeline for p-only batches of at
            # most _SPLIT_MAX_BATCH rows (topk_topp_triton.py:1682-1687): no monolithic launch then.
            if not (top_k is None and rows <= tk._SPLIT_MAX_BATCH):
                out += record(tk._topk_topp, logits, m(min(rows, 132), V, dtype=F32), m(20, dtype=F32),
                              m(20, dtype=F32), top_k, top_p, float("-inf"), 132)
            if top_p is None or rows > 64:
                continue
            out += record(tk._topp_split_stats, logits, stats, top_k, top_p, 132)
            for step in range(5):
                out += record(tk._topp_split_step, logits, stats, parts, top_k, top_p, step, 132)
            out += record(tk._topp_split_mask, logits, stats, parts, top_k, top_p, float("-inf"), 132)
    return out


def test_vllm_call_sites_give_only_planned_keys(plan, monkeypatch):
    from nojit.aot.runtimes.triton.enumeration import kernel_id

    monkeypatch.setattr(importlib.import_module("vllm.utils.torch_utils"), "PIN_MEMORY", False)  # no driver here
    cuda = SimpleNamespace(is_cuda_alike=lambda: True)  # what the serving platform answers
    monkeypatch.setattr(importlib.import_module("vllm.v1.sample.ops.topk_topp_triton"), "current_platform", cuda)
    launches = runner_launches()
    site_keys: dict[str, set[str]] = {}
    for fn, args, kwargs in launches:
        kid = kernel_id(fn)
        assert kid in plan["kernels"], f"{kid} is launched by the runner but not planned"
        key = key_json(fn, args, kwargs)
        assert key in planned_keys(plan, kid), f"{kid}: call-site key not planned"
        site_keys.setdefault(kid, set()).add(key)
    derived = {k for k, v in plan["kernels"].items() if "owner" not in v["info"]}
    assert derived <= set(site_keys), f"rows without a call-site check: {sorted(derived - set(site_keys))}"


def test_multi_step_draft_kernels_match_call_sites(monkeypatch):
    """With k > 1 speculative tokens the MTP drafter also runs its decode steps."""
    import dataclasses

    from nojit.aot.deployment import load_deployment
    from nojit.aot.models.deepseek_v4 import TRITON
    from nojit.aot.runtimes.triton.enumeration import kernel_id

    d = dataclasses.replace(load_deployment(), num_speculative_tokens=2)
    rows = {r.kernel: r for r in TRITON.derived if r.kernel.endswith(NOT_REACHED_WITH_K1)}
    spec = importlib.import_module("vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator")
    n, width = 5, 4096 * 4  # hidden_size * hc_mult: the drafter's hidden-state buffers
    buffers = SimpleNamespace(input_ids=t(NT), positions=t(NT, dtype=I64), query_start_loc=t(R + 1), seq_lens=t(R))
    draft_tokens = t(R, 2, dtype=I64)
    launches = record(spec.prepare_decode_inputs, draft_tokens[:n, 0], t(n), t(n), buffers, t(R, dtype=I64), MML, R)
    launches += record(spec.update_draft_inputs, t(n, dtype=I64), t(dtype=I64), t(NT, width, dtype=BF16), draft_tokens,
                       t(NT, width, dtype=BF16), buffers, t(R, dtype=I64), n, MML, 2)
    assert sorted(kernel_id(fn) for fn, _, _ in launches) == sorted(rows)
    for fn, args, kwargs in launches:
        row = rows[kernel_id(fn)]
        assert key_json(fn, args, kwargs) in {key_json(fn, (), c) for c in row.calls(d)}, row.kernel
