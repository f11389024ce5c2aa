"""Humming as a runtime of the build and served from the bundle (CPU, no GPU).

The build enumerates the kernels DeepSeek-V4-Flash's MXFP4 experts reach with Humming's own selection
(aot/runtimes/humming/enumerate.py) and compiles them with Humming's own NVRTC path. Serving seeds Humming's
cache under the key this process's Humming computes (loader/runtimes/humming/serving.py); with strict mode's firewall on,
Humming's own kernel creation finds every bundled kernel: no process (audit hook, and `strace -f` where
installed), no arrival at Humming's compile step (counted). A configuration the bundle lacks is refused by name.

The module's bundle holds the input-processing and weight-transform kernels only (5 + 2 of the default
deployment's 63; about 2 minutes on 2 cores with vLLM's import and the enumeration); NOJIT_TEST_HUMMING_BUNDLE names a full bundle to check instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have

pytestmark = pytest.mark.skipif(not (have("humming") and have("vllm")), reason="needs humming-kernels and vLLM")


@pytest.fixture(scope="module")
def humming_bundle(tmp_path_factory):
    given = os.environ.get("NOJIT_TEST_HUMMING_BUNDLE")
    if given:
        return given
    out = tmp_path_factory.mktemp("humming")
    path = str(out / "humming.nojit")
    p = subprocess.run([sys.executable, "-m", "nojit.aot.cli", "build", "--runtime", "humming", "--kernels",
                        "ProcessInputKernel,ProcessMxfp4W4A8Kernel,RepackWeightKernel", "-j", "2", "-o", path, "--cache-dir", str(out / "cache"), "--quiet",
                        "--emit-plan", path + ".plan.json"],
                       capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return path


def _probe(tmp_path, bundle, mode, trace, order="early"):
    env = {**os.environ, "NOJIT_MODE": mode, "NOJIT_HUMMING_DIR": str(tmp_path / "humming"), "NOJIT_QUIET": "1",
           "NOJIT_RECORD_FILE": str(tmp_path / "keys.jsonl"), "CUDA_VISIBLE_DEVICES": ""}
    cmd = [sys.executable, os.path.join(ROOT, "tests", "probes", "probe_humming_serving.py"), bundle, mode, order]
    strace = shutil.which("strace") if trace else None
    if strace:
        cmd = [strace, "-f", "-qq", "-e", "trace=execve,vfork,clone3", "-o", str(tmp_path / "trace")] + cmd
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr[-4000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    execs = None
    if strace:
        with open(tmp_path / "trace") as f:
            execs = [line for line in f if "execve(" in line]
    return out, execs


@pytest.mark.parametrize("order", ["early", "late"])  # Humming imported before install, or after (a vLLM worker)
def test_every_bundled_humming_kernel_is_found_without_process_or_compile(tmp_path, humming_bundle, order):
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(humming_bundle)
    entries = [e for k in b.kernel_ids() if b.index.kernels[k].runtime == "humming" for e in b.entries(k)]
    assert entries, "the bundle holds no Humming entries"
    out, execs = _probe(tmp_path, humming_bundle, "strict", trace=True, order=order)
    assert out["seeded_at_install"] == (len(entries) if order == "early" else 0)  # late: seeded as Humming loads
    print("per op:", out["served_per_op"], "seed s:", out["seed_s"], "load s:", out["load_s"])
    assert sum(out["served_per_op"].values()) == len(entries) == out["seeded"]
    # the forward's kernels register with Humming's launcher; the weight transform's launch themselves
    assert out["registered"] == len([e for e in entries if not e.origin.startswith("moe:transform:")])
    assert out["cubin_not_bundled"] == []  # each kernel object got the bundled cubin from Humming's own lookup
    assert out["compiles"] == []  # Humming's compile step (the NVRTC child) was never reached
    assert out["compile_step_guarded"]  # and strict mode's guard sat behind the counter
    assert out["processes"] == []  # Humming's own lookups of every bundled kernel: no process
    # seeding (at install, or as Humming's runtime loads): no process either; importing Humming's cuda-bindings
    # runs ctypes' `ldconfig -p` (cuda/pathfinder), a library lookup, not a compiler
    seeding = out["processes_at_install"] + out["processes_importing_humming"]
    assert all("ldconfig" in p for p in seeding), seeding
    if execs is not None:  # strace -f over the whole probe: the python itself, and importing Humming's
        # cuda-bindings runs ctypes' `ldconfig -p` (cuda/pathfinder); no compiler, no nvcc probe, no NVRTC child
        programs = [line.split('execve("', 1)[1].split('"', 1)[0] for line in execs]
        assert programs[0].endswith(("python", "python3")) or "python" in programs[0], programs
        assert all(p.endswith("ldconfig") for p in programs[1:]), programs
    # the check can fail: a configuration the bundle lacks is refused by name, before Humming compiles it
    short = out["miss_kernel"].rpartition(":")[2]
    assert f"has no entry for key {short}" in out["miss"] and "nojit build --add-keys" in out["miss"], out["miss"]
    assert any(shape in out["miss"] for shape in ("N=1024 K=4096", "N=4096 K=512", "hidden=4096", "hidden=512"))
    assert out["compiles_after_miss"] == []


def test_record_mode_records_a_humming_miss(tmp_path, humming_bundle):
    out, _ = _probe(tmp_path, humming_bundle, "record", trace=False)
    assert out["compiles"] == [] and out["processes"] == []  # bundled kernels: hits in record mode too
    lines = [json.loads(x) for x in open(tmp_path / "keys.jsonl")]
    misses = [x for x in lines if x.get("outcome") == "miss"]
    assert len(misses) == 1 and misses[0]["kernel"] == out["miss_kernel"] == misses[0]["key"]["class"], misses
    assert misses[0]["source_hash"]  # so that `nojit build --add-keys` accepts it
    assert out["compiles_after_miss"] == ["NVRTCCompiler"]  # then Humming went on to compile it (the JIT)


def test_device_check_reads_the_launch_geometry_from_the_cubins(tmp_path, humming_bundle):
    """tests/gpu/checks/check_humming.py (the H200 step) takes block and grid from each cubin's own constants."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpu", "checks", "check_humming.py"), "--bundle",
                        humming_bundle, "--list-only", "--json", str(tmp_path / "list.json")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.load(open(tmp_path / "list.json"))["loaded"]
    inputs = [r for r in rows if r["kernel"] == "ProcessInputKernel"]
    assert inputs and all(r["NUM_THREADS"] in (32, 64, 128, 256, 512, 1024) and r["COLUMNS_PER_TASK"] > 0
                          and r["INPUT_ROW_SIZE"] in (4096, 1024) for r in inputs), inputs


def test_vllm_calls_into_humming_find_every_kernel(tmp_path, humming_bundle):
    """The calls a vLLM worker makes at the first forward, with vLLM's own tuning tables: HummingKernel.prepare_kernels
    for w13 and w2 and ProcessInputKernel.prepare_kernels for the w2 input. Needs a bundle with the GEMM kernels
    (NOJIT_TEST_HUMMING_BUNDLE, e.g. `nojit build --runtime humming`): in strict mode a missing kernel raises."""
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(humming_bundle)
    if not any(k.endswith(":HummingKernel") for k in b.kernel_ids()):
        pytest.skip("the module's bundle holds the input kernels only; set NOJIT_TEST_HUMMING_BUNDLE to a full one")
    out, _ = _probe(tmp_path, humming_bundle, "strict", trace=False, order="vllm")
    print("tuning intervals per op:", out["intervals_per_op"], "kernels:", out["registered"], "s:", out["load_s"])
    assert set(out["intervals_per_op"]) == {"w13", "w2", "input:w2"}
    assert out["registered"] == len({e.blob for k in b.kernel_ids() for e in b.entries(k)
                                     if not e.origin.startswith("moe:transform:")})  # the forward's kernels
    assert out["compiles"] == [] and out["processes"] == []


@pytest.mark.parametrize("mode", ["strict", "record"])
def test_vllm_weight_transform_finds_its_kernels_directly_constructed(tmp_path, humming_bundle, mode):
    """vLLM's MXFP4 weight loading runs Humming's weight transform (prepare_and_transform_humming_tensors), whose ops
    construct ProcessMxfp4W4A8Kernel and RepackWeightKernel directly, not through compile_many. With the bundle
    installed: both found for w13 and w2 with no compile and no process; a transform kernel the bundle lacks is
    refused by name in strict mode and recorded in record mode."""
    # processes counted by the audit hook from the first transform on (importing vLLM's modules runs `uname`/`file`)
    out, _ = _probe(tmp_path, humming_bundle, mode, trace=False, order="transform")
    print("launches per op:", out["launches_per_op"], out["launched"], "s:", out["load_s"])
    assert out["launches_per_op"] == {"transform:w13": 2, "transform:w2": 2}
    assert out["launched"] == {"ProcessMxfp4W4A8Kernel": 2, "RepackWeightKernel": 2}  # the bundle's cubins
    assert out["hits"] == 2  # two distinct keys, each served once
    assert out["compiles"] == [] and out["processes"] == []
    if mode == "strict":
        assert "has no entry for key RepackWeightKernel" in out["miss"] and "nojit build --add-keys" in out["miss"], \
            out["miss"]
        assert '"use_fused_e8m0_scale": false' in out["miss"]
        assert out["compiles_after_miss"] == []
    else:
        lines = [json.loads(x) for x in open(tmp_path / "keys.jsonl")]
        misses = [x for x in lines if x.get("outcome") == "miss"]
        assert len(misses) == 1 and misses[0]["key"]["class"] == out["miss_kernel"], misses
        assert misses[0]["key"]["args"]["use_fused_e8m0_scale"] is False and misses[0]["source_hash"]
        assert out["compiles_after_miss"] == ["NVRTCCompiler"]  # then Humming went on to compile it (the JIT)


def test_a_rebuild_from_the_cache_starts_no_worker_and_writes_the_same_bytes(humming_bundle, monkeypatch):
    """The compile cache (aot/compile_cache.py) for Humming: the fixture's plan again with its cache starts no
    compile task (no worker, no Humming) and writes the same bytes; another Humming version or NVRTC misses."""
    from tests.aot.test_compile_cache import _NoCompiles

    from nojit.aot.build import BuildOptions, build
    from nojit.aot.compile_cache import CompileCache
    from nojit.aot.plan import Plan
    from nojit.aot.runtimes.humming import planner

    plan_path = humming_bundle + ".plan.json"
    if not os.path.exists(plan_path):
        pytest.skip("NOJIT_TEST_HUMMING_BUNDLE was built elsewhere: no plan and cache of its build here")
    cache_dir = os.path.join(os.path.dirname(humming_bundle), "cache")
    again = humming_bundle + ".again.nojit"
    build(BuildOptions(output=again, plan_in=plan_path, cache_dir=cache_dir, executor=_NoCompiles(), progress=False))
    assert open(again, "rb").read() == open(humming_bundle, "rb").read()

    plan = Plan.read(plan_path)
    cache = CompileCache(os.path.join(cache_dir, "compiled"))
    requests = [(r, plan.kernels[r.kernel]) for r in plan.requests]
    assert len(requests) == 7  # 5 input kernels + the 2 weight-transform kernels

    def misses() -> list[bool]:
        return [isinstance(cache.lookup(planner.RUNTIME, r, k), dict) for r, k in requests]

    assert misses() == [False] * len(requests)
    real = planner._cache_tools("NVIDIA H200", 132)
    for change in ({"humming_version": "0.0.0"}, {"nvrtc": "nvrtc+0.0"}, {"headers_digest": "0" * 64}):
        monkeypatch.setattr(planner, "_cache_tools", lambda *_a, change=change: dict(real, **change))
        assert misses() == [True] * len(requests), change
