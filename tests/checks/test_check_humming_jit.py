"""The H200 step `humming-jit` (tests/gpu/checks/check_humming_jit.py: bundle-served Humming kernels against Humming's own
JIT on the device) on the CPU: its arguments, its comparison and report on synthetic outputs and cubins, its
toolchain description's header walk, and that a run whose processes write nothing fails. The kernels themselves
run on the H200 only."""

from __future__ import annotations

import importlib.util
import os
import struct
import sys

import pytest

torch = pytest.importorskip("torch")

from tests.support.common import GPU_CHECKS as GPU  # noqa: E402


@pytest.fixture(scope="module")
def c():
    sys.path.insert(0, GPU)
    spec = importlib.util.spec_from_file_location("check_humming_jit_cpu", os.path.join(GPU, "check_humming_jit.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments(c):
    o = c.parse_args([])
    assert o.dir == ".device-hg" and o.token_counts == [1, 4, 64, 200, 300, 435, 500] and o.role is None
    o = c.parse_args(["--tokens", "3,5", "--role", "jit", "--nvrtc-dir", "/x", "--work", "/tmp/w"])
    assert o.token_counts == [3, 5] and o.role == "jit" and o.nvrtc_dir == "/x"
    for bad in (["--tokens", "1,x"], ["--tokens", "0"], ["--role", "other"]):
        with pytest.raises(SystemExit):
            c.parse_args(bad)


def test_output_comparison_is_bitwise_and_nan_safe(c):
    a = torch.tensor([[1.0, float("nan")], [2.5, -0.0]], dtype=torch.bfloat16)
    r = c.compare_outputs(a, a.clone())
    assert r["bitwise_equal"] and r["differing"] == 0 and r["nan"] == [1, 1]
    b = a.clone()
    b[1, 1] = 0.0  # -0.0 vs 0.0: equal as numbers, not as bits
    r = c.compare_outputs(a, b)
    assert not r["bitwise_equal"] and r["differing"] == 1 and r["max_abs_diff"] == 0.0
    b[1, 0] = 2.75
    r = c.compare_outputs(a, b)
    assert r["differing"] == 2 and r["max_abs_diff"] == 0.25
    assert not c.compare_outputs(a, a.float())["bitwise_equal"]


def _elf(sections: dict[str, bytes]) -> bytes:
    """A minimal ELF64 with these sections (a stand-in cubin)."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n in sections) + b".shstrtab\0"
    body, offsets, pos = b"", [], 64
    for data in list(sections.values()) + [names]:
        offsets.append(pos + len(body))
        body += data
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0,
                                                                       64, 0, 0, 64, len(sections) + 2,
                                                                       len(sections) + 1)
    table = bytes(64)
    name_at = 1
    for (name, data), off in zip(list(sections.items()) + [(".shstrtab", names)], offsets):
        table += struct.pack("<IIQQQQIIQQ", name_at, 3 if name == ".shstrtab" else 1, 0, 0, off, len(data), 0, 0, 1, 0)
        name_at += len(name) + 1
    return header + body + table


def test_cubin_difference_names_sections_tool_and_paths(c):
    tk = b"\x0c\x00\x00\x00NVIDIA Corp\x00\x02\x00\x00\x00ptxas\x00Cuda compilation tools, release 13.0, V13.0.88\x00" \
         b"-O 3 -arch sm_90a \x00"
    code = b"\x12\x34" * 8
    a = _elf({".text.k": code, ".note.nv.tkinfo": tk, ".nv.global.init": b"/box/site/humming/include/x.cuh\0"})
    b = _elf({".text.k": code, ".note.nv.tkinfo": tk, ".nv.global.init": b"/dev/hg/humming/include/x.cuh\0"})
    assert c.cubin_difference(a, a) == {"identical": True, "bytes": [len(a), len(a)]}
    d = c.cubin_difference(a, b)
    assert not d["identical"] and d["sections_differing"] == [".nv.global.init"] and d["text_identical"]
    assert d["paths"] == [["/box/site/humming/include/x.cuh"], ["/dev/hg/humming/include/x.cuh"]] and d["explained"]
    assert "Cuda compilation tools, release 13.0, V13.0.88" in d["tool"][0]
    e = c.cubin_difference(a, _elf({".text.k": code[::-1], ".note.nv.tkinfo": tk, ".nv.global.init": b""}))
    assert not e["text_identical"] and "explained" not in e
    assert c.cubin_difference(a, b"not a cubin")["sections_differing"][0].startswith("unreadable")


def test_header_closure_follows_includes_as_the_compiler_resolves_them(c, tmp_path):
    hum, cuda = tmp_path / "humming", tmp_path / "cuda"
    (hum / "h").mkdir(parents=True)
    (cuda / "sub").mkdir(parents=True)
    (hum / "h" / "a.cuh").write_text('#include <cuda_fp16.h>\n#include "b.cuh"\n#  include <cstdint>\n')
    (hum / "h" / "b.cuh").write_text("// b\n")
    (cuda / "cuda_fp16.h").write_text('#include "sub/fp16.hpp"\n#include <not_here.h>\n')
    (cuda / "sub" / "fp16.hpp").write_text("#include <cuda_fp16.h>\n")  # a cycle
    start = [(hum / "h" / "a.cuh").read_bytes()]
    got = c.header_closure([str(hum), str(cuda)], start, {"cstdint"})
    assert sorted(got) == ["I1:cuda_fp16.h", "I1:sub/fp16.hpp"]  # "b.cuh" is relative to a file: start has none
    start = [b'#include <h/a.cuh>\n']
    got = c.header_closure([str(hum), str(cuda)], start, {"cstdint"})
    assert sorted(got) == ["I0:h/a.cuh", "I0:h/b.cuh", "I1:cuda_fp16.h", "I1:sub/fp16.hpp"]
    (cuda / "sub" / "fp16.hpp").write_text("// other contents\n")
    again = c.header_closure([str(hum), str(cuda)], start, {"cstdint"})
    assert [k for k in got if got[k] != again.get(k)] == ["I1:sub/fp16.hpp"]


def test_toolchain_differences(c):
    build = {"compiler": "NVRTCCompiler", "nvrtc_version": "13.0", "nvrtc_sha256": "a", "nvrtc_realpath": "/b/lib",
             "nvrtc_builtins": {"libnvrtc-builtins.so.13.0": "x"}, "options": ["-I<I0>", "-no-cache"],
             "nvrtc_compile": {"sha256": "h"}, "headers": {"I1:cuda_fp16.h": "1", "I1:x.h": "2"}}
    assert c.toolchain_differences(build, dict(build)) == []
    here = {**build, "nvrtc_sha256": "b", "nvrtc_realpath": "/d/lib", "headers": {"I1:cuda_fp16.h": "9", "I1:y.h": "3"}}
    diffs = c.toolchain_differences(build, here)
    assert any(d.startswith("nvrtc_sha256") and "/b/lib vs /d/lib" in d for d in diffs)
    assert any("only on the build box: 1 (I1:x.h)" in d for d in diffs)
    assert any("only here: 1 (I1:y.h)" in d for d in diffs)
    assert any("other contents: 1 (I1:cuda_fp16.h)" in d for d in diffs)


def _reports(tmp_path, jit_out, repeat=(True, True), **jit_extra):
    ref = torch.arange(12, dtype=torch.bfloat16).view(3, 4)
    torch.save(ref, tmp_path / "b.pt")
    torch.save(jit_out, tmp_path / "j.pt")
    weights = {"w13": {"checkpoint": ["c1", "c2"], "transformed": {"weight": "t"}, "s": 1.0}}
    case = {"op": "w13", "tokens": 4, "m": 24, "interval": 0, "stream_k": True, "ok": False, "stats": "s",
            "inputs": "in", "kernel_file": "/a/KEY1/kernel.cubin", "cubin_sha256": "blob1"}
    bundle = {"cases": [{**case, "output": str(tmp_path / "b.pt"), "repeat_equal": repeat[0]}], "weights": weights,
              "compiles": [], "processes": 0, "seeded_from_bundle": 63, "failures": [],
              "kernels": [{"class": "HummingKernel", "code_sha256": "code1", "key": "KEY1", "cubin_sha256": "blob1"}]}
    jit = {"cases": [{**case, "output": str(tmp_path / "j.pt"), "repeat_equal": repeat[1], "ok": True,
                      "kernel_file": "/j/KEY1/kernel.cubin"}],
           "weights": {"w13": {**weights["w13"], "s": 9.0}}, "compiles": ["NVRTCCompiler"] * 2, "failures": [],
           "nojit_imported": [], "toolchain": {"nvrtc_version": "13.0", "headers": {"I1:a.h": "1"}},
           "kernels": [{"class": "HummingKernel", "code_sha256": "code1", "key": "KEY1", "cubin_sha256": "blob1",
                        "kernel_file": "/nonexistent"}]}
    for k, v in jit_extra.items():
        jit[k] = v
    return bundle, jit, ref


def test_report_of_equal_outputs_and_identical_cubins(c, tmp_path):
    bundle, jit, ref = _reports(tmp_path, torch.arange(12, dtype=torch.bfloat16).view(3, 4))
    blobs = {"code1": ("blob1", b"cubin")}
    r = c.compare(bundle, jit, blobs, {"nvrtc_version": "13.0", "headers": {"I1:a.h": "1"}}, torch.load)
    assert r["failures"] == []
    [row] = r["cases"]
    assert row["bitwise_equal"] and row["cubin_identical"] and row["same_key"]
    assert row["bundle_rule"] is False and row["jit_rule"] is True  # Humming's rule: reported, not failed
    assert r["kernels"]["identical"] == 1 and r["kernels"]["same_key"] == 1 and r["toolchain_differences"] == []
    text = "\n".join(c.summary(r))
    assert "RESULT humming-jit: 1/1 cases bitwise equal" in text and "JIT 1/1" in text and "bundle 0/1" in text


def test_report_of_differing_outputs_and_cubins(c, tmp_path):
    out = torch.arange(12, dtype=torch.bfloat16).view(3, 4)
    out[2, 3] = 100.0
    bundle, jit, _ = _reports(tmp_path, out)
    jit_cubin = tmp_path / "jit.cubin"
    jit_cubin.write_bytes(b"other")
    jit["kernels"][0].update(cubin_sha256="blob2", kernel_file=str(jit_cubin))
    jit["cases"][0]["cubin_sha256"] = "blob2"
    pairs = []
    r = c.compare(bundle, jit, {"code1": ("blob1", b"cubin")}, None, torch.load,
                  lambda name, a, b: pairs.append((name, a, b)))
    [row] = r["cases"]
    assert not row["bitwise_equal"] and row["differing"] == 1 and row["max_abs_diff"] == 89.0
    assert not row["cubin_identical"]
    assert any("differ in 1 elements" in f and "reproduces itself" in f for f in r["failures"])
    assert r["kernels"]["identical"] == 0 and r["kernels"]["differing"][0]["bytes"] == [5, 5]
    assert pairs == [("HummingKernel-code1", b"cubin", b"other")]
    # a kernel that does not reproduce itself: the difference is reported, not failed
    bundle, jit, _ = _reports(tmp_path, out, repeat=(True, False))
    r = c.compare(bundle, jit, {"code1": ("blob1", b"cubin")}, None, torch.load)
    assert r["failures"] == [] and not r["cases"][0]["bitwise_equal"]


@pytest.mark.parametrize("broken, expected", [
    ({"compiles": []}, "compiled nothing"),
    ({"nojit_imported": ["nojit.loader"]}, "nojit was imported"),
    ({"weights": {"w13": {"checkpoint": ["c1", "c2"], "transformed": {"weight": "other"}}}}, "transformed weights"),
    ({"cases": []}, "not compared"),
])
def test_report_failures(c, tmp_path, broken, expected):
    bundle, jit, ref = _reports(tmp_path, torch.arange(12, dtype=torch.bfloat16).view(3, 4), **broken)
    r = c.compare(bundle, jit, {"code1": ("blob1", b"cubin")}, None, torch.load)
    assert any(expected in f for f in r["failures"]), r["failures"]


def test_a_run_whose_processes_write_nothing_fails(c, tmp_path, monkeypatch, capsys):
    bundle, jit, _ = _reports(tmp_path, torch.zeros(3, 4, dtype=torch.bfloat16))
    bundle["cases"] = []
    r = c.compare(bundle, jit, {}, None, torch.load)
    assert "no case ran" in r["failures"]
    assert any("wrote no report" in f for f in c.compare(None, jit, {}, None, torch.load)["failures"])
    started = []
    monkeypatch.setattr(c, "run_child", lambda opts, role, env: started.append((role, env)) or 0)
    monkeypatch.setenv("NOJIT_MODE", "strict")
    rc = c.main(["--dir", str(tmp_path / "hg"), "--work", str(tmp_path / "work"), "--json", str(tmp_path / "r.json")])
    assert rc == 1
    assert [role for role, _ in started] == ["bundle", "jit"]
    jit_env = started[1][1]
    assert jit_env["HUMMING_CACHE_DIR"] == str(tmp_path / "work" / "jit-cache") and "NOJIT_MODE" not in jit_env
    assert started[0][1]["NOJIT_MODE"] == "strict"
    printed = capsys.readouterr().out
    assert "the bundle process wrote no report" in printed and "the jit process wrote no report" in printed
    assert os.path.exists(tmp_path / "r.json")


class _StandInGemm:
    """Stands in for check_humming_gemm.Gemm (a GPU launch): CPU tensors from the seeds, the same interface."""

    shift = 0.0  # the "JIT" process's kernel gives other values where set
    deterministic = True

    def __init__(self, op, call, input_schema, seed):
        gen = torch.Generator().manual_seed(seed)
        self.op, self.launches = op, 0
        self.w_bytes = torch.randint(0, 256, (2, 4, 8), dtype=torch.uint8, generator=gen)
        self.s_bytes = torch.randint(120, 128, (2, 4, 1), dtype=torch.uint8, generator=gen)
        self.tensors = {"weight": self.w_bytes.int() * 3, "weight_scale": self.s_bytes.clone()}
        self.config_matches = True

    def case(self, tokens, top_k, seed):
        gen = torch.Generator().manual_seed(seed)
        topk = torch.randint(0, 2, (tokens, top_k), dtype=torch.int32, generator=gen)
        q = torch.randn(tokens, 8, generator=gen).to(torch.float8_e4m3fn)
        return {"tokens": tokens, "top_k": top_k, "m": tokens * top_k, "topk": topk, "q": q,
                "scale": torch.ones(tokens, 1), "interval": 0, "sorted_ids": topk.reshape(-1),
                "expert_ids": torch.zeros(1, dtype=torch.int32), "padded": torch.tensor(tokens * top_k)}

    def launch(self, case, locks):
        self.launches += 1
        out = torch.full((case["m"], 4), float("nan"), dtype=torch.bfloat16)
        noise = 0.0 if self.deterministic else self.launches * 0.5
        out.copy_(case["q"].float().sum(dim=1, keepdim=True).repeat_interleave(case["top_k"], 0).expand(-1, 4)
                  + self.shift + noise)
        return out, 0.01

    def check(self, case, out, launch_s=0.0):
        path = self.kernel_path
        return {"op": self.op, "tokens": case["tokens"], "m": case["m"], "interval": 0, "stream_k": True,
                "kernel_file": path, "ok": self.shift == 0.0, "stats": "stand-in", "first_call_s": launch_s}


def test_both_processes_cases_end_to_end_on_a_stand_in(c, tmp_path):
    """run_cases (what each process of the step does per case: the same inputs from the same seeds, two launches,
    digests, the saved output) and compare() on its reports; the GEMM is a CPU stand-in."""
    import json
    import types

    (tmp_path / "hg").mkdir()
    calls = {"layers": [{"moe": {"top_k": 2}, "input_schema": {}, "gemms": {"w13": {}, "w2": {}}}]}
    (tmp_path / "hg" / "humming_calls.json").write_text(json.dumps(calls))
    opts = c.parse_args(["--dir", str(tmp_path / "hg"), "--work", str(tmp_path / "w"), "--tokens", "1,3"])
    reports = {}
    for role, shift, kernel_bytes in (("bundle", 0.0, b"blob"), ("jit", 0.0, b"blob")):
        (tmp_path / "w" / role).mkdir(parents=True)
        kernel = tmp_path / f"{role}-KEY" / "kernel.cubin"
        kernel.parent.mkdir()
        kernel.write_bytes(kernel_bytes)
        gemm = type("G", (_StandInGemm,), {"shift": shift, "kernel_path": str(kernel)})
        g = types.SimpleNamespace(TOP_K_DEFAULT=6, Gemm=gemm, gemm_seed=lambda li, op: 7 + (op == "w2"),
                                  case_seed=lambda t, li: t * 7 + li, make_locks=lambda: None)
        report = {"cases": [], "weights": {}, "failures": [], "tracebacks": [], "compiles": ["NVRTCCompiler"],
                  "processes": 0, "nojit_imported": []}
        c.run_cases(g, opts, role, report)
        reports[role] = report
    b, j = reports["bundle"], reports["jit"]
    assert [(x["op"], x["tokens"]) for x in b["cases"]] == [("w13", 1), ("w13", 3), ("w2", 1), ("w2", 3)]
    assert all(x["repeat_equal"] and os.path.exists(x["output"]) and x["cubin_sha256"] for x in b["cases"])
    assert b["weights"]["w13"]["checkpoint"] == j["weights"]["w13"]["checkpoint"]
    assert b["cases"][0]["inputs"] == j["cases"][0]["inputs"] != b["cases"][1]["inputs"]
    b["compiles"] = []
    r = c.compare(b, j, {}, None, torch.load)
    assert r["failures"] == [] and all(x["bitwise_equal"] and x["cubin_identical"] for x in r["cases"])
    assert not any(x["same_key"] for x in r["cases"])  # the folders' names differ: bundle-KEY vs jit-KEY

    # the JIT's kernel computes something else, reproducibly: a failure; not reproducibly: reported only
    for deterministic, failed in ((True, True), (False, False)):
        gemm = type("G", (_StandInGemm,), {"shift": 1.0, "deterministic": deterministic,
                                          "kernel_path": str(tmp_path / "jit-KEY" / "kernel.cubin")})
        g = types.SimpleNamespace(TOP_K_DEFAULT=6, Gemm=gemm, gemm_seed=lambda li, op: 7 + (op == "w2"),
                                  case_seed=lambda t, li: t * 7 + li, make_locks=lambda: None)
        j2 = {**j, "cases": [], "weights": {}}
        c.run_cases(g, opts, "jit", j2)
        r = c.compare(b, j2, {}, None, torch.load)
        assert all(not x["bitwise_equal"] for x in r["cases"])
        assert bool(r["failures"]) is failed, r["failures"]
        assert all(x["jit_rule"] is False and x["bundle_rule"] is True for x in r["cases"])
