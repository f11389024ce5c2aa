"""CuTeDSL on the CPU box: vLLM's registered CuTeDSL keys planned, compiled with cute.compile for sm_90a,
exported with export_to_c, and found again by vLLM's own `_get_or_compile` in a strict-mode process
(firewall on) that compiles nothing and starts no process (strace: no process created by the serving
process between the probe's markers; audit hook: none; strict guards: no compile attempt)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have, run_cli

pytestmark = pytest.mark.skipif(not (have("vllm") and have("cutlass")), reason="needs vLLM and nvidia-cutlass-dsl")

# One key each of two owners (a registry owner and the router GEMM) keeps the compile short; the plan test
# covers every key of the deployment.
KERNELS = "_SPARSE_ATTN_COMPRESS_C128_BLOCK8_KERNEL,ll_bf16_gemm_c1_pdl_kernel"
EXPECTED_PLAN = {  # vLLM 0.33.0's get_warmup_keys for the default deployment (DeepSeek-V4-Flash, block 256, fp8)
    "_SPARSE_ATTN_COMPRESS_NORM_ROPE_STORE_C4_KERNEL": 1,
    "_SPARSE_ATTN_COMPRESS_C128_BLOCK8_KERNEL": 1,
    "_SPARSE_ATTN_NORM_ROPE_STORE_KERNEL": 1,
    "_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL": 3,
    "_INDEXER_Q_FP8_KERNEL": 2,
    "ll_bf16_gemm_kernel": 7,  # router warmup, M 1..16: 4 dot-product M, 3 split-K configs (sm_90 tuned table)
    "ll_bf16_gemm_c1_pdl_kernel": 1,  # M == 1 at run time
}


@pytest.fixture(scope="module")
def cute_build(tmp_path_factory):
    d = tmp_path_factory.mktemp("cute")
    bundle, plan = str(d / "cute.nojit"), str(d / "cute.plan.json")
    run_cli("build", "--runtime", "cutedsl", "--kernels", KERNELS, "-o", bundle, "--emit-plan", plan,
            "--cache-dir", str(d / "cache"), "-j", "2", "--quiet")
    return {"bundle": bundle, "plan": plan, "dir": d}


def test_plan_has_every_registered_key():
    """The default deployment's CuTeDSL keys, as vLLM's own get_warmup_keys expand its registrations."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        plan = os.path.join(d, "plan.json")
        run_cli("build", "--runtime", "cutedsl", "--emit-plan", plan, "--plan-only", "--quiet")
        with open(plan) as f:
            p = json.load(f)
    counts: dict[str, int] = {}
    for r in p["requests"]:
        counts[r["kernel"].partition(":")[2]] = counts.get(r["kernel"].partition(":")[2], 0) + 1
        kind = "warmup" if r["kernel"].endswith(":ll_bf16_gemm_kernel") else (
            "derived" if r["kernel"].endswith("_c1_pdl_kernel") else "registry")
        assert r["key"][0] == "key" and r["origin"] == f"{kind}:{r['kernel']}"
    assert counts == EXPECTED_PLAN
    store = next(r for r in p["requests"] if r["kernel"].endswith("_SPARSE_ATTN_NORM_ROPE_STORE_KERNEL"))
    assert dict(store["key"][2])["kv_block_stride"] == ["int", 961344]  # the packed KV block (config.py)


def test_bundle_entries(cute_build):
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.bundle.manifest import CuteLaunch

    b = Bundle.open(cute_build["bundle"])
    try:
        cute = [e for e in b.manifest.entries if b.manifest.kernels[e.kernel].runtime == "cutedsl"]
        assert len(cute) == 2
        for e in cute:
            assert isinstance(e.launch, CuteLaunch) and e.launch.options == "--enable-tvm-ffi"
            obj = b.read_blob(e.blob)  # sha256-checked
            assert obj[:4] == b"\x7fELF" and b"sm_90a" in obj  # a relocatable object with the sm_90a cubin inside
        for kid in {e.kernel for e in cute}:
            info = b.manifest.kernels[kid].info
            assert info["nvidia-cutlass-dsl"] and info["apache-tvm-ffi"]
    finally:
        b.close()


def _probe(bundle: str, marker: str, strace_out: str | None) -> dict:
    cmd = [sys.executable, os.path.join(ROOT, "tests", "probes", "probe_cutedsl_loader.py"), bundle, marker]
    if strace_out:
        cmd = ["strace", "-f", "-e", "trace=execve,fork,vfork,clone,clone3,access,faccessat,faccessat2", "-o",
               strace_out, *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "NOJIT_QUIET": "1"})
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _processes_started_between_markers(trace: str, marker: str) -> list[str]:
    """Processes the probe's own process created between its markers (threads excluded)."""
    with open(trace) as f:
        lines = f.read().splitlines()
    main = lines[0].split()[0]
    started, on = [], False
    for line in lines:
        if f"{marker}-BEGIN" in line:
            on = True
        elif f"{marker}-END" in line:
            on = False
        elif on and line.startswith(main + " ") and any(s in line for s in ("fork(", "clone(", "clone3(", "execve(")):
            if "CLONE_THREAD" not in line and "resumed" not in line:
                started.append(line[:200])
    return started


def test_strict_load_path_finds_every_key_without_compiling_or_processes(cute_build, tmp_path):
    marker = str(tmp_path / "marker")
    trace = str(tmp_path / "strace.txt") if shutil.which("strace") else None
    out = _probe(cute_build["bundle"], marker, trace)
    assert out["entries"] == 2
    for rows in out["kernels"].values():
        for _key, executor_type, cached in rows:
            assert executor_type == "tvm_ffi.core.Function" and cached
    assert out["compile_attempts"] == [] and out["cute_compile_guarded"]
    assert out["processes"] == []
    assert out["firewall"]
    assert out["missing"]["raised"] == "KernelNotInBundleError"
    assert "CuTeDSL key not bundled" in out["missing"]["message"] and "--add-keys" in out["missing"]["fix"]
    if trace:
        assert _processes_started_between_markers(trace, marker) == []


def test_source_change_is_refused(cute_build, tmp_path):
    """A bundle whose CuTeDSL kernel source differs from the installed vLLM's is refused at install."""
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(cute_build["bundle"])
    kid = next(k for k, r in b.manifest.kernels.items() if r.runtime == "cutedsl" and "C128_BLOCK8" in k)
    b.close()
    code = (
        "import sys; from nojit.loader.install import install\n"
        "from nojit.loader.errors import BundleMismatchError\n"
        "import nojit.loader.runtimes.cutedsl.serving as s\n"
        "s.source_hash_of_files = lambda files: '0' * 64\n"
        f"try:\n    install({cute_build['bundle']!r}, mode='permissive', kernels={{{kid!r}}})\n"
        "except BundleMismatchError as e:\n    print('REFUSED', e.message)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "NOJIT_QUIET": "1"})
    assert "REFUSED" in p.stdout and "source changed" in p.stdout, p.stderr[-2000:]


def test_device_check_finds_the_embedded_cubins(cute_build):
    """tests/gpu/checks/check_cutedsl.py's CPU half: every exported object embeds an sm_90a cubin with its kernel."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpu", "checks", "check_cutedsl.py"), "--bundle",
                        cute_build["bundle"], "--list-only"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr[-2000:]
    assert "2 CuTeDSL entries, 2 kernels, listed; 0 failed" in p.stdout


RECORD = """
import os, sys, json
os.environ["CUTE_DSL_ARCH"] = "sm_90a"  # record mode lets vLLM compile the miss; on this CPU box, for sm_90a
from nojit.aot.deployment import load_deployment
from nojit.aot.vllm_env import import_kernel_module, install_deployment_platform
install_deployment_platform(load_deployment().platform)
mod = import_kernel_module("vllm.model_executor.kernels.linear.cute_dsl.ll_bf16")
import_kernel_module("vllm.models.deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl")  # the bundle's other owner
import vllm.utils.torch_utils as tu
tu.current_stream = lambda: type("S", (), {"cuda_stream": 0})()  # no GPU: a placeholder stream for cute.compile
from nojit.loader.install import install
inst = install(sys.argv[1], mode="record", record_file=sys.argv[2])
owner = mod.ll_bf16_gemm_c1_pdl_kernel
key = owner.dispatch(M=2, K=4096, N=256)  # the bundle holds M == 1 only
owner.compile(key)
print(json.dumps({"cached": (key.M, key.K, key.bs, key.output_dtype) in owner._compiled_cache}))
"""


def test_record_then_add_keys_serves_the_miss(cute_build, tmp_path):
    """Record mode: a key the bundle lacks is compiled by vLLM and written down; `nojit build --add-keys` adds it;
    the new bundle serves it in strict mode with no compile."""
    keys = tmp_path / "keys.jsonl"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NOJIT_QUIET": "1"}
    p = subprocess.run([sys.executable, "-c", RECORD, cute_build["bundle"], str(keys)], capture_output=True, text=True,
                       timeout=900, env=env)
    assert p.returncode == 0 and json.loads(p.stdout.strip().splitlines()[-1])["cached"], p.stderr[-3000:]
    recorded = [json.loads(line) for line in keys.read_text().splitlines()]
    assert [r["outcome"] for r in recorded] == ["miss"] and recorded[0]["runtime"] == "cutedsl"
    assert dict(recorded[0]["key"][2])["M"] == ["int", 2]
    bundle = str(tmp_path / "added.nojit")
    run_cli("build", "--runtime", "cutedsl", "--kernels", "ll_bf16_gemm_c1_pdl_kernel", "--add-keys", str(keys),
            "-o", bundle, "--cache-dir", str(tmp_path / "cache"), "-j", "2", "--quiet")
    out = _probe(bundle, str(tmp_path / "marker"), None)
    assert out["entries"] == 2 and out["compile_attempts"] == [] and out["processes"] == []


def test_a_rebuild_from_the_cache_compiles_nothing_and_writes_the_same_bytes(cute_build, tmp_path):
    """The compile cache (aot/compile_cache.py): the same plan again with the first build's cache starts no
    compile and writes the same bytes; another CuTeDSL version is a miss for every key."""
    from tests.aot.test_compile_cache import _NoCompiles

    from nojit.aot.build import BuildOptions, build
    from nojit.aot.compile_cache import CompileCache
    from nojit.aot.plan import Plan
    from nojit.aot.runtimes.cutedsl import planner

    cache_dir = str(cute_build["dir"] / "cache")
    out = str(tmp_path / "again.nojit")
    build(BuildOptions(output=out, plan_in=cute_build["plan"], cache_dir=cache_dir, executor=_NoCompiles(),
                       progress=False))
    assert open(out, "rb").read() == open(cute_build["bundle"], "rb").read()
    plan = Plan.read(cute_build["plan"])
    cache = CompileCache(os.path.join(cache_dir, "compiled"))
    requests = [(r, plan.kernels[r.kernel]) for r in plan.requests]
    assert len(requests) == 2 and all(not isinstance(cache.lookup(planner.RUNTIME, r, k), dict) for r, k in requests)
    real = planner.tool_versions
    try:
        planner.tool_versions = lambda: dict(real(), **{"nvidia-cutlass-dsl": "0.0.0"})
        assert all(isinstance(cache.lookup(planner.RUNTIME, r, k), dict) for r, k in requests)
    finally:
        planner.tool_versions = real


def test_device_launch_prep_layout_and_link_here(cute_build, tmp_path):
    """tools/prepare_cutedsl_device.py's `.device-cu` (tvm-ffi wheel left out: no network in CI): the bundle's
    CuTeDSL entries with their digests, CuTeDSL's C runtime as .xz that unpacks to the installed library's bytes,
    the vLLM reference files with their digests; then tests/gpu/checks/check_cutedsl_launch.py's preparation phase here
    (no GPU, nothing called): every object read through nojit's reader, linked with this box's g++ against the
    unpacked runtime and libtvm_ffi, and loaded with tvm_ffi.load_module; a damaged runtime is refused."""
    import hashlib
    import importlib.util
    import lzma

    if shutil.which("g++") is None or not have("tvm_ffi"):
        pytest.skip("needs g++ and apache-tvm-ffi")
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from prepare_cutedsl_device import RUNTIME_LIB, cutedsl_libdir, folder_size, prepare

    out = tmp_path / "cu"
    m = prepare(cute_build["bundle"], str(out), wheel=False)
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(cute_build["bundle"])
    want = {(e.kernel, e.launch.symbol, e.blob) for e in b.manifest.entries}
    assert {(e["kernel"], e["symbol"], e["blob"]) for e in m["bundle"]["entries"]} == want and len(want) == 2
    assert open(out / "cutedsl.nojit", "rb").read() == open(cute_build["bundle"], "rb").read()
    packed = (out / m["runtime"]["file"]).read_bytes()
    assert hashlib.sha256(packed).hexdigest() == m["runtime"]["xz_sha256"]
    raw = lzma.decompress(packed)
    with open(os.path.join(cutedsl_libdir(), RUNTIME_LIB), "rb") as f:
        assert raw == f.read() and hashlib.sha256(raw).hexdigest() == m["runtime"]["sha256"]
    sources = json.loads((out / "vllm_src" / "SOURCES.json").read_text())["files"]
    assert "models/deepseek_v4/common/ops/fused_compress_quant_cache.py" in sources
    for rel, digest in sources.items():
        assert hashlib.sha256((out / "vllm_src" / "vllm" / rel).read_bytes()).hexdigest() == digest
        installed = os.path.join(os.path.dirname(importlib.util.find_spec("vllm").origin), rel)
        assert hashlib.sha256(open(installed, "rb").read()).hexdigest() == digest  # verbatim
    assert folder_size(str(out)) < 45 * 2**20

    check = os.path.join(ROOT, "tests", "gpu", "checks", "check_cutedsl_launch.py")
    report = tmp_path / "link.json"
    p = subprocess.run([sys.executable, check, "--dir", str(out), "--link-only", "--json", str(report)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert "linked and loaded 2 CuTeDSL objects" in p.stdout and "Function" in p.stdout
    assert {(e["kernel"], e["symbol"], e["blob"]) for e in json.loads(report.read_text())["entries"]} == want

    damaged = bytearray(packed)
    damaged[len(damaged) // 2] ^= 0xFF
    (out / m["runtime"]["file"]).write_bytes(bytes(damaged))
    p = subprocess.run([sys.executable, check, "--dir", str(out), "--link-only"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode != 0 and "sha256 differs" in p.stdout + p.stderr
