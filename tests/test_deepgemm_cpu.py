"""DeepGEMM ahead of time on the CPU: the probe firewall, the seeded cache, and DeepGEMM's own lookup.

The lookup test runs vLLM's vendored DeepGEMM for real on a GPU-less box (its device queries and the
driver answered by the build-side stand-ins) and needs a C compiler and CUDA headers (nvcc's toolkit);
it is skipped without them. It takes about a minute.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from nojit.loader.deepgemm_cache import compress_keys, find_key, seed
from nojit.loader.errors import BundleCorruptError


def _extension() -> str:
    import vllm.third_party.deep_gemm  # noqa: F401 - only its path is read, nothing is imported from it

    pkg = os.path.dirname(vllm.third_party.deep_gemm.__file__)
    return os.path.join(pkg, next(n for n in os.listdir(pkg) if n.startswith("_C_extension")))


def test_extension_has_lazy_popen_slots() -> None:
    from nojit.loader.deepgemm_popen import plt_slots

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


def test_seed_refuses_entry_names_outside_the_cache(tmp_path) -> None:
    with pytest.raises(BundleCorruptError, match="bad DeepGEMM entry name"):
        seed(_section(b"x", "../escape"), lambda sha: b"x", "b.nojit", base=str(tmp_path))


def test_deepgemm_own_lookup_finds_seeded_entries_without_a_process(tmp_path) -> None:
    from nojit.aot.deployment import load_deployment
    from nojit.aot.runtimes.deepgemm import enumerate as en
    from nojit.aot.runtimes.deepgemm.lookup import lookup_check
    from nojit.aot.runtimes.deepgemm.shapes import fp8_gemm_nt_shapes

    try:
        en.find_nvcc()
    except Exception:  # noqa: BLE001
        pytest.skip("no CUDA toolkit (cuda.h, nvcc --version) on this box")
    if not shutil.which(os.environ.get("CC", "cc")):
        pytest.skip("no C compiler")
    d = load_deployment()
    ms = [1, 64, 4096]
    e = en.enumerate_keys(d, str(tmp_path / "enum"), ms=ms)
    per_shape = {s.name for s in fp8_gemm_nt_shapes(d)}
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

    from nojit.loader.deepgemm_popen import PopenFirewall
    from nojit.loader.deepgemm_serving import DeepGemmServing, _wrap
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
