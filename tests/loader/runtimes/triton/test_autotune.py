"""Autotuned Triton kernels served with no JIT, on real vLLM FLA kernels (`chunk_local_cumsum`'s scalar and vector
kernels: `triton.heuristics` over `triton.autotune` over `triton.jit`), with the dry launcher.

The bundle is built from a plan that Triton's own Autotuner.run made on the stand-in GPU (tests/probes/probe_autotune_plan.py):
each tuning key with every config left after Triton's pruning. Serving goes through FLA's public function, Triton's
Heuristics and Autotuner: mode (a) lets Triton's autotuner benchmark the bundled cubins (its benchmarker answered
by nojit's driver; a stand-in benchmarker here, since nothing runs on a CPU); mode (b) serves `nojit tune`'s winners
with no benchmark at all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from tests.support.common import ROOT, needs_vllm, run_cli
from nojit.loader.errors import BundleCorruptError, KernelNotInBundleError
from nojit.loader.install import install

CUMSUM = "vllm.third_party.flash_linear_attention.ops.cumsum"
SCALAR = f"{CUMSUM}:chunk_local_cumsum_scalar_kernel"
VECTOR = f"{CUMSUM}:chunk_local_cumsum_vector_kernel"


@pytest.fixture(scope="module")
def fla_bundle(tmp_path_factory):
    d = tmp_path_factory.mktemp("autotune")
    plan, bundle = str(d / "fla.plan.json"), str(d / "fla.nojit")
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "probes", "probe_autotune_plan.py"), plan], check=True,
                   capture_output=True)
    run_cli("build", "--from-plan", plan, "--runtime", "triton", "-o", bundle, "--no-generic",
            "--cache-dir", str(d / "cache"), "--quiet")
    return {"plan": plan, "bundle": bundle, "dir": d}


class Bench:
    """Counts the benchmark calls Triton's autotuner makes (through nojit's driver's `get_benchmarker`)."""

    calls = 0


@pytest.fixture
def served(fla_bundle, monkeypatch):
    """Install a bundle strict with the dry launcher and the stand-in benchmarker in Triton's place."""
    from tests.support.dry_launcher import install_dry_run
    import triton.testing

    bench = Bench()

    def timed(kernel_call, quantiles=None, **_):
        """Triton's `do_bench` on a CPU box: one launch of the config, and num_warps=4 is the fastest."""
        before = len(dry.launches)
        bench.calls += 1
        kernel_call()
        launched = dry.launches[before:]
        return [1.0 if launched and launched[0]["block"][0] == 4 * 32 else 2.0] * 3

    monkeypatch.setattr(triton.testing, "do_bench", timed)
    from nojit.loader.launch import cuda_launch, torch_cuda

    monkeypatch.setattr(cuda_launch, "_launcher", cuda_launch._launcher)  # the dry launcher is undone after the test
    dry = install_dry_run()

    monkeypatch.setattr(torch_cuda, "device_capability", lambda device: (9, 0))  # the loader's arch check: an H200
    insts = []

    def _install(path=None, mode="strict", **kw):
        inst = install(path or fla_bundle["bundle"], mode=mode, **kw)
        insts.append(inst)
        return inst

    _forget_benchmarkers()
    yield _install, dry, bench
    for inst in insts:
        inst.uninstall()
    _forget_benchmarkers()


def _forget_benchmarkers() -> None:
    """Triton's Autotuner keeps the benchmarker it first asked the driver for (`do_bench` is a cached_property,
    triton/runtime/autotuner.py): an FLA Autotuner that benchmarked under an earlier test kept that test's stand-in,
    and a later module's (test_autotune_fla_prefill.py) counted 0 calls. Each test starts with none cached."""
    from triton.runtime.autotuner import Autotuner

    for module in list(sys.modules.values()):
        if not getattr(module, "__name__", "").startswith("vllm.third_party.flash_linear_attention.ops"):
            continue
        for obj in list(vars(module).values()):
            while obj is not None and not isinstance(obj, Autotuner) and hasattr(obj, "fn"):
                obj = obj.fn
            if isinstance(obj, Autotuner):
                obj.__dict__.pop("do_bench", None)


def cumsum():
    """FLA's cumsum module. FLA's utils ask the device's name at import when Triton's active driver says CUDA, as
    nojit's stand-in Triton driver does once an earlier test of this process installed it (the build's probe, too,
    imports FLA under a CUDA driver); the stand-in H200 answers, as the build's platform does, since this box has
    no driver to."""
    import importlib

    import torch

    name = "vllm.third_party.flash_linear_attention.ops.cumsum"
    if name in sys.modules:
        return sys.modules[name]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
        mp.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
        return importlib.import_module(name)


def _autotuner(kernel):
    from nojit.loader.runtimes.triton.autotune import find_autotuner

    return find_autotuner(kernel)


@needs_vllm
def test_the_manifest_maps_each_tuning_key_to_tritons_pruned_configs(fla_bundle):
    from nojit.loader.bundle.file import Bundle

    index = Bundle.open(fla_bundle["bundle"]).index
    scalar, vector = index.kernels[SCALAR].autotune, index.kernels[VECTOR].autotune
    assert len(scalar.configs) == len(_autotuner(cumsum().chunk_local_cumsum_scalar_kernel).configs) == 4
    assert len(vector.configs) == len(_autotuner(cumsum().chunk_local_cumsum_vector_kernel).configs) == 6
    # Triton's own key: the key arguments' values, then str(dtype) of each tensor argument
    assert {k.values for k in scalar.keys} == {(1, 4, 64, False, False, "torch.float32", "torch.float32"),
                                               (1, 8, 64, False, False, "torch.bfloat16", "torch.float32")}
    assert all(k.configs == (0, 1, 2, 3) and k.winner is None for k in scalar.keys)
    assert [k.values for k in vector.keys] == [(1, 4, 32, 64, False, False, "torch.float32", "torch.float32")]
    # every config of every key is an exact entry of the inner kernel: 4 + 4 + 6
    assert index.sections[SCALAR].entries == 8 and index.sections[VECTOR].entries == 6


@needs_vllm
def test_mode_a_tritons_autotuner_benchmarks_bundled_cubins_only(served):
    from nojit.loader.strict import guards

    _install, dry, bench = served
    inst = _install()
    before = len(guards.compile_attempts)
    g = torch.zeros(1, 128, 4, dtype=torch.float32)
    cumsum().chunk_local_cumsum(g, 64)
    assert bench.calls == 4 and len(dry.launches) == 5  # each config benchmarked once, then the winner
    assert {launch["block"][0] for launch in dry.launches[:4]} == {32, 64, 128, 256}  # 1, 2, 4, 8 warps
    assert dry.launches[4]["block"][0] == 128  # the winner the benchmarker timed fastest: 4 warps
    cumsum().chunk_local_cumsum(g, 64)  # the same key again: Triton's cache, no benchmark
    cumsum().chunk_local_cumsum(torch.zeros(1, 128, 4, 32, dtype=torch.float32), 64)  # vector kernel: 6 configs
    assert bench.calls == 4 + 6 and len(dry.launches) == 5 + 1 + 7
    assert guards.compile_attempts[before:] == []
    from triton.runtime import driver

    from nojit.loader.runtimes.triton.driver import TorchAnsweredDriver

    # the benchmarker came from nojit's driver, and Triton's own driver (a gcc build of cuda_utils) was never made
    assert isinstance(driver.active, TorchAnsweredDriver) and not driver.active.real_driver_created
    assert inst.policy.summary() == {"autotune-benchmark": 3}
    assert inst.policy.summary().get("miss") is None
    assert inst.state("triton").autotuned[SCALAR].cache.mode_of[
        (1, 4, 64, False, False, "torch.float32", "torch.float32")] == "autotune-benchmark"


@needs_vllm
def test_an_unbundled_tuning_key_is_refused_in_strict_mode_before_any_benchmark(served):
    _install, dry, bench = served
    _install()
    with pytest.raises(KernelNotInBundleError) as info:
        cumsum().chunk_local_cumsum(torch.zeros(1, 128, 16, dtype=torch.float32), 64)  # H=16: not built
    assert SCALAR in str(info.value) and "(1, 16, 64, False, False, 'torch.float32', 'torch.float32')" in str(info.value)
    assert "fix:" in str(info.value) and bench.calls == 0 and dry.launches == []


@needs_vllm
def test_permissive_lets_triton_tune_an_unbundled_key_and_counts_it(served, caplog):
    _install, dry, bench = served
    inst = _install(mode="permissive")
    kernel = cumsum().chunk_local_cumsum_scalar_kernel
    seen = []
    from triton.runtime.jit import JITFunction

    jit = inst.servers("triton")[SCALAR]
    original = jit._jit_run
    jit._jit_run = lambda fn, *a, **kw: seen.append(kw.get("num_warps"))  # the JIT, not run on a CPU box
    try:
        cumsum().chunk_local_cumsum(torch.zeros(1, 128, 16, dtype=torch.float32), 64)
    finally:
        jit._jit_run = original
    assert isinstance(jit.fn, JITFunction) and kernel is not None
    assert inst.policy.summary() == {"miss": 6, "autotune-unbundled": 1}  # the tuning key, then 4 configs + winner
    assert "not in" in caplog.text


@needs_vllm
def test_mode_b_tune_records_winners_and_the_loader_serves_them_with_no_benchmark(served, fla_bundle, tmp_path):
    from nojit.aot.tune import tune
    from nojit.loader.bundle.file import Bundle

    _install, dry, bench = served
    tuned = str(tmp_path / "fla.tuned.nojit")
    result = tune(fla_bundle["bundle"], tuned, device="cpu", benchmarker=_bench_fastest_four(dry))
    assert {k: len(v) for k, v in result.winners.items()} == {SCALAR: 2, VECTOR: 1} and not result.skipped
    index = Bundle.open(tuned).index
    for kid in (SCALAR, VECTOR):
        configs = index.kernels[kid].autotune.configs
        assert all(configs[k.winner]["num_warps"] == 4 for k in index.kernels[kid].autotune.keys)
    from nojit.aot.report import summary

    assert f"{SCALAR}: 4 configs, 2 tuning keys, 2 with a winner" in summary(Bundle.open(tuned))  # nojit inspect
    original = Bundle.open(fla_bundle["bundle"]).manifest
    assert [e.blob for e in Bundle.open(tuned).manifest.entries] == [e.blob for e in original.entries]
    dry.launches.clear()
    inst = _install(tuned)
    cumsum().chunk_local_cumsum(torch.zeros(1, 128, 4, dtype=torch.float32), 64)
    cumsum().chunk_local_cumsum(torch.zeros(1, 128, 8, dtype=torch.bfloat16), 64)
    cumsum().chunk_local_cumsum(torch.zeros(1, 128, 4, 32, dtype=torch.float32), 64)
    assert bench.calls == 0  # no benchmark at all: the cache was pre-filled
    assert [launch["block"][0] for launch in dry.launches] == [128, 128, 128]  # one launch each, the winner
    assert inst.policy.summary() == {"autotune-winner": 3}
    assert "3 with the bundle's winner, 0 benchmarked" in inst.state("triton").startup_note()


def _bench_fastest_four(dry):
    def bench(kernel_call, quantiles=None, **_):
        before = len(dry.launches)
        kernel_call()
        return [1.0 if dry.launches[before]["block"][0] == 128 else 3.0] * 3
    return bench


@needs_vllm
def test_a_tampered_winner_is_refused_at_open(fla_bundle, tmp_path):
    from nojit.aot.bundle_writer import write_bundle
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.bundle.manifest import KernelRecord

    m = Bundle.open(fla_bundle["bundle"]).manifest
    b = Bundle.open(fla_bundle["bundle"])
    for winner, why in ((7, "is not among that key's configs"), ("0", "is not among"), (None, None)):
        kernels = []
        for rec in m.kernels.values():
            info = json.loads(json.dumps(rec.info))
            if rec.id == VECTOR:
                info["autotune"]["keys"][0]["winner"] = winner
                if winner is None:  # a config index past the table (the configs list changed)
                    info["autotune"]["keys"][0]["configs"].append(6)
            kernels.append(KernelRecord(rec.id, rec.runtime, rec.source_hash, rec.params, info))
        path = str(tmp_path / f"bad-{winner}.nojit")
        write_bundle(path, m.producer, m.target, m.deployment, kernels, m.entries,
                     {e.blob: b.read_blob(e.blob) for e in m.entries})
        with pytest.raises(BundleCorruptError) as info:
            Bundle.open(path)
        assert "info.autotune.keys[0]" in str(info.value) and (why is None or why in str(info.value))
        assert "fix:" in str(info.value)


@needs_vllm
def test_record_mode_writes_which_mode_served_each_tuning_key(served, fla_bundle, tmp_path):
    _install, dry, bench = served
    record = tmp_path / "keys.jsonl"
    _install(mode="record", record_file=str(record))
    cumsum().chunk_local_cumsum(torch.zeros(1, 128, 4, dtype=torch.float32), 64)
    cumsum().chunk_local_cumsum(torch.zeros(1, 128, 4, dtype=torch.float32), 64)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    tuning = [r for r in lines if isinstance(r["key"], dict) and "tuning_key" in r["key"]]
    assert [(r["kernel"], r["outcome"]) for r in tuning] == [(SCALAR, "autotune-benchmark")]  # once per key and mode
    assert tuning[0]["key"]["tuning_key"][:3] == [["int", 1], ["int", 4], ["int", 64]]
    assert sum(r["outcome"] == "exact" for r in lines) == 4  # the four configs' entries (the winner's among them)
    from nojit.aot.build import add_recorded_keys
    from nojit.aot.plan import Plan

    assert add_recorded_keys(Plan.read(fla_bundle["plan"]), [str(record)]) == 0  # tuning-key lines: nothing to compile


@needs_vllm
def test_configs_other_than_the_live_autotuners_are_refused_at_install(fla_bundle, tmp_path):
    """FLA picks some configs from the GPU at import (cumsum.py BS_LIST from check_shared_mem): a bundle whose configs
    are not this process's is refused, naming the config, instead of missing every launch."""
    from nojit.aot.bundle_writer import write_bundle
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.bundle.manifest import KernelRecord
    from nojit.loader.errors import BundleMismatchError

    b = Bundle.open(fla_bundle["bundle"])
    m = b.manifest
    kernels = []
    for rec in m.kernels.values():
        info = json.loads(json.dumps(rec.info))
        if rec.id == VECTOR:
            info["autotune"]["configs"][0]["BS"] = ["int", 128]  # as if built where BS_LIST differs
        kernels.append(KernelRecord(rec.id, rec.runtime, rec.source_hash, rec.params, info))
    path = str(tmp_path / "other-configs.nojit")
    write_bundle(path, m.producer, m.target, m.deployment, kernels, m.entries,
                 {e.blob: b.read_blob(e.blob) for e in m.entries})
    autotuner = _autotuner(cumsum().chunk_local_cumsum_vector_kernel)
    cache = autotuner.cache
    with pytest.raises(BundleMismatchError) as info:
        install(path, mode="strict")
    assert VECTOR in str(info.value) and "'BS': 128" in str(info.value) and "fix:" in str(info.value)
    assert autotuner.cache is cache  # nothing left installed
    assert cumsum().chunk_local_cumsum_scalar_kernel.fn.fn.__dict__.get("run") is None
