"""The parts of the H200 FlashInfer launch check (tests/gpu/checks/check_flashinfer_launch.py, step flashinfer-launch) that run
without a GPU: the process / NVRTC guard refuses and counts (built with this box's cc), the torch references and
masks the check compares with, the calls it makes are vLLM's own, and what tools/prepare_flashinfer_device.py
carries (FlashInfer's Python without data/) is enough for FlashInfer's own AOT lookup and loader to find and load
the bundle's modules after nojit's strict install (with a FlashInfer bundle: NOJIT_FLASHINFER_TEST_BUNDLE or
.device-fi/flashinfer.nojit)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.support.common import ROOT, have

CHECK = os.path.join(ROOT, "tests", "gpu", "checks", "check_flashinfer_launch.py")
GUARD_C = os.path.join(ROOT, "tests", "gpu", "checks", "exec_guard.c")


def _check_module():
    spec = importlib.util.spec_from_file_location("check_flashinfer_launch", CHECK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def guard_so(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    out = str(tmp_path_factory.mktemp("guard") / "libnojit_exec_guard.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", out, GUARD_C, "-ldl"], check=True)
    return out


def test_the_guard_counts_then_refuses_processes_popen_and_nvrtc(guard_so):
    """Mode 0 counts and lets through; mode 1 refuses fork/exec (subprocess), popen (what TensorRT-LLM DeepGEMM runs
    nvcc with), system, and nvrtcCompileProgram (NVRTC_ERROR_COMPILATION), each counted; the check reads the counts."""
    script = textwrap.dedent("""
        import ctypes, json, os, subprocess, sys
        sys.path.insert(0, sys.argv[1])
        import check_flashinfer_launch as check
        g = check.process_guard()
        assert g is not None
        start = check.counts(g)
        subprocess.run(["true"], check=True)                       # counted, runs
        counted = check.counts(g)
        g.nojit_guard_set_mode(1)
        try:
            subprocess.run(["true"])
            refused_subprocess = False
        except OSError:
            refused_subprocess = True
        libc = ctypes.CDLL(None)
        libc.popen.restype = ctypes.c_void_p
        pipe = libc.popen(b"nvcc kernel.cu -o kernel.cubin", b"r")
        system_rc = libc.system(b"true")
        nvrtc = libc.nvrtcCompileProgram
        nvrtc.restype = ctypes.c_int
        nvrtc_rc = nvrtc(None, 0, None)
        end = check.counts(g)
        print(json.dumps(dict(start=start, counted=counted, refused_subprocess=refused_subprocess, pipe=pipe,
                              system_rc=system_rc, nvrtc_rc=nvrtc_rc, end=end)))
    """)
    env = {**os.environ, "LD_PRELOAD": guard_so}
    p = subprocess.run([sys.executable, "-c", script, os.path.dirname(CHECK)], capture_output=True, text=True,
                       env=env, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    import json

    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["counted"]["c_processes"] > r["start"]["c_processes"]  # seen while it passed through
    assert r["counted"]["python_processes"] == 0  # the audit hook is the check's, not installed by this script
    assert r["refused_subprocess"] and r["pipe"] is None and r["system_rc"] == -1 and r["nvrtc_rc"] == 6
    assert r["end"]["nvrtc_compiles"] == 1
    assert r["end"]["c_processes"] >= r["counted"]["c_processes"] + 3  # (v)fork, popen, system
    assert "REFUSED popen nvcc kernel.cu" in p.stderr


def test_a_process_without_the_guard_is_refused_by_the_check(tmp_path):
    p = subprocess.run([sys.executable, CHECK, "--dir", str(tmp_path), "--json", str(tmp_path / "r.json")],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "LD_PRELOAD": ""},
                       check=False)
    assert p.returncode == 1
    assert "not preloaded" in p.stdout and "FLASHINFER-LAUNCH: FAIL" in p.stdout


@pytest.mark.skipif(not have("torch"), reason="torch is not installed")
def test_references_follow_flashinfers_tests():
    """Masks as FlashInfer's tests/utils/test_sampling.py builds them; the block-FP8 reference equals the product of
    the dequantized operands; calc_diff is 0 for equal tensors and grows with the error."""
    import torch

    check = _check_module()
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.4, 0.1]])
    k = torch.tensor([2, 1], dtype=torch.int32)
    assert check.top_k_mask(probs, k).tolist() == [[True, True, False, False], [False, False, True, False]]
    p = torch.tensor([0.6, 0.5])
    assert check.top_p_mask(probs, p).tolist() == [[True, True, False, False], [False, True, True, False]] or \
        check.top_p_mask(probs, p).tolist() == [[True, True, False, False], [True, False, True, False]]
    logits = torch.log(probs)
    masked = check.masked_logits_reference(logits, k)
    assert torch.isneginf(masked).tolist() == [[False, False, True, True], [True, True, False, True]]
    renorm = check.renorm_reference(probs, check.top_k_mask(probs, k))
    assert torch.allclose(renorm.sum(-1), torch.ones(2)) and renorm[1, 2] == 1

    torch.manual_seed(0)
    x = torch.randn(3, 256).to(torch.bfloat16)
    w = (torch.randn(256, 256) * 0.05).to(torch.bfloat16)
    wq, ws = check.quantize_weight_128x128(w)
    assert ws.shape == (2, 2) and torch.all(torch.log2(ws) == torch.round(torch.log2(ws)))  # power-of-two scales
    xq, xs = check.quantize_input_1x128(x)
    assert xq.dtype == torch.float8_e4m3fn and xs.shape == (3, 2)
    assert torch.allclose(xq.float().abs().view(3, 2, 128).amax(-1), torch.full((3, 2), 448.0))  # amax hits 448
    ref = check.block_fp8_reference(x, wq, ws)
    exact = x.float() @ w.float().t()
    assert check.calc_diff(ref, ref) == pytest.approx(0.0, abs=1e-12)
    assert 0 < check.calc_diff(ref, exact) < check.GEMM_DIFF  # FP8 rounding only
    assert check.calc_diff(ref, exact + exact.std()) > check.GEMM_DIFF


@pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")
def test_the_sampling_calls_are_vllms_own():
    """The check calls FlashInfer as vLLM 0.33.0's flashinfer_sample does (read from the installed file)."""
    origin = importlib.util.find_spec("vllm.v1.sample.ops.topk_topp_sampler").origin
    with open(origin) as f:
        vllm_src = f.read()
    body = vllm_src[vllm_src.index("def flashinfer_sample("):]
    body = body[:body.index("\ndef ", 10)]
    calls = {m.group(1): re.sub(r"\s+", "", m.group(2)) for m in
             re.finditer(r"flashinfer\.sampling\.(\w+)\(\s*(.*?)\)", body, re.DOTALL)}
    assert calls == {"top_p_sampling_from_probs": "probs,p,deterministic=True",
                     "top_k_sampling_from_probs": "probs,k,deterministic=True",
                     "top_k_top_p_sampling_from_logits": "logits,k,p,deterministic=True"}
    with open(CHECK) as f:
        check_src = f.read()
    assert "fi.sampling.top_p_sampling_from_probs(probs, p, deterministic=True)" in check_src
    assert "fi.sampling.top_k_sampling_from_probs(probs, k, deterministic=True)" in check_src
    assert "fi.sampling.top_k_top_p_sampling_from_logits(logits, k, p, deterministic=True)" in check_src
    with open(importlib.util.find_spec("vllm.model_executor.kernels.linear.scaled_mm.flashinfer").origin) as f:
        linear = f.read()
    assert re.search(r"flashinfer_fp8_blockscale_gemm\(\s*input=input,\s*weight=weight,\s*weight_scale=weight_scale,"
                     r"\s*out_dtype=torch.bfloat16,\s*\)", linear)


@pytest.mark.skipif(not have("flashinfer"), reason="FlashInfer is not installed")
def test_the_carried_python_leaves_out_data_and_keeps_the_version():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import prepare_flashinfer_device as prep
    finally:
        sys.path.pop(0)
    site = os.path.dirname(importlib.util.find_spec("flashinfer").submodule_search_locations[0])  # not imported
    files = prep.flashinfer_files(site)
    assert "flashinfer/__init__.py" in files and "flashinfer/sampling.py" in files and "flashinfer/jit/env.py" in files
    assert not any(f.startswith("flashinfer/data/") or "__pycache__" in f for f in files)
    assert any(f.endswith(".dist-info/METADATA") for f in files)
    assert sum(os.path.getsize(os.path.join(site, f)) for f in files) < 100 << 20


def _fi_bundle() -> str | None:
    for path in (os.environ.get("NOJIT_FLASHINFER_TEST_BUNDLE"), os.path.join(ROOT, ".device-fi", "flashinfer.nojit")):
        if path and os.path.exists(path):
            return path
    return None


@pytest.mark.skipif(not have("flashinfer") or _fi_bundle() is None,
                    reason="needs FlashInfer and a FlashInfer bundle (NOJIT_FLASHINFER_TEST_BUNDLE or .device-fi)")
def test_carried_flashinfer_finds_and_loads_the_seeded_modules(tmp_path):
    """FlashInfer's Python as carried (no data/), imported ahead of the installed one, after nojit's strict install:
    its AOT lookup names nojit's provider for all four modules and its loader loads `sampling` with tvm_ffi (the
    module needs libcudart only); packages the device lacks are hidden. No process is started (audit hook)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import prepare_flashinfer_device as prep
    finally:
        sys.path.pop(0)
    site_src = os.path.dirname(importlib.util.find_spec("flashinfer").submodule_search_locations[0])
    site = tmp_path / "site"
    site.mkdir()
    for rel in prep.flashinfer_files(site_src):  # the archive's content, unpacked (without the xz step)
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(os.path.join(site_src, rel), dst)
    assert not (site / "flashinfer" / "data").exists()
    script = textwrap.dedent("""
        import json, os, sys
        for name in ("cutlass", "cuda.tile", "nccl4py", "cudnn", "nvshmem4py", "vllm"):
            sys.modules[name] = None   # not on the device
        import torch  # torch's own import asks ldconfig (ctypes.util.find_library via cuda.pathfinder); the device
        started = []  # check imports it before its counting starts too
        sys.addaudithook(lambda e, a: started.append([e, str(a)[:300]]) if e in ("subprocess.Popen", "os.system", "os.posix_spawn",
                                                                 "os.exec", "os.fork") else None)
        from nojit.loader.install import install
        inst = install(bundle_path=sys.argv[1], mode="strict", allow_mismatch=frozenset({"vllm"}))
        os.environ["FLASHINFER_CUDA_ARCH_LIST"] = "9.0a"   # no GPU here: the target FlashInfer compares providers to
        import flashinfer
        from flashinfer.jit.core import refresh_current_compilation_context
        refresh_current_compilation_context()
        from flashinfer.jit import comm, sampling
        from flashinfer.jit.gemm.fp8_blockscale import gen_fp8_blockscale_gemm_sm90_module
        found = {}
        for gen in (sampling.gen_sampling_module, gen_fp8_blockscale_gemm_sm90_module, comm.gen_trtllm_comm_module,
                    comm.gen_trtllm_mnnvl_comm_module):
            spec = gen()
            found[spec.name] = [(a.provider_id, str(a.path)) for a in spec.aot_artifacts]
        module = sampling.gen_sampling_module().try_load()
        print(json.dumps(dict(file=flashinfer.__file__, found=found, root=inst.state("flashinfer").root,
                              loaded=type(module).__name__, fn=type(getattr(module, "top_k_mask_logits")).__name__,
                              started=started)))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    cu13 = [os.path.join(p, "cu13", "lib") for p in (importlib.util.find_spec("nvidia").submodule_search_locations
                                                      if have("nvidia") else [])]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*cu13, os.environ.get("LD_LIBRARY_PATH", "")])
    env["NOJIT_FLASHINFER_DIR"] = str(tmp_path / "seed")
    p = subprocess.run([sys.executable, "-c", script, _fi_bundle()], capture_output=True, text=True, env=env,
                       timeout=600, cwd=str(tmp_path), check=False)
    assert p.returncode == 0, p.stderr[-4000:]
    import json

    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["file"] == str(site / "flashinfer" / "__init__.py")
    from nojit.loader.bundle.file import Bundle

    held = {e.launch.module for e in Bundle.open(_fi_bundle()).manifest.entries if e.launch.kind == "module"}
    assert "sampling" in held  # the loaded one below
    for name in ("sampling", "fp8_blockscale_gemm_90", "trtllm_comm", "trtllm_mnnvl_comm"):
        # a module the bundle holds is nojit's artifact; one it lacks (a TP 1 bundle's allreduce) is nobody's
        want = [["nojit", os.path.join(r["root"], name, f"{name}.so")]] if name in held else []
        assert r["found"][name] == want, (name, sorted(held))
    assert r["loaded"] == "Module" and r["fn"] == "Function"
    assert r["started"] == []


class _StandIn:
    """FlashInfer's entry points written in torch, for the check's harness on the CPU (never what the device runs):
    sampling from the renormalized top-k/top-p set, masks and renorms, the block-FP8 product. broken= makes one
    of them wrong the way a kernel could be: a token outside the set, an output left unwritten, a wrong product."""

    def __init__(self, check, broken: str = "") -> None:
        import types

        import torch

        self.check, self.broken = check, broken
        self.sampling = types.SimpleNamespace(
            top_p_sampling_from_probs=lambda probs, p, deterministic: self._draw(probs, check.top_p_mask(probs, p)),
            top_k_sampling_from_probs=lambda probs, k, deterministic: self._draw(probs, check.top_k_mask(probs, k)),
            top_k_top_p_sampling_from_logits=self._top_k_top_p,
            top_k_mask_logits=lambda logits, k: check.masked_logits_reference(logits, k),
            top_k_renorm_probs=lambda probs, k: check.renorm_reference(probs, check.top_k_mask(probs, k)),
            top_p_renorm_probs=self._top_p_renorm)
        self.gemm = types.SimpleNamespace(fp8_blockscale_gemm_sm90=self._gemm)
        self.torch = torch

    def _draw(self, probs, allowed):
        torch = self.torch
        if self.broken == "outside":
            return torch.argmin(probs, dim=-1).to(torch.int32)
        kept = torch.where(allowed, probs, torch.zeros_like(probs))
        return torch.multinomial(kept / kept.sum(-1, keepdim=True), 1).view(-1).to(torch.int32)

    def _top_k_top_p(self, logits, k, p, deterministic):
        torch = self.torch
        probs = torch.softmax(self.check.masked_logits_reference(logits, k), dim=-1)
        return self._draw(probs, self.check.top_p_mask(probs, p, eps=0.0))

    def _top_p_renorm(self, probs, p):
        torch = self.torch
        ordered, idx = torch.sort(probs, dim=-1)
        keep = (torch.cumsum(ordered, dim=-1) >= (1 - p.view(-1, 1))).int()
        return self.check.renorm_reference(probs, torch.zeros_like(keep).scatter_add_(1, idx, keep).bool())

    def _gemm(self, input, weight, weight_scale, out=None, out_dtype=None):
        result = self.check.block_fp8_reference(input, weight, weight_scale)
        if self.broken == "transposed":
            result = result.flip(1)
        if out is None:
            return result.to(out_dtype)
        if self.broken != "unwritten":
            out.copy_(result)
        return out


@pytest.mark.skipif(not have("torch"), reason="torch is not installed")
@pytest.mark.parametrize("broken", ["", "outside", "transposed", "unwritten"])
def test_the_cases_pass_a_correct_stand_in_and_fail_a_broken_one(broken, monkeypatch):
    """The check's sampling, deterministic and GEMM cases, run on the CPU against a torch stand-in for FlashInfer:
    all pass when it is right; a token outside the top-k/top-p set, a transposed product, or an output buffer left
    unwritten (still NaN) fails the cases it touches."""
    check = _check_module()
    monkeypatch.setattr(check, "DEVICE", "cpu")
    monkeypatch.setattr(check, "VOCAB", 3000)
    monkeypatch.setattr(check, "BATCHES", (1, 5))
    monkeypatch.setattr(check, "GEMM_MS", (1, 31))
    monkeypatch.setattr(check.Poison, "hit", lambda self, out: True)  # the stand-in does not allocate with torch.empty
    fi = _StandIn(check, broken)
    sampling = check.run_sampling(fi, draws=3, seeds=2)
    deterministic = check.run_deterministic(fi)
    gemm = check.run_gemm(fi, [(256, 384)])
    assert len(sampling) == 6 and len(deterministic) == 2 * (3 * 2 + 4) and len(gemm) == 2
    failed = {c["case"].split()[0] for c in sampling + deterministic + gemm if not c["ok"]}
    expected = {"": set(), "outside": {"sampling"}, "transposed": {"fp8_blockscale_gemm_sm90"},
                "unwritten": {"fp8_blockscale_gemm_sm90"}}[broken]
    assert failed == expected, [c for c in sampling + deterministic + gemm if not c["ok"]][:3]
    if broken == "unwritten":
        assert all(c["nan_left"] > 0 for c in gemm)


@pytest.mark.skipif(not have("torch"), reason="torch is not installed")
def test_poison_fills_what_torch_empty_hands_out_and_restores_it():
    import torch

    check = _check_module()
    real = torch.empty
    with check.Poison() as poison:
        samples = torch.empty(4, dtype=torch.int32)
        out = torch.empty_like(torch.zeros(2, 3, dtype=torch.bfloat16))
        workspace = torch.empty(16, dtype=torch.uint8)
    assert torch.empty is real
    assert samples.tolist() == [-1] * 4 and bool(torch.isnan(out).all())
    assert poison.hit(samples) and poison.hit(out) and not poison.hit(workspace)
    assert not poison.hit(torch.zeros(4, dtype=torch.int32))
