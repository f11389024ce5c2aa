"""FlashInfer's JIT modules on the CPU box: the deployment's modules enumerated with FlashInfer's own gen
functions, one built with FlashInfer's AOT builder (nvcc + ninja), and served through FlashInfer's own AOT
lookup with strict mode's firewall on: no process started (audit hook, and strace when installed), no
compile entry point reached; a module the bundle lacks is refused (strict) or recorded (record).

The build compiles FlashInfer's `sampling` module, the smallest of the four (about 5.5 minutes on the 2-core
build box, cold), and the six TensorRT-LLM DeepGEMM kernels of fp8_blockscale_gemm_90 (about 2 minutes).
The work directory and the compile cache are nojit's defaults, so a rerun compiles nothing (every entry a cache hit).
NOJIT_FLASHINFER_TEST_BUNDLE names a bundle built before (`nojit build --runtime flashinfer`) to use instead.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have, needs_vllm, run_cli

pytestmark = [needs_vllm, pytest.mark.skipif(not have("flashinfer"), reason="FlashInfer is not installed")]

MODULES = {
    "fp8_blockscale_gemm_90": "flashinfer.jit.gemm.fp8_blockscale:gen_fp8_blockscale_gemm_sm90_module",
    "trtllm_mnnvl_comm": "flashinfer.jit.comm:gen_trtllm_mnnvl_comm_module",
    "trtllm_comm": "flashinfer.jit.comm:gen_trtllm_comm_module",
    "sampling": "flashinfer.jit.sampling:gen_sampling_module",
}
TRTLLM = "flashinfer.gemm.gemm_base:fp8_blockscale_gemm_sm90"
MISSING = "flashinfer.jit.comm:gen_vllm_comm_module"  # a real FlashInfer module no bundle here holds
PROBE = os.path.join(ROOT, "tests", "probes", "probe_flashinfer.py")


def test_default_deployment_reaches_four_modules(tmp_path):
    """The plan names FlashInfer's gen functions and keys each by the module name FlashInfer itself gives, plus
    one TensorRT-LLM DeepGEMM kernel per (N, K) of the block-FP8 linears (the same linears as DeepGEMM's)."""
    plan = tmp_path / "plan.json"
    run_cli("build", "--runtime", "flashinfer", "--plan-only", "--emit-plan", str(plan), "-o", str(tmp_path / "x"))
    p = json.loads(plan.read_text())
    modules = {r["key"]: r["kernel"] for r in p["requests"] if isinstance(r["key"], str)}
    assert modules == MODULES
    shapes = sorted((r["key"]["n"], r["key"]["k"]) for r in p["requests"] if r["kernel"] == TRTLLM)
    assert shapes == [(384, 4096), (1024, 4096), (4096, 512), (4096, 2048), (4096, 4096), (8192, 1024)]
    assert all(k["runtime"] == "flashinfer" and len(k["source_hash"]) == 64 for k in p["kernels"].values())
    assert {k["info"]["switch"] for k in p["kernels"].values()} == {
        "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_USE_FLASHINFER_SAMPLER"}


def test_qwen_linears_get_one_kernel_per_tile_config(tmp_path):
    """FlashInfer's heuristic gives Qwen3.5's in_proj_qkvz (12288, 2048) and qkv_proj (9216, 2048) three tile configs
    over M < 32 (the build once refused them: one entry per (N, K)); the plan holds one request per config, the
    configs' M ranges cover 1..31 once for every (N, K), and DeepSeek-V4's test above keeps one per (N, K)."""
    plan = tmp_path / "plan.json"
    run_cli("build", "--deployment", os.path.join(ROOT, "aot", "data", "qwen3.5-35b-a3b-fp8-h200.toml"), "--runtime",
            "flashinfer", "--plan-only", "--emit-plan", str(plan), "-o", str(tmp_path / "x"), "--quiet")
    keys = [r["key"] for r in json.loads(plan.read_text())["requests"] if r["kernel"] == TRTLLM]
    by: dict[tuple[int, int], list[dict]] = {}
    for key in keys:
        by.setdefault((key["n"], key["k"]), []).append(key)
    assert {nk: len(v) for nk, v in by.items()} == {(1024, 2048): 1, (2048, 512): 1, (2048, 4096): 1,
                                                     (9216, 2048): 3, (12288, 2048): 3}
    for nk, configs in by.items():
        covered = sorted(m for c in configs for m in range(c["m"][0], c["m"][1] + 1))
        assert covered == list(range(1, 32)), (nk, configs)
    assert sorted(c["block_n"] for c in by[(12288, 2048)]) == [16, 24, 32]


@pytest.fixture(scope="module")
def fi_bundle(tmp_path_factory):
    given = os.environ.get("NOJIT_FLASHINFER_TEST_BUNDLE")
    if given:
        return given
    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        pytest.skip("no nvcc: FlashInfer's builder needs the CUDA toolkit")
    out = str(tmp_path_factory.mktemp("fi") / "fi.nojit")
    run_cli("build", "--runtime", "flashinfer", "--kernels", "gen_sampling_module,gemm_base:fp8_blockscale", "-o", out,
            "--emit-plan", out + ".plan.json", "--quiet", "-j", "1")
    return out


def _libcuda_stand_in(bundle_path: str, folder) -> str | None:
    """This box has no driver: a libcuda.so.1 defining the driver functions the bundled modules import (never
    called here: nothing launches), so that the dynamic loader can load fp8_blockscale_gemm_90.so, which needs it."""
    from nojit.loader.bundle.file import Bundle

    if shutil.which("cc") is None or shutil.which("nm") is None:
        return None
    bundle = Bundle.open(bundle_path)
    symbols: set[str] = set()
    for e in bundle.manifest.entries:
        if bundle.manifest.kernels[e.kernel].runtime == "flashinfer" and e.launch.kind == "module":
            so = folder / f"{e.launch.module}.so"
            so.write_bytes(bundle.read_blob(e.blob))
            out = subprocess.run(["nm", "-D", "--undefined-only", str(so)], capture_output=True, text=True).stdout
            names = [line.split()[-1] for line in out.splitlines() if line.strip()]
            symbols |= {n for n in names if n[:2] == "cu" and n[2:3].isupper()}
            so.unlink()
    src = folder / "libcuda.c"
    src.write_text("".join(f"int {name}(void) {{ return 999; }}\n" for name in sorted(symbols)))
    subprocess.run(["cc", "-shared", "-o", str(folder / "libcuda.so.1"), str(src), "-Wl,-soname,libcuda.so.1"],
                   check=True)
    return str(folder)


def _probe(bundle: str, tmp_path, mode: str, extra_env: dict | None = None) -> tuple[dict, list[str] | None]:
    out = tmp_path / "probe.json"
    libcuda = _libcuda_stand_in(bundle, tmp_path)
    env = {**os.environ, "NOJIT_MODE": mode, "NOJIT_FLASHINFER_DIR": str(tmp_path / "seed"),
           "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "home"), "TRTLLM_DG_CACHE_DIR": str(tmp_path / "trtllm"),
           "NOJIT_EVENT_LOG": str(tmp_path / "events.jsonl"), **(extra_env or {})}
    if libcuda:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [libcuda, env.get("LD_LIBRARY_PATH")]))
    env.pop("FLASHINFER_CUDA_ARCH_LIST", None)
    env["FLASHINFER_CUDA_ARCH_LIST"] = "9.0a"  # the GPU FlashInfer would see on the serving machine
    cmd = [sys.executable, PROBE, bundle, str(out), MISSING]
    trace = tmp_path / "execve.trace"
    traced = shutil.which("strace") is not None
    if traced:
        cmd = ["strace", "-f", "-qq", "-e", "trace=execve,execveat", "-o", str(trace), *cmd]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    if traced and "ptrace" in done.stderr and not out.exists():
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0 and out.exists(), done.stderr[-4000:]
    execs = [line for line in trace.read_text().splitlines() if "execve" in line] if traced else None
    return json.loads(out.read_text()), execs


def test_strict_serving_uses_flashinfers_own_loader(fi_bundle, tmp_path):
    result, execs = _probe(fi_bundle, tmp_path, "strict")
    root = result["root"]
    assert result["modules"], "the bundle serves no FlashInfer module"
    assert [p for p in result["providers"] if p[0] == "nojit"] == [
        ["nojit", root, ["sm90a"], sorted(result["modules"])]]
    for name, m in result["modules"].items():
        assert m["library"] == os.path.join(root, name, f"{name}.so"), m  # FlashInfer's get_aot_artifacts chose it
        assert m["is_aot"] and m["loaded"] == "Module"
        assert m["compiles"] == {"JitSpecNvcc.build": 0, "run_ninja": 0, "build_jit_specs": 0}, (name, m)
    if "sampling" in result["modules"]:
        assert result["get_sampling_module"]  # vLLM's own FlashInfer entry point got the bundled module
    # the module the bundle lacks: refused by nojit where FlashInfer would build it, before ninja or nvcc
    missing = result["missing"]
    assert missing["raised"] == "KernelNotInBundleError", missing
    assert "vllm_comm" in missing["message"] and "aot/runtimes/flashinfer/modules.py" in missing["message"]
    assert result["compiles"]["run_ninja"] == 0 and result["compiles"]["build_jit_specs"] == 0
    assert result["compiles"]["JitSpecNvcc.build"] == 1  # the refused attempt
    assert result["builds_seen_by_nojit"] == ["vllm_comm"]
    for name in result["trtllm"]:  # seeded where TensorRT-LLM DeepGEMM looks (its own lookup: the test below)
        assert result["trtllm_cache_dir"] == os.path.join(root, "tensorrt_llm")
        assert os.path.isfile(os.path.join(root, "tensorrt_llm", "cache", name, "nvcc_kernel.cubin"))
    # `import torch` (2.14) imports cuda.pathfinder, which asks ctypes.util.find_library("dl"), which runs
    # `ldconfig -p`: every process that imports torch does it, nojit or not. Nothing else starts, in any phase.
    others = [s for s in result["started"] if not ("ldconfig" in s[1] and "cuda/pathfinder" in s[1])]
    assert others == [], others
    programs: list[str] = []
    if execs is not None:
        programs = [line.split('execve("', 1)[1].split('"', 1)[0] for line in execs if 'execve("' in line]
        assert [p for p in programs if "ldconfig" not in p] == [programs[0]], programs  # the probe itself (+ ldconfig)
    print(f"\nFlashInfer strict: {len(result['modules'])} modules loaded from {root}; compiles "
          f"{result['compiles']}; processes started: {[s[1].split(' from ')[0] for s in result['started']]}; "
          f"execve: {programs if execs is not None else 'no strace'}")


def test_record_mode_records_a_missing_module(fi_bundle, tmp_path):
    record = tmp_path / "keys.jsonl"
    # FlashInfer then builds it: with no toolkit (CUDA_HOME points nowhere) its ninja fails at once
    result, _ = _probe(fi_bundle, tmp_path, "record", {"NOJIT_RECORD_FILE": str(record),
                                                       "CUDA_HOME": str(tmp_path / "no-cuda"),
                                                       "FLASHINFER_NVCC": str(tmp_path / "no-cuda" / "nvcc")})
    assert result["missing"]["raised"] != "KernelNotInBundleError"
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert {"kernel": "flashinfer.jit:vllm_comm", "runtime": "flashinfer", "key": "vllm_comm", "outcome": "miss",
            "source_hash": ""} in lines


def test_seeded_module_is_checked_against_the_bundle(fi_bundle, tmp_path):
    from nojit.loader.runtimes.flashinfer import serving as flashinfer_serving
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.errors import BundleCorruptError, BundleMismatchError
    from nojit.loader.policy import ServingPolicy
    from nojit.loader.settings import Mode

    bundle = Bundle.open(fi_bundle)
    entries = {e.launch.module: e for e in bundle.manifest.entries if bundle.manifest.kernels[e.kernel].runtime
               == "flashinfer"}
    root = flashinfer_serving.seed(bundle, entries, base=str(tmp_path))
    assert flashinfer_serving.seed(bundle, entries, base=str(tmp_path)) == root  # idempotent
    name = sorted(n for n, e in entries.items() if e.launch.kind == "module")[0]
    path = os.path.join(root, name, f"{name}.so")
    assert oct(os.stat(path).st_mode & 0o777) == "0o444"
    os.chmod(os.path.dirname(path), 0o755)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.write(b"\x7fELF-not-the-bundles")
    with pytest.raises(BundleCorruptError, match="sha256 differs"):
        flashinfer_serving.seed(bundle, entries, base=str(tmp_path))
    ids = sorted({e.kernel for e in entries.values()})
    policy = ServingPolicy(Mode.STRICT, fi_bundle)
    real = flashinfer_serving.installed_version
    try:
        flashinfer_serving.installed_version = lambda: "0.0.1"
        with pytest.raises(BundleMismatchError, match="FlashInfer 0.7"):
            flashinfer_serving.install(bundle, ids, policy)
    finally:
        flashinfer_serving.installed_version = real


def test_trtllm_deepgemm_finds_the_seeded_cubins_without_nvcc(fi_bundle, tmp_path):
    """TensorRT-LLM DeepGEMM's own lookup (its Compiler::build, FlashInfer's copy, run by the build's driver)
    finds every bundled kernel in the seeded cache: the nvcc it would run is a script that leaves a mark."""
    from nojit.aot.runtimes.flashinfer import trtllm
    from nojit.aot.runtimes.flashinfer.compiler import build_root, pip_cuda_dir
    from nojit.loader.runtimes.flashinfer import serving as flashinfer_serving
    from nojit.loader.bundle.file import Bundle
    from importlib.metadata import version

    bundle = Bundle.open(fi_bundle)
    entries = {e.launch.module: e for e in bundle.manifest.entries
               if bundle.manifest.kernels[e.kernel].runtime == "flashinfer"}
    cubins = {n: e for n, e in entries.items() if e.launch.kind == "trtllm_deepgemm"}
    if not cubins:
        pytest.skip("the bundle holds no TensorRT-LLM DeepGEMM kernels")
    root = flashinfer_serving.seed(bundle, entries, base=str(tmp_path / "seed"))
    pip_cuda = pip_cuda_dir()
    exe = trtllm.driver(build_root(os.path.expanduser("~/.cache/nojit"), "sm90a"), pip_cuda,
                        trtllm.headers_digest(version("flashinfer-python")))
    mark = tmp_path / "nvcc-ran"
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho \"$@\" >> {mark}\nexit 1\n")
    nvcc.chmod(0o755)
    env = trtllm.driver_env(exe, pip_cuda, TRTLLM_DG_CACHE_DIR=os.path.join(root, "tensorrt_llm"),
                            TRTLLM_DG_NVCC_COMPILER=str(nvcc))
    for name, e in sorted(cubins.items()):
        n, k = e.key["n"], e.key["k"]
        lines = subprocess.run([exe, "configs", trtllm.jit_include_dir(), "132", str(n), str(k)], env=env,
                               capture_output=True, text=True, check=True).stdout.splitlines()
        lo, hi = e.key["m"]
        for m in range(lo, hi + 1):  # FlashInfer's heuristic gives every M of the key the key's tile config
            bm, bn, st, mc = lines[m - 1].split()[1:5]
            assert [int(bm), int(bn), int(st), int(mc)] == [e.key[f] for f in ("block_m", "block_n", "stages",
                                                                                  "multicast")], (e.key, m)
            done = subprocess.run([exe, "build", trtllm.jit_include_dir(), str(n), str(k), bm, bn, st, mc], env=env,
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr[-2000:]
        assert f"gemm_swapAB_{n}_{k}_" in name
    assert not mark.exists(), mark.read_text()
    print(f"\nTensorRT-LLM DeepGEMM: {len(cubins)} kernels found in {root}/tensorrt_llm/cache, nvcc never ran")


def test_a_rebuild_from_the_cache_runs_no_compile_and_writes_the_same_bytes(fi_bundle, monkeypatch):
    """The compile cache (aot/compile_cache.py) for FlashInfer: the fixture's plan (the sampling module and six
    TensorRT-LLM DeepGEMM cubins) again, from the default cache the fixture's build stored into: no compile
    task (no ninja, no driver), the same bytes; another nvcc release or FlashInfer version is a miss."""
    from tests.aot.test_compile_cache import _NoCompiles

    from nojit.aot.build import BuildOptions, build
    from nojit.aot.compile_cache import CompileCache
    from nojit.aot.plan import Plan
    from nojit.aot.runtimes.flashinfer import planner

    plan_path = fi_bundle + ".plan.json"
    if not os.path.exists(plan_path):
        pytest.skip("NOJIT_FLASHINFER_TEST_BUNDLE was built elsewhere: no plan and cache of its build here")
    again = fi_bundle + ".again.nojit"
    cache_dir = BuildOptions(output=again).cache_dir  # the fixture's build used the default
    build(BuildOptions(output=again, plan_in=plan_path, cache_dir=cache_dir, executor=_NoCompiles(), progress=False))
    assert open(again, "rb").read() == open(fi_bundle, "rb").read()

    plan = Plan.read(plan_path)
    cache = CompileCache(os.path.join(cache_dir, "compiled"))
    requests = [(r, plan.kernels[r.kernel]) for r in plan.requests]
    assert len(requests) == 7 and {k.info.get("kind", "module") for _, k in requests} == {"module", "trtllm_deepgemm"}
    inputs = [planner.cache_inputs(r, k) for r, k in requests]
    assert len({json.dumps(i, sort_keys=True) for i in inputs}) == len(requests)

    def misses() -> list[bool]:
        return [isinstance(cache.lookup(planner.RUNTIME, r, k), dict) for r, k in requests]

    assert misses() == [False] * 7
    real_toolchain, real_version = planner._toolchain(), planner.package_version
    monkeypatch.setattr(planner, "_toolchain", lambda: dict(real_toolchain, nvcc="Cuda compilation tools, release 13.1"))
    assert misses() == [True] * 7
    monkeypatch.setattr(planner, "_toolchain", lambda: real_toolchain)
    monkeypatch.setattr(planner, "package_version", lambda name: "0.0.0" if name == "flashinfer-python" else
                        real_version(name))
    assert misses() == [True] * 7
