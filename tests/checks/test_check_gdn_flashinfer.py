"""tests/gpu/checks/check_gdn_flashinfer.py's CPU half: the two payloads tools/prepare_gdnfi_device.py makes, the two
device calls simulated in folders (call 2 refuses a machine call 1 did not stage, or staged with other bytes), the
check's import path up to the launch (vLLM's copy mounted, nojit strict, FlashInfer's sm_90 module, nojit's cache in
FlashInfer's place), FlashInfer's lookup answered from the bundle through the check's counter on the stand-in GPU, the
negative control's refusal naming the removed key, and the fallback's arguments against vLLM's own function and
FlashInfer's signature. The nvidia-cutlass-dsl cp312 wheels are stand-ins here (no network): the same layout, a small
MLIR library, this box's C runtime."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from tests.support.common import ROOT, have, run_cli

pytestmark = pytest.mark.skipif(not (have("vllm") and have("cutlass") and have("flashinfer") and have("tvm_ffi")),
                                reason="needs vLLM, FlashInfer, nvidia-cutlass-dsl and tvm_ffi")
CHECK = os.path.join(ROOT, "tests", "gpu", "checks", "check_gdn_flashinfer.py")
PROBE = os.path.join(ROOT, "tests", "probes", "probe_gdn_flashinfer.py")
QWEN = os.path.join(ROOT, "aot", "data", "qwen3.5-35b-a3b-fp8-h200.toml")
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}


def _run(*args: str, script: str = CHECK) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=900, env=ENV)


def _wheel(path: str, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)


def _stand_in_wheels(d: str, version: str) -> bytes:
    """The four cp312 wheels' layout with a small MLIR library (returned) and this box's C runtime."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import prepare_gdnfi_device as p
    from prepare_cutedsl_device import cutedsl_libdir

    os.makedirs(d)
    ir = os.urandom(1 << 16) * 4
    with open(os.path.join(cutedsl_libdir(), p.RUNTIME_LIB), "rb") as f:
        runtime = f.read()
    tag = "cp312-cp312-manylinux_2_28_x86_64"
    for dist, wtag, files in (
            ("nvidia_cutlass_dsl", "py3-none-any", {"nvidia_cutlass_dsl_packages.pth": b"import sys\n"}),
            ("nvidia_cutlass_dsl_libs_base", tag, {"nvidia_cutlass_dsl/dsl_packages/cutlass/__init__.py": b"# stand-in\n",
                                                   "nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/__init__.py": b""}),
            ("nvidia_cutlass_dsl_libs_core", "py3-none-any", {"nvidia_cutlass_dsl/dsl_packages/core.py": b""}),
            ("nvidia_cutlass_dsl_libs_cu13", tag, {p.IR_PATH: ir, p.RUNTIME_PATH: runtime,
                                                   "nvidia_cutlass_dsl/cu13/include/CuteDSLRuntime.h": b""})):
        files[f"{dist}-{version}.dist-info/METADATA"] = f"Name: {dist}\nVersion: {version}\n".encode()
        _wheel(os.path.join(d, f"{dist}-{version}-{wtag}.whl"), files)
    return ir


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    d = tmp_path_factory.mktemp("gdnfi")
    bundle = str(d / "gdn.nojit")
    run_cli("build", "--deployment", QWEN, "--runtime", "flashinfer_cute", "--kernels", "_FullyFusedDeltaRuleSm90",
            "-o", bundle, "--cache-dir", str(d / "cache"), "-j", "2", "--quiet")
    ir = _stand_in_wheels(str(d / "wheels"), importlib.metadata.version("nvidia-cutlass-dsl"))
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from prepare_gdnfi_device import prepare

    m = prepare(bundle, str(d / "ir"), str(d / "dev"), str(d / "wheels"), tvm_wheel=False, download=False)
    return {"dir": d, "bundle": bundle, "ir": ir, "manifest": m}


def test_two_payloads_and_the_two_calls(payloads, tmp_path):
    d, m = payloads["dir"], payloads["manifest"]
    import prepare_gdnfi_device as p

    assert m["ir"]["size"] == len(payloads["ir"]) and json.load(open(d / "ir" / "manifest.json"))["ir"] == m["ir"]
    with tarfile.open(d / "dev" / "cutlass_site.tar.xz") as tar:
        names = tar.getnames()
    assert p.IR_PATH not in names and p.RUNTIME_PATH not in names and "nvidia_cutlass_dsl_packages.pth" in names
    assert not any(p.IR in f for _, _, fs in os.walk(d / "dev") for f in fs)  # the MLIR library travels in call 1 only
    assert m["vllm_sources"] > 10 and (d / "dev" / "vllm_src" / "vllm" / "model_executor" / "layers" / "mamba" / "gdn"
                                       / "qwen_gdn_linear_attn.py").is_file()
    a, b, site = tmp_path / "a", tmp_path / "b", str(tmp_path / "site")
    shutil.copytree(d / "ir", a)
    shutil.copytree(d / "dev", b)
    call2 = ("--dir", str(b), "--ir-dir", str(a), "--assemble", site)
    r = _run(*call2)  # call 2 on a machine call 1 did not leave warm
    assert r.returncode == 4 and "is not staged on this machine" in r.stdout and "--stage" in r.stdout, r.stdout + r.stderr
    r = _run("--stage", "--ir-dir", str(a))  # call 1
    assert r.returncode == 0 and r.stdout.startswith("STAGED"), r.stdout + r.stderr
    r = _run(*call2)
    assert r.returncode == 0 and "assembled" in r.stdout, r.stdout + r.stderr[-2000:]
    link = os.path.join(site, *("nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs".split("/")), p.IR)
    assert os.path.islink(link) and open(link, "rb").read() == payloads["ir"]
    with open(os.path.join(site, p.RUNTIME_PATH), "rb") as f:
        import hashlib

        assert hashlib.sha256(f.read()).hexdigest() == m["runtime"]["sha256"]
    assert os.path.isfile(os.path.join(site, "flashinfer", "gdn_prefill.py"))
    # the staged library changed after call 1, or staged from another payload: refused, not used
    staged = a / p.IR
    staged.write_bytes(b"x" + staged.read_bytes()[1:])
    r = _run(*call2)
    assert r.returncode == 4 and "changed since call 1" in r.stdout, r.stdout
    record = json.loads((a / "staged.json").read_text())
    (a / "staged.json").write_text(json.dumps({**record, "sha256": "0" * 64}))
    r = _run(*call2)
    assert r.returncode == 4 and "is not the one this payload names" in r.stdout, r.stdout
    packed = a / m["ir"]["file"]  # a damaged carry: call 1 refuses it
    packed.write_bytes(packed.read_bytes()[:-1] + b"\0")
    r = _run("--stage", "--ir-dir", str(a))
    assert r.returncode == 2 and "STAGE FAIL" in r.stdout and "sha256" in r.stdout, r.stdout


def test_import_path_runs_then_the_launch_skips_without_gpu(payloads):
    r = _run("--dir", str(payloads["dir"] / "dev"))
    assert r.returncode == 3 and "SKIP: no CUDA device; the import path ran" in r.stdout, r.stdout + r.stderr[-3000:]
    start = json.loads(r.stdout.strip().splitlines()[0])
    assert start["via"].startswith("vLLM ") and start["sm90_kernel_module"] and start["cache_is_nojit"]


def test_flashinfers_lookup_is_answered_from_the_bundle_and_the_negative_control_names_the_key(payloads, tmp_path):
    dev = payloads["dir"] / "dev"
    r = _run("serve", str(dev / "gdn.nojit"), str(dev / "vllm_src"), script=PROBE)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["vllm_module"].startswith(str(dev / "vllm_src")) and "raised" not in out, out
    assert (out["lookups"], out["answered"], out["loaded"], out["launched"]) == (1, 1, 1, [23])
    assert out["compile_attempts"] == []
    minus = str(tmp_path / "minus1.nojit")
    r = _run("--role", "without", "--dir", str(dev), "--out", minus)
    assert r.returncode == 0, r.stderr[-2000:]
    key = r.stdout.strip().splitlines()[-1]
    assert key.startswith("_FullyFusedDeltaRuleSm90(") and "needs_checkpointing=False" in key
    r = _run("serve", minus, str(dev / "vllm_src"), script=PROBE)
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["raised"] == "KernelNotInBundleError" and key in out["message"], out
    assert (out["answered"], out["loaded"], out["launched"], out["compile_attempts"]) == (0, 0, [], [])


def test_fallback_arguments_are_vllms_and_bind_to_flashinfers_signature(payloads):
    r = _run("arguments", str(payloads["dir"] / "dev" / "vllm_src"), script=PROBE)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["differ"] == [] and out["vllm_keys"] == out["ours_keys"] and out["binds"], out


def test_only_an_object_the_bundle_loaded_counts_as_answered():
    """A lookup FlashInfer's cache answers with anything but an object nojit loaded from the bundle (an entry it held
    before nojit's install, something stored after a compile) is a lookup, not one answered from the bundle."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "gpu", "checks"))
    import check_gdn_flashinfer as c

    from nojit.loader.runtimes.flashinfer_cute.serving import BundledCompileCache

    foreign, bundled = object(), object()
    cache = BundledCompileCache({("before", "--enable-tvm-ffi"): foreign}, {}, None, None)
    lookups = c.Lookups(cache)
    assert cache.get(("before", "--enable-tvm-ffi")) is foreign
    dict.__setitem__(cache, ("compiled", "--enable-tvm-ffi"), object())  # what FlashInfer stores after cute.compile
    cache.get(("compiled", "--enable-tvm-ffi"))
    assert (lookups.calls, lookups.answered) == (2, 0)
    cache.loaded[b"wire"] = bundled  # control: an object the bundle loaded (BundledCompileCache.load) counts
    dict.__setitem__(cache, ("bundled", "--enable-tvm-ffi"), bundled)
    assert cache.get(("bundled", "--enable-tvm-ffi")) is bundled
    assert (lookups.calls, lookups.answered) == (3, 1)


def test_negative_control_needs_the_process_guard(tmp_path):
    """On a GPU the negative control's 'processes 0' is read from the preloaded C guard: without it the count would be
    0 by construction, so the control fails saying so (as the check itself does)."""
    expect = tmp_path / "key.txt"
    expect.write_text("_FullyFusedDeltaRuleSm90(...)\n")
    script = f"""
import sys, torch
sys.path.insert(0, {os.path.join(ROOT, 'tests', 'gpu', 'checks')!r})
torch.cuda.is_available = lambda: True   # the GPU the device has; the C guard not preloaded
sys.argv = ["check_gdn_flashinfer.py", "--role", "negative", "--bundle", "b.nojit", "--expect-file", {str(expect)!r}]
import check_gdn_flashinfer as c
sys.exit(c.main())
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=ENV)
    assert r.returncode == 1 and "NEGATIVE CONTROL: FAIL" in r.stdout and "LD_PRELOAD" in r.stdout, \
        r.stdout + r.stderr[-2000:]


def test_cp_cases_take_flashinfers_cp_route_on_an_h200_and_the_others_its_fused_kernel():
    """The route each case asserts on the H200 is the one FlashInfer's own heuristic picks there (sequences x value
    heads against the H200's 132 SMs, varlen_helper.should_use_cp_host): CP_CASES on the CP route, CASES not."""
    sys.path.insert(0, os.path.join(ROOT, "tests", "gpu", "checks"))
    from check_gdn_prefill import CASES, CP_CASES, HV
    from flashinfer.gdn_kernels.delta_rule_dsl.varlen_helper import should_use_cp_host

    def cp(lengths: list[int]) -> bool:
        return should_use_cp_host(len(lengths) * HV, 132, "NVIDIA H200", device_capability=(9, 0))

    assert [cp(c[1]) for c in CP_CASES] == [True] * len(CP_CASES)
    assert [cp(c[1]) for c in CASES] == [False] * len(CASES)
    assert {c[2] for c in CP_CASES} == {0, 64}  # both CPDeltaRulePrefillSm90 keys (checkpoints or not)
