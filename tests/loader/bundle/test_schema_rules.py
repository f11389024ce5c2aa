"""One test per guard of the reader and the schema: removing any one guard makes a test here fail.

Each case starts from one valid bundle (checked to load), changes one thing, re-seals the file
(digests right, so the change reaches the guard under test) and expects a typed error naming
the field. Fast and deterministic: the mutation run uses these as its test command.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys

import pytest
import zstandard

from nojit.loader import settings as settings_mod
from nojit.loader.bundle.file import HEADER, MAX_MANIFEST_BYTES, Bundle, Header
from nojit.loader.errors import BundleCorruptError, BundleError, BundleMismatchError, NoJitError
from nojit.loader.bundle.launch_expr import evaluate, validate_expr
from nojit.loader.bundle.manifest import FORMAT_VERSION, MAX_CUBIN_BYTES

from tests.support.bundle_bytes import index_json, index_offset, seal, with_index

CUBIN_A = b"\x7fELF cubin A" + bytes(range(200))
CUBIN_B = b"\x7fELF cubin B" + bytes(range(100, 250))
SHA_A, SHA_B = (hashlib.sha256(c).hexdigest() for c in (CUBIN_A, CUBIN_B))


def valid() -> tuple[dict, dict]:
    triton_launch = {"symbol": "k", "num_warps": 4, "num_ctas": 1, "cluster_dims": [1, 1, 1], "shared": 16,
                     "global_scratch_size": 0, "global_scratch_align": 1, "profile_scratch_size": 0,
                     "profile_scratch_align": 1, "launch_pdl": False, "launch_cooperative_grid": False,
                     "args": [[0, "p"], [1, "i"], [3, "f"]], "compile_hash": "ab" * 32}
    spec = [["*fp32", "D"], ["i32", "D"], ["constexpr", ["int", 64]], ["fp32", None]]
    tl_launch = {"symbol": "tl", "params": [{"kind": "tensor", "name": "a"}, {"kind": "tensor", "name": "b"},
                                            {"kind": "scalar", "name": "num_tokens", "ctype": "int32"}],
                 "tensor_params": [{"name": "a", "dtype": "bfloat16", "shape": [{"var": "num_tokens"}, 64]},
                                   {"name": "b", "dtype": "float32", "shape": [{"var": "num_tokens"}]}],
                 "dynamic_vars": {"num_tokens": {"param": "a", "dim": 0}},
                 "grid": [{"op": "//", "args": [{"op": "+", "args": [{"var": "num_tokens"}, 3]}, 4]}, 1, 1],
                 "block": [128, 1, 1], "dynamic_smem": 1024, "pdl": True, "cluster_dims": None, "cooperative": False}
    manifest = {
        "format": FORMAT_VERSION,
        "producer": {"nojit": "0.1.0", "vllm": "0.33.0", "triton": "3.8.0", "tilelang": "0.1.12", "ptxas": None,
                     "nvcc": None, "python": "3.11.7", "torch": "2.14.0"},
        "target": {"backend": "cuda", "capability": 90, "arch": "sm_90a", "warp_size": 32},
        "deployment": {"name": "rules"},
        "kernels": {"vllm.m:k": {"runtime": "triton", "source_hash": "1" * 64, "params": ["x", "n", "BLOCK", "s"],
                                 "info": {}},
                    "vllm.t:tl": {"runtime": "tilelang", "source_hash": "2" * 64, "params": ["a", "b", "block"],
                                  "info": {}}},
        "entries": [
            {"kernel": "vllm.m:k", "key": {"spec": spec, "options": [["num_warps", ["int", 4]]]}, "variant": "exact",
             "blob": SHA_A, "launch": triton_launch, "origin": "declared"},
            {"kernel": "vllm.t:tl", "key": {"args": [["block", ["int", 64]]]}, "variant": "exact", "blob": SHA_B,
             "launch": tl_launch, "origin": "declared"},
        ],
        "blobs": {},
    }
    return manifest, {SHA_A: CUBIN_A, SHA_B: CUBIN_B}


def write(tmp_path, data: bytes, name: str = "b.nojit") -> str:
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def refused(tmp_path, manifest: dict, match: str, blobs: dict | None = None, error=BundleCorruptError) -> None:
    path = write(tmp_path, seal(manifest, valid()[1] if blobs is None else blobs))
    with pytest.raises(error, match=match) as info:
        b = Bundle.open(path)
        b.verify()
    assert path in info.value.message and info.value.fix


def test_the_base_bundle_is_valid(tmp_path):
    m, blobs = valid()
    b = Bundle.open(write(tmp_path, seal(m, blobs)))
    assert b.verify() == 2 and len(b.manifest.entries) == 2
    assert b.read_blob(SHA_A) == CUBIN_A


def _edit(fn):
    m, _ = valid()
    fn(m)
    return m


T = lambda m: m["entries"][0]  # noqa: E731  the Triton entry
L = lambda m: m["entries"][1]  # noqa: E731  the TileLang entry


@pytest.mark.parametrize("edit, match", [
    (lambda m: T(m)["launch"].update(num_warps=64), r"num_warps = 64 is outside"),
    (lambda m: T(m)["launch"].update(num_warps=0), r"num_warps = 0 is outside"),
    (lambda m: T(m)["launch"]["args"].__setitem__(2, [4095, "f"]), r"launch.args passes parameters"),
    (lambda m: T(m)["launch"]["args"].__setitem__(2, [4096, "f"]), r"malformed item"),
    (lambda m: T(m)["launch"]["args"].__setitem__(1, [1, "q"]), r"malformed item"),
    (lambda m: T(m)["launch"]["args"].__setitem__(1, [1, "p"]), r"passes parameter 1 \(i32\) as 'p', expected 'i'"),
    (lambda m: T(m)["launch"]["args"].__setitem__(0, [0, "l"]), r"passes parameter 0 \(\*fp32\) as 'l'"),
    (lambda m: T(m)["launch"]["args"].reverse(), r"not increasing"),
    (lambda m: T(m)["launch"]["args"].pop(), r"launch.args passes parameters \[0, 1\]"),
    (lambda m: T(m)["launch"]["args"].insert(2, [2, "i"]), r"launch.args passes parameters"),
    (lambda m: T(m)["launch"].update(cluster_dims=[65536, 65536, 1]), r"cluster_dims is not three integers"),
    (lambda m: T(m)["launch"].update(cluster_dims=[4, 4, 2]), r"holds more than 16 blocks"),
    (lambda m: T(m)["launch"].update(cluster_dims=[0, 1, 1]), r"cluster_dims"),
    (lambda m: T(m)["launch"].update(symbol="k\0evil"), r"symbol holds a NUL"),
    (lambda m: T(m)["launch"].update(shared=1 << 21), r"shared = .* is outside"),
    (lambda m: T(m)["key"]["spec"].pop(), r"has 3 items for 4 parameters"),
    (lambda m: T(m).update(key={"args": 5}), r"is not a Triton key"),
    (lambda m: T(m)["key"]["spec"].__setitem__(2, ["constexpr", ["int", {}]]), r"is not a Triton key"),
    (lambda m: T(m)["key"]["spec"].__setitem__(2, ["constexpr", ["float", "1e999"]]), r"is not a Triton key"),
    (lambda m: T(m)["key"]["spec"].__setitem__(2, ["constexpr", ["module", "os"]]), r"unknown value type"),
    (lambda m: T(m)["key"]["spec"].__setitem__(0, ["*fp32", "X"]), r"pointer attribute"),
    (lambda m: T(m)["key"]["options"].append(["num_warps", ["int", 8]]), r"is not a distinct"),
    (lambda m: T(m)["key"].update(extra=1), r"is not a Triton key"),
    (lambda m: T(m).update(variant="other"), r"variant = 'other'"),
    # an entry of a kernel the index does not list lies in a section no kernel points to: a hole in the layout
    (lambda m: T(m).update(kernel="vllm.m:missing"), r"blobs and sections end at"),
    (lambda m: T(m).update(blob="f" * 64), r"names a blob ffffffffffff"),
    (lambda m: T(m).update(blob="F" * 64), r"not a lowercase sha256"),
    (lambda m: m["entries"].append(copy.deepcopy(T(m))), r"has two exact entries"),
    (lambda m: m["kernels"].update({"vllm.m:k": dict(m["kernels"]["vllm.m:k"], runtime="cuda")}), r"runtime"),
    (lambda m: m["kernels"].__setitem__("vllm.m:a.__class__", m["kernels"].pop("vllm.m:k")), r"is not module:qualname"),
    (lambda m: m["kernels"]["vllm.m:k"]["params"].__setitem__(0, "x y"), r"not an identifier"),
    (lambda m: L(m)["launch"]["tensor_params"][0].pop("dtype"), r"tensor_params\[\]\.dtype is missing"),
    (lambda m: L(m)["launch"]["tensor_params"][0].update(dtype="__class__"), r"not a torch dtype"),
    (lambda m: L(m)["launch"]["tensor_params"][1].update(name="a"), r"listed twice"),
    (lambda m: L(m)["launch"]["tensor_params"][0].update(shape=[{"op": []}]), r"shape holds an invalid"),
    (lambda m: L(m)["launch"]["dynamic_vars"]["num_tokens"].update(param="zz"), r"not a tensor parameter"),
    (lambda m: L(m)["launch"]["dynamic_vars"]["num_tokens"].update(dim=2), r"dim = 2 is outside \[0, 1\]"),
    (lambda m: L(m)["launch"]["params"][2].update(name="split_k"), r"is not a dynamic variable"),
    (lambda m: L(m)["launch"]["params"][0].update(name="c"), r"'c' is not a tensor parameter"),
    (lambda m: L(m)["launch"]["params"][2].update(ctype="float"), r"ctype is not int32"),
    (lambda m: L(m)["launch"]["grid"].__setitem__(1, {"var": "split_k"}), r"grid holds an invalid expression"),
    (lambda m: L(m)["launch"]["grid"].__setitem__(1, {"var": []}), r"grid holds an invalid expression"),
    (lambda m: L(m)["launch"]["block"].__setitem__(0, {"op": [], "args": [1, 2]}), r"block holds an invalid"),
    (lambda m: L(m)["launch"].update(block=[64, 32, 1]), r"not 1 to 1024 threads"),
    (lambda m: L(m)["launch"]["block"].__setitem__(0, 2048), r"is not a launch size"),
    (lambda m: L(m)["launch"]["grid"].__setitem__(2, 1 << 40), r"is not a launch size"),
    (lambda m: L(m)["launch"].update(cluster_dims=[65536, 65536, 1]), r"cluster_dims"),
    (lambda m: L(m).update(key={"args": 5}), r"is not a TileLang key"),
    (lambda m: L(m)["key"]["args"].append(["block", ["int", 32]]), r"is not a TileLang key"),
    (lambda m: m["entries"].append(dict(copy.deepcopy(L(m)), key={"args": [["block", ["int", 32]]]},
                                        launch=dict(L(m)["launch"], tensor_params=L(m)["launch"]["tensor_params"][::-1]))),
     r"disagree on its tensor parameters"),
    (lambda m: T(m).update(key={"spec": [["*fp32", "D"], ["i32", "D"], ["constexpr", ["float", float("nan")]],
                                         ["fp32", None]], "options": []}), r"non-finite"),
    (lambda m: m["target"].update(capability=True), r"capability has type bool"),
    (lambda m: m["producer"].update(nojit="0.1\0"), r"NUL"),
    (lambda m: m.update(format=3), r"bundle format 3"),
])
def test_each_schema_guard(tmp_path, edit, match):
    m = _edit(edit)
    refused(tmp_path, m, match, error=BundleError)


def test_key_depth_is_bounded(tmp_path):
    deep = ["int", 1]
    for _ in range(20):
        deep = ["tuple", [deep]]
    refused(tmp_path, _edit(lambda m: T(m)["key"]["spec"].__setitem__(2, ["constexpr", deep])), r"nested too deeply")


def _raw(manifest: dict, blobs: dict) -> bytes:
    return seal(manifest, blobs)


_reseal = with_index  # the file with its index replaced (digest right)
_manifest_json = index_json


def test_duplicate_json_keys_and_trailing_json_are_refused(tmp_path):
    m, blobs = valid()
    data = _raw(m, blobs)
    raw = _manifest_json(data)
    dup = raw.replace(b'"format": 2', b'"format": 2, "format": 2', 1)
    assert dup != raw
    with pytest.raises(BundleCorruptError, match="'format' appears twice"):
        Bundle.open(write(tmp_path, _reseal(data, dup)))
    with pytest.raises(BundleCorruptError, match="not valid JSON"):
        Bundle.open(write(tmp_path, _reseal(data, raw + b" []")))


def test_layout_trailing_bytes_gaps_and_blobs_past_the_end(tmp_path):
    m, blobs = valid()
    data = _raw(m, blobs)
    with pytest.raises(BundleCorruptError, match="bytes follow the index"):
        Bundle.open(write(tmp_path, data + b"\0"))
    man = json.loads(_manifest_json(data))
    first = min(man["blobs"].values(), key=lambda r: r["offset"])
    first["offset"] += 1
    first["length"] -= 1
    with pytest.raises(BundleCorruptError, match="expected at 72"):
        Bundle.open(write(tmp_path, _reseal(data, json.dumps(man).encode())))
    man = json.loads(_manifest_json(data))
    last = max(man["blobs"].values(), key=lambda r: r["offset"])
    last["length"] = len(data)
    with pytest.raises(BundleCorruptError, match="runs past the end of the file"):
        Bundle.open(write(tmp_path, _reseal(data, json.dumps(man).encode())))
    man = json.loads(_manifest_json(data))
    last = max(man["blobs"].values(), key=lambda r: r["offset"])
    last["length"] -= 1
    with pytest.raises(BundleCorruptError, match="section of kernel .* expected at"):
        Bundle.open(write(tmp_path, _reseal(data, json.dumps(man).encode())))
    man = json.loads(_manifest_json(data))
    last = max((k["section"] for k in man["kernels"].values()), key=lambda r: r["offset"])
    last["length"] -= 1
    with pytest.raises(BundleCorruptError, match="blobs and sections end at"):
        Bundle.open(write(tmp_path, _reseal(data, json.dumps(man).encode())))


def _blob_bundle(tmp_path, frame: bytes, sha: str, size: int) -> str:
    man = {"format": FORMAT_VERSION, "producer": {"nojit": "0", "python": "3"}, "target": {"backend": "cuda",
           "capability": 90, "arch": "sm_90a", "warp_size": 32}, "deployment": {}, "kernels": {},
           "blobs": {sha: {"offset": HEADER.size, "length": len(frame), "size": size}}}
    return write(tmp_path, with_index(b"\0" * HEADER.size + frame, json.dumps(man).encode(),
                                      offset=HEADER.size + len(frame)))


@pytest.mark.parametrize("case, match", [
    ("ok", None),
    ("other bytes", "fails its sha256 check"),
    ("size", "frame declares"),
    ("trailing", "bytes follow the zstandard frame"),
    ("truncated", "truncated|does not decompress"),
    ("no content size", "frame declares"),
    ("two frames", "bytes follow the zstandard frame"),
])
def test_cubin_frames(tmp_path, case, match):
    raw = b"\x7fELF" + bytes(range(256)) * 8
    sha = hashlib.sha256(raw).hexdigest()
    c = zstandard.ZstdCompressor(write_content_size=True, write_checksum=True)
    frame, size = c.compress(raw), len(raw)
    if case == "other bytes":
        frame = c.compress(raw[:-1] + b"X")
    elif case == "size":
        size += 1
    elif case == "trailing":
        frame += b"\0\0"
    elif case == "truncated":
        frame = frame[:-3]
    elif case == "no content size":
        frame = zstandard.ZstdCompressor(write_content_size=False).compress(raw)
    elif case == "two frames":
        frame += c.compress(b"")
    b = Bundle.open(_blob_bundle(tmp_path, frame, sha, size))
    if match is None:
        assert b.read_blob(sha) == raw and b.verify() == 1
    else:
        with pytest.raises(BundleCorruptError, match=match):
            b.read_blob(sha)


def test_blob_and_manifest_size_caps(tmp_path):
    big = zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * (MAX_CUBIN_BYTES + 1))
    with pytest.raises(BundleCorruptError, match=r"size = \d+ is outside"):
        Bundle.open(_blob_bundle(tmp_path, big, "0" * 64, MAX_CUBIN_BYTES + 1))
    m, blobs = valid()
    data = _raw(m, blobs)
    with pytest.raises(BundleCorruptError, match="out of range"):
        Bundle.open(write(tmp_path, _reseal(data, _manifest_json(data), declared=MAX_MANIFEST_BYTES + 1)))
    # a frame far longer than its content could ever need is refused before it is hashed or inflated
    raw = _manifest_json(data)
    padded = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(raw)
    header = Header(FORMAT_VERSION, 0, index_offset(data), len(padded) + (1 << 20), len(raw), b"\0" * 32)
    with pytest.raises(BundleCorruptError):
        Bundle.open(write(tmp_path, header.pack() + data[HEADER.size:header.index_offset] + padded + b"\0" * (1 << 20)))


def test_pinned_digest(tmp_path):
    m, blobs = valid()
    data = _raw(m, blobs)
    path = write(tmp_path, data)
    digest = hashlib.sha256(data).hexdigest()
    assert Bundle.open(path, expected_sha256=digest).verify() == 2
    assert Bundle.open(path, expected_sha256=digest.upper()).verify() == 2
    with pytest.raises(BundleMismatchError, match="NOJIT_BUNDLE_SHA256 pins"):
        Bundle.open(path, expected_sha256="0" * 64)
    with pytest.raises(BundleError, match="is not a sha256 hex digest"):
        Bundle.open(path, expected_sha256="abc")
    # checked before parsing: a damaged file with the wrong pin is a pin error, not a parse error
    with pytest.raises(BundleMismatchError, match="pins"):
        Bundle.open(write(tmp_path, b"garbage", "g.nojit"), expected_sha256=digest)


def test_a_replaced_file_is_never_read_again(tmp_path):
    """A redeploy renames a new bundle over the path: the open bundle keeps serving the old file's cubins."""
    m, blobs = valid()
    path = write(tmp_path, _raw(m, blobs))
    b = Bundle.open(path)
    other = {hashlib.sha256(b"\x7fELF new").hexdigest(): b"\x7fELF new"}
    m2 = copy.deepcopy(m)
    for e in m2["entries"]:
        e["blob"] = next(iter(other))
    new = write(tmp_path, seal(m2, other), "new.nojit")
    os.replace(new, path)
    assert b.read_blob(SHA_A) == CUBIN_A and b.read_blob(SHA_B) == CUBIN_B
    os.unlink(path)
    assert b.verify() == 2
    b.close()
    with pytest.raises(BundleError, match="closed"):
        b.read_blob(SHA_A)


def test_unreadable_paths_are_typed(tmp_path):
    with pytest.raises(BundleError, match="does not exist"):
        Bundle.open(str(tmp_path / "none"))
    with pytest.raises(BundleError, match="directory"):
        Bundle.open(str(tmp_path))


@pytest.mark.parametrize("bad", [{"var": []}, {"op": []}, {"op": [], "args": [1, 2]}, {"var": "n", "x": 1}])
def test_expression_shapes_that_used_to_escape(bad):
    with pytest.raises(ValueError):
        validate_expr(bad, {"n"})


def test_expression_evaluation_bounds():
    from nojit.loader.errors import LaunchError

    validate_expr(1 << 62, set())
    validate_expr(-(1 << 62), set())
    for bad in ((1 << 62) + 1, -(1 << 62) - 1):
        with pytest.raises(ValueError, match="out of range"):
            validate_expr(bad, set())
    with pytest.raises(LaunchError, match="outside"):
        evaluate({"op": "-", "args": [0, 1]}, {})
    assert evaluate(0, {}) == 0
    assert evaluate({"op": "select", "args": [{"var": "n"}, 2, 3]}, {"n": 0}) == 3
    assert evaluate({"op": "select", "args": [{"var": "n"}, 2, 3]}, {"n": 5}) == 2
    with pytest.raises(LaunchError):
        evaluate(1 << 32, {})
    assert evaluate((1 << 32) - 1, {}) == (1 << 32) - 1


def test_allow_mismatch_words(monkeypatch):
    s = settings_mod.settings
    monkeypatch.setenv("NOJIT_ALLOW_MISMATCH", "Triton, SOURCE")
    assert s.allow_mismatch == frozenset({"triton", "source"})
    for bad in ("all", "triton,everything", "*"):
        monkeypatch.setenv("NOJIT_ALLOW_MISMATCH", bad)
        with pytest.raises(NoJitError, match="is not one of vllm, triton, tilelang, cutedsl, flashinfer_cute, arch, source") as info:
            s.allow_mismatch
        assert "there is no 'all'" in info.value.fix
    monkeypatch.setenv("NOJIT_ALLOW_MISMATCH", "")
    assert s.allow_mismatch == frozenset()


def test_cutedsl_tool_versions_are_a_row_of_the_one_allow_table(monkeypatch, caplog):
    """CuTeDSL's tool versions were refused with no allow word; they are the `cutedsl` row of the one table
    (settings.TOOL_FACTS): another nvidia-cutlass-dsl is refused, naming the word, whatever other word is given,
    and served, with a warning, when `cutedsl` is. Expected versions: read from package metadata directly."""
    import importlib.metadata as md
    from types import SimpleNamespace

    from nojit.loader.runtimes.cutedsl.serving import check_tools
    from nojit.loader.settings import MISMATCH_FACTS, TOOL_FACTS

    tools = ("nvidia-cutlass-dsl", "apache-tvm-ffi", "quack-kernels")
    assert TOOL_FACTS["cutedsl"] == tools and MISMATCH_FACTS == tuple(TOOL_FACTS)

    def here(tool: str) -> str | None:
        try:
            return md.version(tool)
        except md.PackageNotFoundError:
            return None

    same = {tool: here(tool) for tool in tools}
    check_tools(SimpleNamespace(id="vllm.m:owner", info=same), "b.nojit", frozenset())  # the versions built with
    other = SimpleNamespace(id="vllm.m:owner", info={**same, "nvidia-cutlass-dsl": "0.0.0"})
    everything_else = frozenset(w for w in MISMATCH_FACTS if w != "cutedsl")
    with pytest.raises(BundleMismatchError, match=r"nvidia-cutlass-dsl 0\.0\.0 \(bundle\)") as info:
        check_tools(other, "b.nojit", everything_else)
    assert "NOJIT_ALLOW_MISMATCH=cutedsl" in info.value.fix
    with caplog.at_level("WARNING", logger="nojit"):
        check_tools(other, "b.nojit", frozenset({"cutedsl"}))
    assert any("nvidia-cutlass-dsl 0.0.0" in r.getMessage() and "NOJIT_ALLOW_MISMATCH=cutedsl" in r.getMessage()
               for r in caplog.records)
    monkeypatch.setenv("NOJIT_ALLOW_MISMATCH", "CuTeDSL")
    assert settings_mod.settings.allow_mismatch == frozenset({"cutedsl"})


def test_package_location_is_one_function_its_three_users_share(tmp_path, monkeypatch):
    """"Where is package X installed" is packages.package_dirs for a bundle wheel's package (installed_bundles),
    a tool's dist-info (versions) and vLLM's files (installed_modules): a package planted first on sys.path moves
    all three."""
    from nojit.loader import installed_modules, packages
    from nojit.loader.bundle import installed as installed_bundles
    from nojit.loader.bundle import versions

    pkg = tmp_path / "nojit_probe_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise SystemExit('imported')\n")
    dist = tmp_path / "nojit_probe_pkg-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nojit_probe_pkg\nVersion: 1.2.3\n\n")
    (dist / "RECORD").write_text("nojit_probe_pkg/__init__.py,,\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert packages.package_dirs("nojit_probe_pkg") == (str(pkg),) and "nojit_probe_pkg" not in sys.modules
    assert packages.package_dirs("nojit_no_such_pkg") == () and packages.package_dirs("os") == ()  # a plain module
    assert versions.dist_info_dir is packages.dist_info_dir and installed_modules.dist_info_dir is packages.dist_info_dir
    assert versions.installed_version("nojit_probe_pkg") == "1.2.3"
    assert installed_modules.is_installed_file("nojit_probe_pkg", str(pkg / "__init__.py"))
    assert not installed_modules.is_installed_file("nojit_probe_pkg", str(tmp_path / "elsewhere.py"))
    assert installed_bundles.package_dirs is packages.package_dirs
    assert "nojit_probe_pkg" not in sys.modules


def test_kernel_ids_import_only_installed_package_modules(tmp_path, monkeypatch):
    """`this:s` printed the Zen of Python; a planted module's top-level code ran. Neither is imported now."""
    from nojit.loader.resolve import resolve_installed

    planted = tmp_path / "planted_nojit_probe.py"
    planted.write_text("raise SystemExit('planted module ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for kid in ("this:s", "planted_nojit_probe:x", "os:system", "vllm..x:y", "vllm.planted_nojit_probe:x"):
        with pytest.raises(BundleMismatchError, match="nojit imports nothing else"):
            resolve_installed(kid)
        with pytest.raises(BundleMismatchError):
            resolve_installed(kid, packages=())
    assert "this" not in sys.modules and "planted_nojit_probe" not in sys.modules


def test_driver_errors_name_kernel_key_and_bundle():
    from types import SimpleNamespace

    from nojit.loader.launch.cuda_launch import BundledFunction

    entry = SimpleNamespace(kernel="vllm.m:k", variant="exact", key={"spec": [["i32", "D"]], "options": []}, blob="0" * 64)
    f = BundledFunction(SimpleNamespace(path="/srv/b.nojit"), entry, "k", 0, None)
    text = f.where()
    assert "kernel vllm.m:k" in text and '[["i32","D"]]' in text and "bundle /srv/b.nojit" in text


def test_internal_errors_are_contained_outside_strict_mode(caplog):
    from nojit.loader.errors import LaunchError
    from nojit.loader.policy import ServingPolicy
    from nojit.loader.settings import Mode

    assert not ServingPolicy(Mode.STRICT, "b.nojit").contain("vllm.m:k", LaunchError("boom"))
    p = ServingPolicy(Mode.PERMISSIVE, "b.nojit")
    assert p.contain("vllm.m:k", LaunchError("boom")) and p.contain("vllm.m:k", LaunchError("boom"))
    assert p.summary() == {"contained": 2}
    assert sum("failed in the loader" in r.message for r in caplog.records) == 1  # once per kernel


def test_tagged_values_round_trip_and_stay_distinct():
    """tag() and check_tagged(): True, 1 and 1.0 distinct; non-finite floats by name; wrappers unwrapped."""
    from nojit.loader.bundle.key_values import UnsupportedArgument, check_tagged, tag

    class dtype:  # noqa: N801  stands for triton.language.dtype (tag looks at the class name only)
        def __str__(self):
            return "fp32"

    class constexpr:  # noqa: N801
        value = 3

    class JITFunction:
        cache_key = "c" * 8

    cases = [(True, ("bool", True)), (1, ("int", 1)), (1.0, ("float", 1.0)), ("x", ("str", "x")),
             (None, ("NoneType", None))]
    for value, want in cases:
        assert tag(value) == want and type(tag(value)[1]) is type(want[1])
        check_tagged(list(want))
    assert tag(float("inf")) == ("float", "inf") and tag(float("-inf")) == ("float", "-inf")
    assert tag(float("nan")) == ("float", "nan")
    assert tag(dtype()) == ("dtype", "fp32") and tag(constexpr()) == ("int", 3) and tag(JITFunction()) == ("jit", "c" * 8)
    assert tag((1, True)) == ("tuple", (("int", 1), ("bool", True)))
    check_tagged(["tuple", [["int", 1], ["bool", True]]])
    with pytest.raises(UnsupportedArgument):
        tag([1])
    with pytest.raises(UnsupportedArgument):
        tag(object())
    check_tagged(["dtype", "fp32"])
    check_tagged(["jit", "abc"])
    check_tagged(["float", "nan"])
    for bad in (["int", True], ["bool", 1], ["float", "1e5"], ["str", 1], ["NoneType", 0], ["tuple", 5], ["int"],
                "int", ["x", 1], [1, 1], ["tuple", [["int", "no"]]], 5, None, ["int", 1, 2]):
        with pytest.raises(ValueError):
            check_tagged(bad)
    deep = ["int", 1]
    for _ in range(9):
        deep = ["tuple", [deep]]
    with pytest.raises(ValueError, match="deeply"):
        check_tagged(deep)
    ok = ["int", 1]
    for _ in range(8):
        ok = ["tuple", [ok]]
    check_tagged(ok)


def test_install_checks_allow_mismatch_words_like_the_environment():
    from nojit.loader.install import _allowed_words

    assert _allowed_words(frozenset({"Triton", "vllm"})) == frozenset({"triton", "vllm"})
    with pytest.raises(NoJitError, match="'all' is not one of"):
        _allowed_words(["all"])
