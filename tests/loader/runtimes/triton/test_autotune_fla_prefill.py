"""One autotuned kernel of Qwen3.5's Triton GDN prefill (`--gdn-prefill-backend triton`) built from the built-in
deployment and served with no JIT: FLA's `chunk_local_cumsum_scalar_kernel` (4 configs, one tuning key), compiled
with `nojit build --kernels`, called through FLA's public function as vLLM's chunk path calls it (g [1, T, 32]
fp32, varlen with vLLM's chunk metadata), strict mode, the dry launcher. Mode (a): Triton's autotuner benchmarks
the bundled cubins; mode (b): `nojit tune`'s winner pre-fills its cache, no benchmark. The fixtures are
test_autotune.py's (the stand-in benchmarker times 4 warps fastest)."""

from __future__ import annotations

import pytest
import torch

from tests.loader.runtimes.triton.test_autotune import _bench_fastest_four, cumsum, served  # noqa: F401
from tests.support.common import needs_vllm, run_cli

TRITON = "builtin:qwen3.5-35b-a3b-fp8-h200-gdn-triton.toml"
SCALAR = "vllm.third_party.flash_linear_attention.ops.cumsum:chunk_local_cumsum_scalar_kernel"
QWEN_KEY = (1, 32, 64, True, False, "torch.float32", "torch.float32", "torch.int32", "torch.int32")


@pytest.fixture(scope="module")
def fla_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen-fla")
    plan, bundle = str(d / "qwen-fla.plan.json"), str(d / "qwen-fla.nojit")
    run_cli("build", "--deployment", TRITON, "--runtime", "triton", "--kernels", "chunk_local_cumsum_scalar_kernel",
            "-o", bundle, "--emit-plan", plan, "--no-generic", "--cache-dir", str(d / "cache"), "--quiet")
    return {"plan": plan, "bundle": bundle, "dir": d}


def _prefill_cumsum(monkeypatch) -> None:
    """Two sequences of 100 and 200 tokens, chunk metadata as vLLM's builder makes it (no pinned memory here)."""
    import vllm.utils.torch_utils as torch_utils

    monkeypatch.setattr(torch_utils, "PIN_MEMORY", False)
    from vllm.third_party.flash_linear_attention.ops.index import prepare_chunk_indices

    cu = torch.tensor([0, 100, 300], dtype=torch.int32)
    cumsum().chunk_local_cumsum(torch.zeros(1, 300, 32, dtype=torch.float32), 64, cu_seqlens=cu,
                                chunk_indices=prepare_chunk_indices(cu, 64))


@needs_vllm
def test_the_bundle_holds_the_qwen_tuning_key_with_its_four_configs(fla_bundle):
    from nojit.loader.bundle.file import Bundle

    index = Bundle.open(fla_bundle["bundle"]).index
    at = index.kernels[SCALAR].autotune
    assert [k.values for k in at.keys] == [QWEN_KEY] and len(at.configs) == 4
    assert index.sections[SCALAR].entries == 4 and set(index.kernels) == {SCALAR}


@needs_vllm
def test_mode_a_benchmarks_the_bundled_cubins_with_no_compile(served, monkeypatch):  # noqa: F811
    from nojit.loader.strict import guards

    _install, dry, bench = served
    inst = _install()
    before = len(guards.compile_attempts)
    _prefill_cumsum(monkeypatch)
    assert bench.calls == 4 and len(dry.launches) == 5 and dry.launches[4]["block"][0] == 128
    assert guards.compile_attempts[before:] == []
    assert inst.policy.summary() == {"autotune-benchmark": 1}
    assert inst.state("triton").autotuned[SCALAR].cache.mode_of[QWEN_KEY] == "autotune-benchmark"


@needs_vllm
def test_mode_b_serves_tunes_winner_with_no_benchmark(served, fla_bundle, tmp_path, monkeypatch):  # noqa: F811
    from nojit.aot.tune import tune
    from nojit.loader.strict import guards

    _install, dry, bench = served
    tuned = str(tmp_path / "qwen-fla.tuned.nojit")
    result = tune(fla_bundle["bundle"], tuned, device="cpu", benchmarker=_bench_fastest_four(dry))
    assert {k: len(v) for k, v in result.winners.items()} == {SCALAR: 1} and not result.skipped
    dry.launches.clear()
    inst = _install(tuned)
    before = len(guards.compile_attempts)
    _prefill_cumsum(monkeypatch)
    assert bench.calls == 0 and [launch["block"][0] for launch in dry.launches] == [128]
    assert inst.policy.summary() == {"autotune-winner": 1} and guards.compile_attempts[before:] == []
