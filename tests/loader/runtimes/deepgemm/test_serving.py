"""DeepGEMM ahead of time on the CPU: the probe firewall, the seeded cache, and DeepGEMM's own lookup.

The lookup tests run vLLM's vendored DeepGEMM for real on a GPU-less box (its device queries and the
driver answered by the build-side stand-ins) and need a C compiler and CUDA headers (nvcc's toolkit);
they are skipped without them. The build tests run `nojit build --runtime deepgemm` for the default
deployment with a stand-in nvcc (placeholder cubins: the real compile is ~40 s per entry and is checked
on the H200, tests/gpu/checks/check_deepgemm.py). 7-10 minutes in all on the shared 2-core box at load ~13 (the
build's enumeration of 102,400 calls and the strict lookup of all of them under strace dominate).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess

import pytest
from tests.support.common import need_deepgemm_toolkit, run_cli

from nojit.loader.runtimes.deepgemm.cache import compress_keys, find_key, seed
from nojit.loader.errors import BundleCorruptError
from nojit.loader.strict.firewall import is_stand_in


def _extension() -> str:
    import vllm.third_party.deep_gemm  # noqa: F401 - only its path is read, nothing is imported from it

    pkg = os.path.dirname(vllm.third_party.deep_gemm.__file__)
    return os.path.join(pkg, next(n for n in os.listdir(pkg) if n.startswith("_C_extension")))


def test_extension_has_lazy_popen_slots() -> None:
    from nojit.loader.runtimes.deepgemm.popen import plt_slots

    slots = plt_slots(_extension(), ("popen", "pclose"))
    assert set(slots) == {"popen", "pclose"} and all(v > 0 for v in slots.values())


def test_compress_and_find_keys() -> None:
    keys = [{"op": "fp8_gemm_nt", "name": "s", "n": 256, "k": 512, "m": m, "entry": "e1" if m < 4 else "e2"}
            for m in range(1, 9)]
    rows = compress_keys(keys)
    assert rows == [["fp8_gemm_nt", "s", 256, 512, 1, 3, "e1"], ["fp8_gemm_nt", "s", 256, 512, 4, 8, "e2"]]
    section = {"keys": rows}
    assert [find_key(section, "fp8_gemm_nt", 256, 512, m) for m in (1, 3, 4, 8, 9)] == ["e1", "e1", "e2", "e2", None]


def _section(blob: bytes, name: str = "sm90_fp8_gemm_1d2d.0123") -> dict:
    return {"nvcc_version": "release 13.0", "entries": {name: {"cubin": hashlib.sha256(blob).hexdigest(),
                                                               "source": "// kernel.cu"}}, "keys": []}


def test_seed_writes_entries_and_checks_digests(tmp_path) -> None:
    blob = b"cubin bytes"
    section = _section(blob)
    root = seed(section, {hashlib.sha256(blob).hexdigest(): blob}.__getitem__, "b.nojit", base=str(tmp_path))
    entry = os.path.join(root, "cache", "sm90_fp8_gemm_1d2d.0123")
    assert open(os.path.join(entry, "kernel.cubin"), "rb").read() == blob
    assert os.path.exists(os.path.join(entry, ".committed")) and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK)
    os.chmod(os.path.join(entry, "kernel.cubin"), 0o644)
    with open(os.path.join(entry, "kernel.cubin"), "wb") as f:
        f.write(b"tampered")
    with pytest.raises(BundleCorruptError, match="does not match its sha256"):
        seed(section, lambda sha: blob, "b.nojit", base=str(tmp_path))


def test_seed_hashes_each_cubin_once_and_still_refuses_bad_bytes(tmp_path, monkeypatch) -> None:
    """Seeding hashed every cubin twice (before and after writing it, and twice again in each later process): once
    now, on the descriptor it is written through or as it lies. A bundle blob that is not its recorded sha256 is
    refused at the first write, and a cubin changed on disk at the next seed (the test above)."""
    from nojit.loader import private_dir

    blob = b"c" * 4099  # a size nothing else seeded has
    hashed: list[int] = []
    real = private_dir._hash_fd
    monkeypatch.setattr(private_dir, "_hash_fd", lambda fd: (hashed.append(os.fstat(fd).st_size), real(fd))[1])
    section = _section(blob)
    seed(section, lambda sha: blob, "b.nojit", base=str(tmp_path))
    assert hashed.count(len(blob)) == 1
    hashed.clear()
    seed(section, lambda sha: blob, "b.nojit", base=str(tmp_path))  # a later process: the entry is there
    assert hashed.count(len(blob)) == 1
    with pytest.raises(BundleCorruptError, match="does not match its sha256"):
        seed(section, lambda sha: b"not the recorded bytes", "b.nojit", base=str(tmp_path / "fresh"))


def test_seed_refuses_entry_names_outside_the_cache(tmp_path) -> None:
    with pytest.raises(BundleCorruptError, match="bad DeepGEMM entry name"):
        seed(_section(b"x", "../escape"), lambda sha: b"x", "b.nojit", base=str(tmp_path))


def test_deepgemm_own_lookup_finds_seeded_entries_without_a_process(tmp_path) -> None:
    from nojit.aot.deployment import load_deployment
    from nojit.aot.runtimes.deepgemm import enumerate as en
    from nojit.aot.runtimes.deepgemm.lookup import lookup_check
    from nojit.aot.runtimes.deepgemm.shapes import deepgemm_shapes

    need_deepgemm_toolkit()
    d = load_deployment()
    ms = [64]  # every M: test_strict_install_serves_every_m_... (this one shows a missing entry is refused)
    e = en.enumerate_keys(d, str(tmp_path / "enum"), ms=ms)
    per_shape = {s.name for shapes in deepgemm_shapes(d).values() for s in shapes}
    assert {k["name"] for k in e.keys} == per_shape and len(e.keys) == len(per_shape) * len(ms)
    blobs, entries = {}, {}
    for name in e.entries():  # placeholder cubins: the fake driver loads paths, it runs nothing
        data = f"placeholder {name}".encode()
        blobs[hashlib.sha256(data).hexdigest()] = data
        entries[name] = {"cubin": hashlib.sha256(data).hexdigest(), "source": "//"}
    section = {"deep_gemm_version": "2.8.1", "nvcc_version": e.nvcc_version, "entries": entries,
               "keys": compress_keys(e.keys)}
    good = lookup_check(d, section, blobs.__getitem__, str(tmp_path / "ok"), ms=ms)
    assert good["ok"], good
    assert good["probe_answered"] == 1 and good["keys"] == len(e.keys)
    if good["traced"]:
        assert good["processes_started"] == []
    # the check can fail: an entry the bundle lacks is refused (in process) and reported
    dropped = sorted(entries)[0]
    section_missing = dict(section, entries={n: v for n, v in entries.items() if n != dropped})
    bad = lookup_check(d, section_missing, blobs.__getitem__, str(tmp_path / "bad"), ms=ms)
    assert not bad["ok"] and bad["n_wrong"] >= 1 and bad["refused"] and "nvcc" in bad["refused"][0]
    if bad["traced"]:
        assert bad["processes_started"] == []


def test_strict_refusal_names_kernel_shape_and_m(tmp_path) -> None:
    """A refused compile (the firewall saw DeepGEMM's nvcc command) becomes KernelNotInBundleError."""
    from types import SimpleNamespace

    from nojit.loader.runtimes.deepgemm.popen import PopenFirewall
    from nojit.loader.runtimes.deepgemm.serving import DeepGemmServing, _wrap
    from nojit.loader.errors import KernelNotInBundleError
    from nojit.loader.settings import Mode

    staged = tmp_path / "tmp" / "123-abc"
    staged.mkdir(parents=True)
    (staged / "kernel.cu").write_text("#include <x>\nsm90_fp8_gemm_1d2d_impl<K, 0, 8192, 1024, 64, 32>\n")
    firewall = PopenFirewall(nvcc="/stub/nvcc", version_text="v")
    serving = DeepGemmServing(str(tmp_path), firewall, {"keys": []}, "b.nojit", {})

    def fp8_gemm_nt(a, b, d, **kw):  # stands in for DeepGEMM on a miss: its compile command is refused
        firewall.refused.append(f"cd {staged} && /stub/nvcc {staged}/kernel.cu --cubin 2>&1")
        raise RuntimeError("Assertion error (command.hpp:24): pipe != nullptr: failed to run command")

    module = SimpleNamespace(fp8_gemm_nt=fp8_gemm_nt)
    _wrap(serving, module, "fp8_gemm_nt", Mode.STRICT, None)
    tensor = lambda *shape: SimpleNamespace(shape=shape)  # noqa: E731
    with pytest.raises(KernelNotInBundleError) as info:
        module.fp8_gemm_nt((tensor(77, 1024), None), (tensor(8192, 1024), None), None)
    text = str(info.value)
    assert "deep_gemm:fp8_gemm_nt" in text and "N=8192 K=1024 M=77" in text
    assert "sm90_fp8_gemm_1d2d_impl<K, 0, 8192, 1024, 64, 32>" in text and "--add-keys" in text


# ------------------------------------------------------------------------------ the runtime in `nojit build`
FAKE_NVCC = """#!/bin/sh
# test stand-in for nvcc: the real nvcc's --version text (DeepGEMM hashes it into its entry names);
# a compile appends its arguments to compiles.log and writes a placeholder cubin that depends on the source
here=$(dirname "$0")
if [ "$1" = "--version" ]; then exec cat "$here/../version.txt"; fi
out=""; prev=""
for a in "$@"; do if [ "$prev" = "--output-file" ] || [ "$prev" = "-o" ]; then out=$a; fi; prev=$a; done
echo "$*" >> "$here/../compiles.log"
printf 'placeholder cubin for %s\\n' "$(cksum < "$1")" > "$out"
"""


def _fake_toolkit(root) -> dict[str, str]:
    """A CUDA toolkit folder whose nvcc answers like the real one and compiles nothing (placeholder cubins:
    the enumeration's fake driver loads paths and runs nothing); the real toolkit's headers for the stand-ins."""
    from nojit.aot.runtimes.deepgemm import enumerate as en

    real = en.find_nvcc()
    (root / "bin").mkdir(parents=True)
    os.symlink(en._cuda_include(real), root / "include")
    (root / "version.txt").write_text(subprocess.run([real, "--version"], capture_output=True, text=True).stdout)
    nvcc = root / "bin" / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    return {"NOJIT_NVCC": str(nvcc)}


def _compiles(root) -> int:
    log = root / "compiles.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture(scope="module")
def deepgemm_build(tmp_path_factory):
    """The default deployment's DeepGEMM entries built by `nojit build --runtime deepgemm`, nvcc faked."""
    need_deepgemm_toolkit()
    d = tmp_path_factory.mktemp("deepgemm")
    env = _fake_toolkit(d / "cuda")
    bundle, plan = str(d / "dg.nojit"), str(d / "dg.plan.json")
    run_cli("build", "--runtime", "deepgemm", "-o", bundle, "--emit-plan", plan, "--cache-dir", str(d / "cache"),
            "-j", "2", "--quiet", env=env)
    return {"dir": d, "env": env, "bundle": bundle, "plan": plan, "toolkit": d / "cuda"}


def test_build_compiles_each_entry_once_and_a_rebuild_none(deepgemm_build) -> None:
    """Every entry compiled once; a rebuild takes every request from the build's compile cache (in the parent,
    no worker, no nvcc) and writes the same bytes."""
    from nojit.aot.deployment import load_deployment
    from nojit.aot.runtimes.deepgemm.shapes import deepgemm_shapes
    from nojit.loader.bundle.file import Bundle

    b = deepgemm_build
    m = Bundle.open(b["bundle"]).manifest
    names = {e.launch.entry for e in m.entries}
    assert len(names) == len(m.entries) > 0 and _compiles(b["toolkit"]) == len(names)
    d = load_deployment()
    limit = {s.name: s.m_limit or d.max_num_batched_tokens for shapes in deepgemm_shapes(d).values() for s in shapes}
    calls = [c for e in m.entries for c in e.launch.calls]
    per_shape: dict = {}
    for shape, _n, _k, first, last in calls:
        per_shape.setdefault(shape, []).append((first, last))
    assert set(per_shape) == set(limit)
    for shape, ranges in per_shape.items():  # every M from 1 to the op's limit maps to exactly one entry
        ranges.sort()
        assert ranges[0][0] == 1 and ranges[-1][1] == limit[shape], shape
        assert all(a[1] + 1 == b2[0] for a, b2 in zip(ranges, ranges[1:]))
    ops = {k.rpartition(":")[2]: sum(1 for e in m.entries if e.kernel == k) for k in m.kernels}
    assert ops["fp8_fp4_mqa_logits"] >= 1 and ops["fp8_fp4_paged_mqa_logits"] >= 2  # next_n 1 and 2 (MTP 1)
    assert ops["get_paged_mqa_logits_metadata"] >= 1
    again = str(b["dir"] / "again.nojit")
    out = run_cli("build", "--from-plan", b["plan"], "--runtime", "deepgemm", "-o", again, "--cache-dir",
                  str(b["dir"] / "cache"), env=b["env"]).stdout
    assert f"{len(names)} of {len(names)} in the compile cache, 0 to compile" in out, out
    assert _compiles(b["toolkit"]) == len(names)  # the cache answered every entry
    assert open(again, "rb").read() == open(b["bundle"], "rb").read()


def test_inspect_and_coverage_show_deepgemm_entries(deepgemm_build) -> None:
    b = deepgemm_build
    text = run_cli("inspect", b["bundle"]).stdout
    assert re.search(r"vllm\.utils\.deep_gemm:fp8_gemm_nt\s+deepgemm\s+\d+", text), text
    keys = run_cli("inspect", b["bundle"], "--keys").stdout
    assert "sm90_fp8_gemm_1d2d." in keys
    cov = run_cli("coverage", b["bundle"], "--plan", b["plan"], "--fail-under", "100").stdout
    row = next(line for line in cov.splitlines() if line.startswith("vllm.utils.deep_gemm:fp8_gemm_nt"))
    assert row.split()[1] == "deepgemm" and row.split()[-1] == "100.0" and row.split()[-2] == "0"


def test_strict_install_serves_every_m_through_deepgemms_own_lookup_without_a_process(deepgemm_build, tmp_path) -> None:
    """Must-show 1: install(bundle, strict) with the compiler firewall up, then DeepGEMM's real op for every
    shape at every M = 1..8192 (exec-traced with strace when installed)."""
    from nojit.aot.deployment import load_deployment
    from nojit.aot.runtimes.deepgemm.lookup import bundle_lookup_check

    d = load_deployment()
    result = bundle_lookup_check(d, deepgemm_build["bundle"], str(tmp_path / "lookup"))
    assert result["ok"], {k: v for k, v in result.items() if k != "wrong"} | {"wrong": result.get("wrong")}
    assert result["keys"] == result["expected_keys"] and result["probe_answered"] == 1
    assert {"fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits", "get_paged_mqa_logits_metadata"} <= result["ops"]
    assert is_stand_in(result["nvcc_compiler"])  # DG_JIT_NVCC_COMPILER ends at strict mode's stand-in
    if result["traced"]:
        assert result["processes_started"] == []


def test_recorded_key_is_added_by_add_keys(deepgemm_build, tmp_path) -> None:
    """NOJIT_MODE=record's line for a DeepGEMM miss (M beyond the deployment's limit) -> `--add-keys`."""
    from nojit.loader.bundle.file import Bundle

    b = deepgemm_build
    m = Bundle.open(b["bundle"]).manifest
    kid = "vllm.utils.deep_gemm:fp8_gemm_nt"
    n, k = m.entries[0].launch.calls[0][1:3]
    paged = "vllm.utils.deep_gemm:fp8_fp4_paged_mqa_logits"
    record = tmp_path / "keys.jsonl"
    record.write_text(json.dumps({"kernel": kid, "runtime": "deepgemm", "outcome": "miss",
                                  "key": {"op": "fp8_gemm_nt", "n": n, "k": k, "m": 9000},
                                  "source_hash": m.kernels[kid].source_hash}) + "\n"
                      + json.dumps({"kernel": paged, "runtime": "deepgemm", "outcome": "miss",  # batch > max_num_seqs
                                    "key": {"op": "fp8_fp4_paged_mqa_logits", "n": 64, "k": 128, "m": 2000,
                                            "next_n": 2, "block_kv": 64, "max_context_len": 262144, "num_slots": 132},
                                    "source_hash": m.kernels[paged].source_hash}) + "\n")
    out = str(tmp_path / "more.nojit")
    run_cli("build", "--from-plan", b["plan"], "--runtime", "deepgemm", "--add-keys", str(record), "-o", out,
            "--cache-dir", str(b["dir"] / "cache"), "--quiet", env=b["env"])
    added = sorted((e for e in Bundle.open(out).manifest.entries if isinstance(e.key, dict)), key=lambda e: e.key["m"])
    assert len(added) == 2 and added[1].key["m"] == 9000 and added[1].origin.startswith("recorded:")
    assert added[1].launch.entry.startswith("sm90_fp8_gemm_1d2d.") and added[1].launch.calls[0][3:] == (9000, 9000)
    assert added[0].launch.entry.startswith("sm90_fp8_paged_mqa_logits.")
    assert added[0].launch.calls[0][3:] == (2000, 2000)


def test_call_key_decodes_what_add_keys_resolves() -> None:
    """Record mode's key of each served op carries what the enumeration needs to find DeepGEMM's entry again."""
    from types import SimpleNamespace

    from nojit.aot.runtimes.deepgemm.enumerate import recorded_op
    from nojit.loader.runtimes.deepgemm.serving import call_key

    t = lambda *shape: SimpleNamespace(shape=shape)  # noqa: E731
    gemm = call_key("fp8_gemm_nt", ((t(77, 1024), None), (t(8192, 1024), None), None))
    einsum = call_key("fp8_einsum", ("bhr,hdr->bhd", (t(5, 2, 4096), None), (t(2, 1024, 4096), None), None))
    hc = call_key("tf32_hc_prenorm_gemm", (t(9, 16384), t(24, 16384), None, None, 16))
    assert gemm == {"op": "fp8_gemm_nt", "n": 8192, "k": 1024, "m": 77}
    assert einsum == {"op": "fp8_einsum", "n": 1024, "k": 4096, "m": 5, "groups": 2}
    assert hc == {"op": "tf32_hc_prenorm_gemm", "n": 24, "k": 16384, "m": 9, "splits": 16}
    assert recorded_op(hc)["splits"] == [16] and recorded_op(einsum)["groups"] == 2
    prefill = call_key("fp8_fp4_mqa_logits", ((t(300, 64, 128), None), (t(900, 128), t(900)), t(300, 64), None, None,
                                              900))
    assert prefill == {"op": "fp8_fp4_mqa_logits", "n": 64, "k": 128, "m": 300}
    paged = call_key("fp8_fp4_paged_mqa_logits", ((t(7, 2, 64, 128), None), t(99, 64, 1, 132), t(14, 64), t(7, 2),
                                                  t(7, 40), t(133, 2)), {"max_model_len": 262144})
    assert paged == {"op": "fp8_fp4_paged_mqa_logits", "n": 64, "k": 128, "m": 7, "next_n": 2, "block_kv": 64,
                     "max_context_len": 262144, "num_slots": 132}
    assert recorded_op(paged)["next_n"] == 2 and recorded_op(paged)["max_context_len"] == 262144
    assert recorded_op(prefill)["ms"] == [300]
    schedule = call_key("get_paged_mqa_logits_metadata", (t(7, 2), 64, 132))
    assert schedule == {"op": "get_paged_mqa_logits_metadata", "n": 2, "k": 64, "m": 7, "next_n": 2, "block_kv": 64,
                        "num_slots": 132}
    assert call_key("m_grouped_fp8_gemm_nt_contiguous", ()) is None


def test_manifest_checks_deepgemm_launches() -> None:
    from nojit.loader.bundle.manifest import DeepGemmLaunch, _Fields

    good = {"entry": "sm90_fp8_gemm_1d2d.0123abcd", "source": "#include <x>\nint y;\n",
            "calls": [["attention.wq_b", 8192, 1024, 1, 31]]}
    launch = DeepGemmLaunch.from_json(_Fields(good, "launch", "b.nojit"))
    assert launch.calls == (("attention.wq_b", 8192, 1024, 1, 31),) and launch.to_json() == good
    for bad, field in (({"entry": "../x.00"}, "entry"), ({"entry": "sm90.xyz"}, "entry"),
                       ({"calls": [["s", 1, 2, 3]]}, "calls"), ({"source": "a\0b"}, "source")):
        with pytest.raises(BundleCorruptError, match=f"launch.{field}"):
            DeepGemmLaunch.from_json(_Fields({**good, **bad}, "launch", "b.nojit"))


def test_cache_inputs_cover_what_changes_an_entry() -> None:
    """The compile cache's inputs (aot/compile_cache.py digest) change with the generated source, the flags, the
    nvcc version text, the calls (the launch), the headers digest and the target facts; nothing else moves them."""
    from nojit.aot.compile_cache import digest_of
    from nojit.aot.plan import PlanKernel, PlanRequest
    from nojit.aot.runtimes.deepgemm.planner import cache_inputs

    kid = "vllm.utils.deep_gemm:fp8_fp4_paged_mqa_logits"
    info = {"op": "fp8_fp4_paged_mqa_logits", "deep_gemm_version": "2.8.1", "nvcc_version": "V13.0.88",
            "sm_count": 132, "pdl": True, "use_ue8m0": True}
    inputs = {"source": "sm90_fp8_paged_mqa_logits<2, 64>", "flags": ["-O3"], "calls": [["decode", 64, 128, 1, 1024]]}

    def digest(key="sm90_fp8_paged_mqa_logits.ab12", source_hash="h", info_=info, **changed) -> str:
        request = PlanRequest(kid, key, "exact", "derived:deepgemm", compile_inputs={**inputs, **changed})
        return digest_of(cache_inputs(request, PlanKernel("deepgemm", source_hash, [], dict(info_))))

    base = digest()
    assert digest() == base
    changed = [digest(source="sm90_fp8_paged_mqa_logits<1, 64>"), digest(flags=["-O2"]),
               digest(calls=[["decode", 64, 128, 1, 512]]), digest(source_hash="other headers"),
               digest(key="sm90_fp8_paged_mqa_logits.cd34"), digest(info_={**info, "nvcc_version": "V13.1.0"}),
               digest(info_={**info, "sm_count": 114})]
    assert base not in changed and len(set(changed)) == len(changed)
    recorded = PlanRequest(kid, {"op": "fp8_fp4_paged_mqa_logits", "m": 2000}, "exact", "recorded:x")
    assert "extension" in cache_inputs(recorded, PlanKernel("deepgemm", "h", [], info))  # heuristics resolve it


def test_package_setting_without_headers_is_a_typed_error(tmp_path, monkeypatch) -> None:
    """NOJIT_DEEPGEMM_PACKAGE (compiling a plan where vLLM is not installed) must name a folder with DeepGEMM's
    include/deep_gemm; anything else is refused naming the setting, before nvcc runs."""
    from nojit.aot.errors import BuildError
    from nojit.aot.runtimes.deepgemm.compile import deep_gemm_dir

    monkeypatch.setenv("NOJIT_DEEPGEMM_PACKAGE", str(tmp_path))
    with pytest.raises(BuildError, match="NOJIT_DEEPGEMM_PACKAGE=.* has no include/deep_gemm") as e:
        deep_gemm_dir()
    assert "vllm/third_party/deep_gemm" in e.value.fix
    os.makedirs(tmp_path / "include" / "deep_gemm")
    assert deep_gemm_dir() == str(tmp_path)
