"""Hostile and damaged bundles: every case refused with a typed error, or loaded identical to the original.

Two families, both counted per validation stage (the table is printed; run with -s to see it):

* structure-aware: hypothesis builds a VALID manifest (Triton and TileLang kernels, keys, launch
  plans, blobs), then breaks exactly one field (wrong type, missing, out of range, NUL in a name,
  dangling cross-reference, duplicate entry) and re-seals the file (correct digests), so the
  break reaches the schema instead of stopping at a checksum;
* byte-level: damage to a real bundle (the `small_build` fixture when vLLM is installed, else a
  written one): flips, truncations, insertions, header fields, and damage inside the manifest
  JSON re-sealed behind a valid digest.

Memory and time are capped in the test: tracemalloc peak and wall time per case, and the
decompression bombs run in a subprocess under RLIMIT_AS. NOJIT_FUZZ_EXAMPLES raises the number of
cases (default keeps CI at about a minute); NOJIT_FUZZ_BUNDLE damages another real bundle.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nojit.loader.bundle.file import HEADER, MAX_MANIFEST_BYTES, Bundle
from nojit.loader.errors import NoJitError
from nojit.loader.bundle.manifest import FORMAT_VERSION

from tests.support.bundle_bytes import index_json, seal, with_index

EXAMPLES = int(os.environ.get("NOJIT_FUZZ_EXAMPLES", "150"))
MEM_CAP = 64 << 20  # bytes a single open + verify may allocate (tracemalloc peak)
TIME_CAP = 5.0  # seconds per case on a loaded 2-core box

STAGES = ("header", "digest", "decompress", "json", "schema", "layout", "cubin", "loaded",
          "loaded (valid edit)")
# Index: read at open; a kernel's section: at its first use (here: b.manifest reads them all).
_STAGE_OF = [
    (r"too short|not a nojit bundle|bundle format|header flags|lies outside|index size|index frame", "header"),
    (r"truncated index|(index|section) digest mismatch|sha256 .* pins|section of kernel \S+ is truncated", "digest"),
    (r"(index|section of kernel \S+)(: frame| does not decompress|: the zstandard|: bytes follow|: decompresses|"
     r": \d+ bytes after)", "decompress"),
    (r"not valid JSON", "json"),
    (r"manifest field|has two .* entries|entries disagree", "schema"),
    (r"follow the index|sections end at|expected at", "layout"),
    (r"cubin", "cubin"),
]


def stage_of(exc: NoJitError) -> str:
    for pattern, stage in _STAGE_OF:
        if re.search(pattern, exc.message):
            return stage
    raise AssertionError(f"error of no known stage: {exc.message}")


def print_table(title: str, counts: Counter) -> None:
    total = sum(counts.values())
    print(f"\n{title}: {total} cases")
    for stage in STAGES:
        print(f"  {stage:<16} {counts.get(stage, 0):6d}")


# ------------------------------------------------------------------ valid manifests
def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _tagged():
    return st.one_of(st.tuples(st.just("int"), st.integers(-(1 << 40), 1 << 40)), st.tuples(st.just("bool"), st.booleans()),
                     st.tuples(st.just("str"), st.sampled_from(["ieee", "tf32", "x"])),
                     st.tuples(st.just("NoneType"), st.none())).map(list)


@st.composite
def triton_kernel(draw, name: str):
    n = draw(st.integers(1, 6))
    params = [f"p{i}" for i in range(n)]
    spec, args = [], []
    for i in range(n):
        kind = draw(st.sampled_from(["ptr", "i32", "i64", "fp32", "constexpr"]))
        if kind == "ptr":
            spec.append([draw(st.sampled_from(["*fp32", "*bf16", "*i32"])), draw(st.sampled_from(["D", ""]))])
            args.append([i, "p"])
        elif kind == "constexpr":
            spec.append(["constexpr", draw(_tagged())])
        else:
            spec.append([kind, draw(st.sampled_from([None, "D", ""])) if kind != "fp32" else None])
            args.append([i, {"i32": "i", "i64": "l", "fp32": "f"}[kind]])
    options = [["num_warps", ["int", draw(st.sampled_from([1, 2, 4, 8]))]]]
    num_ctas = draw(st.sampled_from([1, 2]))
    launch = {"symbol": name.replace(".", "_"), "num_warps": draw(st.sampled_from([1, 4, 8])), "num_ctas": num_ctas,
              "cluster_dims": [num_ctas, 1, 1], "shared": draw(st.integers(0, 1 << 17)), "global_scratch_size": 0,
              "global_scratch_align": 1, "profile_scratch_size": 0, "profile_scratch_align": 1,
              "launch_pdl": draw(st.booleans()), "launch_cooperative_grid": False, "args": args,
              "compile_hash": "ab" * 32}
    record = {"runtime": "triton", "source_hash": "1" * 64, "params": params, "info": {"constexpr": []}}
    return record, {"spec": spec, "options": options}, launch


@st.composite
def tilelang_kernel(draw, name: str):
    tensors = [{"name": f"t{i}", "position": i, "dtype": draw(st.sampled_from(["bfloat16", "float32", "int32"])),
                "shape": [{"var": "num_tokens"}, draw(st.integers(1, 4096))], "strides": None, "used_by_kernel": True}
               for i in range(draw(st.integers(1, 3)))]
    dyn = {"num_tokens": {"param": "t0", "dim": 0}}
    params = [{"kind": "tensor", "name": t["name"]} for t in tensors]
    params.append({"kind": "scalar", "name": "num_tokens", "ctype": "int32", "source": {"param": "t0", "dim": 0}})
    grid = [{"op": "//", "args": [{"op": "+", "args": [{"var": "num_tokens"}, 63]}, 64]}, 1, draw(st.integers(1, 8))]
    launch = {"symbol": name, "params": params, "tensor_params": tensors, "dynamic_vars": dyn, "grid": grid,
              "block": [draw(st.sampled_from([128, 256])), 1, 1], "dynamic_smem": draw(st.integers(0, 1 << 16)),
              "pdl": True, "cluster_dims": None, "cooperative": False}
    record = {"runtime": "tilelang", "source_hash": "2" * 64, "params": [t["name"] for t in tensors] + ["block_m"],
              "info": {}}
    key = {"args": [["block_m", ["int", draw(st.sampled_from([32, 64]))]]]}
    return record, key, launch


@st.composite
def valid_bundle(draw):
    """(manifest JSON, blobs {sha: raw}) for a valid bundle of 1-3 Triton and 0-2 TileLang kernels."""
    kernels, entries, blobs = {}, [], {}
    for j in range(draw(st.integers(1, 3))):
        kid = f"vllm.fake_mod:kernel_{j}"
        record, key, launch = draw(triton_kernel(kid.partition(":")[2]))
        kernels[kid] = record
        raw = b"\x7fELF" + draw(st.binary(min_size=8, max_size=300))
        blobs[_sha(raw)] = raw
        entries.append({"kernel": kid, "key": key, "variant": "exact", "blob": _sha(raw), "launch": launch,
                        "origin": "declared"})
    for j in range(draw(st.integers(0, 2))):
        kid = f"vllm.fake_tl:tl_kernel_{j}"
        record, key, launch = draw(tilelang_kernel(kid.partition(":")[2]))
        kernels[kid] = record
        raw = b"\x7fELF" + draw(st.binary(min_size=8, max_size=300))
        blobs[_sha(raw)] = raw
        entries.append({"kernel": kid, "key": key, "variant": "exact", "blob": _sha(raw), "launch": launch,
                        "origin": "declared"})
    manifest = {"format": FORMAT_VERSION,
                "producer": {"nojit": "0.1.0", "vllm": "0.33.0", "triton": "3.8.0", "tilelang": "0.1.12",
                             "ptxas": None, "nvcc": None, "python": "3.11.7", "torch": "2.14.0"},
                "target": {"backend": "cuda", "capability": 90, "arch": "sm_90a", "warp_size": 32},
                "deployment": {"name": "fuzz"}, "kernels": kernels, "entries": entries, "blobs": {}}
    return manifest, blobs


# ------------------------------------------------------------------ one break per case
# Informational fields the builder records and no launch or server reads (left unvalidated on purpose).
INFORMATIONAL = {"source", "position", "strides", "used_by_kernel", "packed_index"}


def _paths(node, path=()):
    """Every (path, value) under node, skipping free-form subtrees (deployment, info) and informational fields."""
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            if (k in ("deployment", "info") and len(path) <= 2) or k in INFORMATIONAL:
                continue
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def _set(root, path, value):
    node = root
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


OPTIONAL = {"vllm", "triton", "tilelang", "ptxas", "nvcc", "torch", "cluster_dims", "source", "position", "strides",
            "used_by_kernel", "packed_index", "info"}


@st.composite
def broken_bundle(draw):
    manifest, blobs = draw(valid_bundle())
    m = copy.deepcopy(manifest)
    kind = draw(st.sampled_from(["wrong type", "missing", "huge int", "negative int", "NUL", "dangling", "duplicate",
                                 "arg index", "type code", "dyn var", "cluster", "unknown blob", "kernel id"]))
    paths = [(p, v) for p, v in _paths(m) if p and p[0] not in ("blobs",)]
    tri = [i for i, e in enumerate(m["entries"]) if m["kernels"][e["kernel"]]["runtime"] == "triton"]
    tl = [i for i, e in enumerate(m["entries"]) if m["kernels"][e["kernel"]]["runtime"] == "tilelang"]
    if kind == "wrong type":
        path, value = draw(st.sampled_from(paths))
        _set(m, path, {"x": 1} if not isinstance(value, dict) else "x")  # (an int would be a valid expression)
        kind = f"wrong type at {path}"
    elif kind == "missing":
        # not the top-level entry list: seal() spreads it into the kernels' sections, and without it every kernel
        # gets an empty section, a well-formed bundle that serves nothing (each key a miss), not a broken field
        cands = [(p, v) for p, v in paths if isinstance(p[-1], str) and p[-1] not in OPTIONAL and p != ("entries",)]
        path, _ = draw(st.sampled_from(cands))
        node = m
        for p in path[:-1]:
            node = node[p]
        del node[path[-1]]
    elif kind in ("huge int", "negative int"):
        cands = [(p, v) for p, v in paths if type(v) is int and "key" not in p and "grid" not in p and "shape" not in p
                 and "args" not in p and p[-1] != "position"]
        path, _ = draw(st.sampled_from(cands))
        _set(m, path, 1 << 70 if kind == "huge int" else -1)
    elif kind == "NUL":
        cands = [(p, v) for p, v in paths if isinstance(v, str) and "key" not in p and p[0] != "producer"]
        path, v = draw(st.sampled_from(cands))
        _set(m, path, v[:1] + "\0" + v[1:])
    elif kind == "dangling":
        i = draw(st.integers(0, len(m["entries"]) - 1))
        m["entries"][i]["kernel"] = "vllm.fake_mod:not_listed"
    elif kind == "duplicate":
        i = draw(st.integers(0, len(m["entries"]) - 1))
        m["entries"].append(copy.deepcopy(m["entries"][i]))
    elif kind == "arg index" and tri and any(m["entries"][i]["launch"]["args"] for i in tri):
        i = draw(st.sampled_from([i for i in tri if m["entries"][i]["launch"]["args"]]))
        args = m["entries"][i]["launch"]["args"]
        args[-1][0] = draw(st.sampled_from([args[-1][0] + 1, 4095, len(m["kernels"][m["entries"][i]["kernel"]]["params"])]))
    elif kind == "type code" and tri and any(m["entries"][i]["launch"]["args"] for i in tri):
        i = draw(st.sampled_from([i for i in tri if m["entries"][i]["launch"]["args"]]))
        arg = m["entries"][i]["launch"]["args"][0]
        arg[1] = "f" if arg[1] != "f" else "p"
    elif kind == "dyn var" and tl:
        i = draw(st.sampled_from(tl))
        launch = m["entries"][i]["launch"]
        what = draw(st.sampled_from(["grid", "param", "dim", "scalar", "dtype"]))
        if what == "grid":
            launch["grid"][1] = {"var": "split_k"}
        elif what == "param":
            launch["dynamic_vars"]["num_tokens"]["param"] = "nope"
        elif what == "dim":
            launch["dynamic_vars"]["num_tokens"]["dim"] = 2
        elif what == "scalar":
            launch["params"][-1]["name"] = "split_k"
        else:
            del launch["tensor_params"][0]["dtype"]
    elif kind == "cluster":
        i = draw(st.integers(0, len(m["entries"]) - 1))
        m["entries"][i]["launch"]["cluster_dims"] = draw(st.sampled_from([[65536, 65536, 1], [0, 1, 1], [4, 4, 4]]))
    elif kind == "unknown blob":
        m["entries"][0]["blob"] = "f" * 64
    elif kind == "kernel id":  # (a well-formed id of another package, `this:s`, is refused at install: resolve_object)
        kid = m["entries"][0]["kernel"]
        bad = draw(st.sampled_from(["vllm.x:__import__", "vllm.fake_mod", "vllm.fake mod:k", ":k", "vllm.m:a.__class__"]))
        m["kernels"][bad] = m["kernels"].pop(kid)
        for e in m["entries"]:
            if e["kernel"] == kid:
                e["kernel"] = bad
    if m == manifest:  # the break did not apply (e.g. no TileLang kernel drawn): a duplicate entry instead
        m["entries"].append(copy.deepcopy(m["entries"][0]))
        kind = "duplicate"
    return kind, seal(m, blobs)


def check_case(tmp_path, data: bytes, original: Bundle | None, counts: Counter, what: str = "",
               resealed: bool = False) -> str:
    """Open + verify under the memory and time caps; refused with a typed error or identical to `original`.

    resealed: the damage was sealed behind valid digests (a crafted manifest): if it is still a valid
    manifest it may load (every cubin then read and verified), counted as "loaded (valid edit)"."""
    p = tmp_path / "case.nojit"
    p.write_bytes(data)
    tracemalloc.start()
    t0 = time.monotonic()
    try:
        b = Bundle.open(str(p))
        try:
            blobs = {sha: b.read_blob(sha) for sha in b.manifest.blobs}
        finally:
            b.close()
        stage = "loaded"
    except NoJitError as exc:
        assert str(p) in exc.message or "NOJIT_BUNDLE_SHA256" in exc.message, exc.message
        stage = stage_of(exc)
    finally:
        elapsed = time.monotonic() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < MEM_CAP, f"{peak} bytes allocated"
    assert elapsed < TIME_CAP, f"{elapsed:.1f} s"
    if stage == "loaded" and resealed:
        stage = "loaded (valid edit)"
    elif stage == "loaded":
        assert original is not None, f"a broken manifest was accepted ({what}): {Bundle.open(str(p)).manifest.entries!r:.3000}"
        assert b.manifest == original.manifest
        assert blobs == {sha: original.read_blob(sha) for sha in original.manifest.blobs}
    counts[stage] += 1
    return stage


# ------------------------------------------------------------------ tests
def test_valid_manifests_from_the_strategy_load(tmp_path):
    """The strategy is right: what it builds loads, so every break below starts from a valid bundle."""
    n = 0

    @settings(max_examples=max(20, EXAMPLES // 5), deadline=None, suppress_health_check=list(HealthCheck))
    @given(valid_bundle())
    def run(case):
        nonlocal n
        manifest, blobs = case
        p = tmp_path / "ok.nojit"
        p.write_bytes(seal(manifest, blobs))
        b = Bundle.open(str(p))
        assert b.verify() == len(blobs)
        b.close()
        n += 1

    run()
    assert n >= 20


def test_one_broken_field_is_always_refused(tmp_path):
    counts: Counter = Counter()
    kinds: Counter = Counter()

    @settings(max_examples=EXAMPLES * 2, deadline=None, suppress_health_check=list(HealthCheck))
    @given(broken_bundle())
    def run(case):
        kind, data = case
        kinds[kind.partition(" at ")[0]] += 1
        check_case(tmp_path, data, None, counts, kind)

    run()
    print_table("structure-aware (one field broken per valid manifest)", counts)
    print("  by break:", dict(sorted(kinds.items())))
    assert counts["schema"] >= EXAMPLES, "most breaks must reach the schema"
    assert len(kinds) >= 10


@pytest.fixture(scope="module")
def real_bundle(request, tmp_path_factory):
    """NOJIT_FUZZ_BUNDLE if set (any real bundle), else the small real Triton bundle when vLLM is installed
    (session fixture), else a written one."""
    if os.environ.get("NOJIT_FUZZ_BUNDLE"):
        return os.environ["NOJIT_FUZZ_BUNDLE"]
    try:
        return request.getfixturevalue("small_build")["bundle"]
    except pytest.skip.Exception:
        from tests.loader.bundle.test_file import _write

        path = str(tmp_path_factory.mktemp("real") / "b.nojit")
        _write(path)
        return path


_U64_FIELDS = {"manifest offset": 16, "manifest length": 24, "manifest size": 32}


@st.composite
def damaged(draw, data: bytes, manifest_raw: bytes):
    kind = draw(st.sampled_from(["flip", "truncate", "insert", "header u64", "manifest json", "append", "swap"]))
    b = bytearray(data)
    if kind == "flip":
        for _ in range(draw(st.integers(1, 3))):
            b[draw(st.integers(0, len(b) - 1))] ^= draw(st.integers(1, 255))
    elif kind == "truncate":
        b = b[:draw(st.integers(0, len(b) - 1))]
    elif kind == "insert":
        at = draw(st.integers(0, len(b)))
        b[at:at] = draw(st.binary(min_size=1, max_size=16))
    elif kind == "append":
        b += draw(st.binary(min_size=1, max_size=64))
    elif kind == "swap":
        i, j = sorted(draw(st.lists(st.integers(HEADER.size, len(b) - 1), min_size=2, max_size=2, unique=True)))
        b[i], b[j] = b[j], b[i]
    elif kind == "header u64":
        off = draw(st.sampled_from(sorted(_U64_FIELDS.values())))
        b[off:off + 8] = struct.pack("<Q", draw(st.sampled_from([0, 1, len(data), 1 << 31, 1 << 62, (1 << 64) - 1,
                                                                  MAX_MANIFEST_BYTES + 1])))
    else:  # damage inside the JSON, re-sealed so that it passes the digest and reaches the parser/schema
        raw = bytearray(manifest_raw)
        op = draw(st.sampled_from(["flip", "cut", "dup", "nul"]))
        at = draw(st.integers(0, len(raw) - 1))
        if op == "flip":
            raw[at] ^= draw(st.sampled_from([1, 2, 4, 8, 16, 32]))
        elif op == "cut":
            raw = raw[:at]
        elif op == "dup":
            raw[at:at] = raw[at:at + draw(st.integers(1, 40))]
        else:
            raw[at:at] = b"\\u0000"
        b = bytearray(with_index(data, bytes(raw)))
    return kind, bytes(b)


def test_damaged_real_bundle_is_refused_or_identical(tmp_path, real_bundle):
    data = open(real_bundle, "rb").read()
    original = Bundle.open(real_bundle)
    manifest_raw = index_json(data)
    counts: Counter = Counter()
    kinds: Counter = Counter()

    @settings(max_examples=EXAMPLES * 2, deadline=None, suppress_health_check=list(HealthCheck))
    @given(damaged(data, manifest_raw))
    def run(case):
        kind, bad = case
        kinds[kind] += 1
        check_case(tmp_path, bad, original, counts, kind, resealed=kind == "manifest json")

    run()
    print_table(f"byte-level damage of {os.path.basename(real_bundle)} ({len(data)} bytes)", counts)
    print("  by damage:", dict(sorted(kinds.items())))
    for stage in ("header", "digest", "json", "schema", "layout"):
        assert counts[stage] > 0, f"no case reached stage {stage}"


BOMBS = textwrap.dedent(r"""
    import hashlib, json, resource, sys, zstandard
    resource.setrlimit(resource.RLIMIT_AS, (@LIMIT@, @LIMIT@))
    from nojit.loader.bundle.file import HEADER, MAX_MANIFEST_BYTES, Bundle, Header
    from nojit.loader.errors import NoJitError

    def write(path, blobs, manifest_raw, declared=None):
        comp = zstandard.ZstdCompressor(write_content_size=True).compress(manifest_raw)
        header = Header(@FORMAT@, 0, HEADER.size + len(blobs), len(comp), declared or len(manifest_raw), hashlib.sha256(comp).digest())
        open(path, "wb").write(header.pack() + blobs + comp)

    out = []
    d = sys.argv[1]
    # 1. a manifest that inflates to 256 MiB (refused by its declared size, before inflating)
    write(d + "/m1", b"", b"[" + b"0," * (128 << 20) + b"0]")
    # 2. a manifest just under the cap, deeply nested / wide: parsed within the limit
    write(d + "/m2", b"", b"[" * 100000 + b"]" * 100000)
    write(d + "/m3", b"", b"[" + b"{}," * ((MAX_MANIFEST_BYTES - 8) // 3) + b"{}]")
    # 3. a 2 GiB blob declared by a tiny frame (valid sha256 of those 2 GiB is not needed: size is refused first)
    big = zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * (256 << 20))
    sha = hashlib.sha256(b"\0" * (256 << 20)).hexdigest()
    for name, size in (("b1", 2 << 30), ("b2", 256 << 20)):
        manifest = {"format": @FORMAT@, "producer": {"nojit": "0", "python": "3"}, "target": {"backend": "cuda",
                    "capability": 90, "arch": "sm_90a", "warp_size": 32}, "deployment": {}, "kernels": {},
                    "blobs": {sha: {"offset": HEADER.size, "length": len(big), "size": size}}}
        write(d + "/" + name, big, json.dumps(manifest).encode())
    for name in ("m1", "m2", "m3", "b1", "b2"):
        try:
            b = Bundle.open(d + "/" + name)
            b.verify()
            out.append((name, "loaded"))
        except NoJitError as e:
            out.append((name, type(e).__name__ + ": " + e.message.replace(d + "/", "")[:120]))
    print(json.dumps(out))
""")


def test_decompression_bombs_are_refused_within_a_memory_limit(tmp_path):
    """Under RLIMIT_AS = 1.5 GiB: no MemoryError, every bomb refused with a typed error."""
    limit = 1536 << 20
    p = subprocess.run([sys.executable, "-c", BOMBS.replace("@LIMIT@", str(limit)).replace("@FORMAT@", str(FORMAT_VERSION)), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    results = dict(json.loads(p.stdout.strip().splitlines()[-1]))
    print("\n".join(f"  {k}: {v}" for k, v in results.items()))
    assert all(v.startswith("BundleCorruptError") for v in results.values()), results
    assert "out of range" in results["m1"] and "not valid JSON" in results["m2"]
    assert "size = " in results["b1"] and "size = " in results["b2"]
