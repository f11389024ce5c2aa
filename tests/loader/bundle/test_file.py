"""The bundle file: round trip, determinism, atomic writes, and clear errors for every kind of damage."""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from nojit.aot.bundle_writer import write_bundle
from nojit.loader.bundle.file import HEADER, MAGIC, Bundle, Header
from nojit.loader.bundle.canonical import canonical_json
from nojit.aot.errors import BuildError
from nojit.loader.errors import BundleCorruptError, BundleError, BundleMismatchError, NoJitError
from nojit.loader.bundle.manifest import FORMAT_VERSION, Entry, KernelRecord, Producer, Target, TritonLaunch

from tests.support.bundle_bytes import seal
from tests.support.common import ROOT

PRODUCER = Producer("0.1.0", "0.33.0", "3.8.0", None, "12.9.86", None, "3.11.7", "2.14.0")
TARGET = Target("cuda", 90, "sm_90a", 32)


def _launch(symbol: str = "kernel") -> TritonLaunch:
    return TritonLaunch(symbol, 4, 1, (1, 1, 1), 16, 0, 1, 0, 1, False, False, ((0, "p"), (1, "i")), "ab" * 32)


def _inputs(seed: int = 0, n: int = 6):
    rng = random.Random(seed)
    cubins = {}
    entries = []
    kernels = [KernelRecord("pkg.mod:A.kernel", "triton", "1" * 64, ("x", "n")),
               KernelRecord("pkg.mod:b_kernel", "triton", "2" * 64, ("x", "n"))]
    for i in range(n):
        raw = bytes(rng.getrandbits(8) for _ in range(rng.randint(200, 3000)))
        sha = hashlib.sha256(raw).hexdigest()
        cubins[sha] = raw
        key = {"spec": [["*fp32", "D" if i % 2 else ""], ["i32", "D"]], "options": [["num_warps", ["int", 4 + i]]]}
        entries.append(Entry(kernels[i % 2].id, key, "exact", sha, _launch(), "declared"))
    return kernels, entries, cubins


def _write(path: str, seed: int = 0) -> dict:
    kernels, entries, cubins = _inputs(seed)
    write_bundle(path, PRODUCER, TARGET, {"name": "test"}, kernels, entries, cubins)
    return cubins


def test_round_trip(tmp_path):
    path = str(tmp_path / "b.nojit")
    cubins = _write(path)
    b = Bundle.open(path)
    assert b.manifest.producer == PRODUCER and b.manifest.target == TARGET
    assert len(b.manifest.entries) == 6 and b.kernel_ids() == ["pkg.mod:A.kernel", "pkg.mod:b_kernel"]
    for e in b.manifest.entries:
        assert b.read_blob(e.blob) == cubins[e.blob]
        assert isinstance(e.launch, TritonLaunch) and e.launch.args == ((0, "p"), (1, "i"))
    assert b.verify() == len(cubins)
    assert len(b.entries("pkg.mod:A.kernel")) == 3


def test_open_reads_the_index_and_each_section_at_first_use(tmp_path):
    """Opening decodes no kernel's entries; the first entries() call decodes that kernel's section only."""
    path = str(tmp_path / "b.nojit")
    _write(path)
    b = Bundle.open(path)
    assert b.index.entry_count == 6 and b._sections == {}
    assert len(b.entries("pkg.mod:b_kernel")) == 3 and list(b._sections) == ["pkg.mod:b_kernel"]
    assert b.entries("pkg.mod:b_kernel") is b.entries("pkg.mod:b_kernel")  # decoded once
    assert b.entries("pkg.mod:not_bundled") == ()


def test_same_inputs_give_identical_bytes(tmp_path):
    a, b = str(tmp_path / "a.nojit"), str(tmp_path / "b.nojit")
    kernels, entries, cubins = _inputs(3)
    write_bundle(a, PRODUCER, TARGET, {"name": "t"}, kernels, entries, cubins)
    write_bundle(b, PRODUCER, TARGET, {"name": "t"}, list(reversed(kernels)), list(reversed(entries)), cubins)
    assert open(a, "rb").read() == open(b, "rb").read()


def test_failed_write_leaves_nothing(tmp_path):
    path = str(tmp_path / "out.nojit")
    kernels, entries, cubins = _inputs()
    broken = dict(cubins)
    broken[next(iter(broken))] = b"not the bytes of that digest"
    with pytest.raises(BuildError):
        write_bundle(path, PRODUCER, TARGET, {}, kernels, entries, broken)
    assert os.listdir(tmp_path) == []


def test_existing_bundle_survives_a_failed_rewrite(tmp_path):
    path = str(tmp_path / "out.nojit")
    _write(path)
    before = open(path, "rb").read()
    kernels, entries, cubins = _inputs(1)
    with pytest.raises(BuildError):
        write_bundle(path, PRODUCER, TARGET, {}, kernels, entries[:1] * 2, cubins)  # duplicate entry
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["out.nojit"]


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(BundleError, match="does not exist.*\n.*fix: build one"):
        Bundle.open(str(tmp_path / "nope.nojit"))
    with pytest.raises(BundleError, match="is a directory"):
        Bundle.open(str(tmp_path))


def test_not_a_bundle(tmp_path):
    p = tmp_path / "x.nojit"
    p.write_bytes(b"\x7fELF" + b"\0" * 200)
    with pytest.raises(BundleCorruptError, match="not a nojit bundle"):
        Bundle.open(str(p))


def _open_and_read_all(path: str) -> None:
    b = Bundle.open(path)
    b.verify()


def test_every_truncation_is_a_clear_error(tmp_path):
    path = str(tmp_path / "b.nojit")
    _write(path)
    data = open(path, "rb").read()
    cut = tmp_path / "cut.nojit"
    for n in sorted({0, 1, 8, HEADER.size - 1, HEADER.size, HEADER.size + 1, len(data) // 2, len(data) - 1,
                     *random.Random(1).sample(range(len(data)), 40)}):
        cut.write_bytes(data[:n])
        with pytest.raises(BundleError) as info:
            _open_and_read_all(str(cut))
        assert str(cut) in str(info.value) and "fix:" in str(info.value)


def test_every_flipped_byte_is_detected(tmp_path):
    path = str(tmp_path / "b.nojit")
    _write(path)
    data = bytearray(open(path, "rb").read())
    bad = tmp_path / "bad.nojit"
    positions = sorted(set(range(HEADER.size)) | set(random.Random(2).sample(range(HEADER.size, len(data)), 120)))
    for pos in positions:
        flipped = bytearray(data)
        flipped[pos] ^= 0x40
        bad.write_bytes(bytes(flipped))
        with pytest.raises(BundleError):
            _open_and_read_all(str(bad))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_crash_the_reader(tmp_path_factory, blob):
    p = tmp_path_factory.mktemp("fuzz") / "f.nojit"
    p.write_bytes(blob)
    with pytest.raises(BundleError):
        _open_and_read_all(str(p))


def _with_manifest(path: str, manifest: object, fmt: int = FORMAT_VERSION) -> None:
    """A bundle file with this index and nothing else."""
    blobs = b""
    raw = json.dumps(manifest).encode()
    comp = zstandard.ZstdCompressor().compress(raw)
    header = Header(fmt, 0, HEADER.size + len(blobs), len(comp), len(raw), hashlib.sha256(comp).digest())
    with open(path, "wb") as f:
        f.write(header.pack() + blobs + comp)


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
                    max_leaves=30))
def test_hostile_manifests_are_refused_cleanly(tmp_path_factory, value):
    p = str(tmp_path_factory.mktemp("m") / "m.nojit")
    _with_manifest(p, value)
    with pytest.raises(NoJitError):
        Bundle.open(p)


def test_bad_field_is_named(tmp_path):
    """A bad field in a kernel's section is found at that kernel's first use (and by verify), named by its path."""
    path = str(tmp_path / "b.nojit")
    cubins = _write(path)
    manifest = Bundle.open(path).manifest.to_json()
    manifest["entries"][2]["launch"]["num_warps"] = "four"  # the third entry of pkg.mod:A.kernel
    p = tmp_path / "m.nojit"
    p.write_bytes(seal(manifest, cubins))
    b = Bundle.open(str(p))
    assert len(b.entries("pkg.mod:b_kernel")) == 3  # the other kernel is served
    match = r"manifest\.kernels\['pkg\.mod:A\.kernel'\]\.section\[2\]\.launch\.num_warps has type str"
    with pytest.raises(BundleCorruptError, match=match):
        b.entries("pkg.mod:A.kernel")
    with pytest.raises(BundleCorruptError, match=match):
        Bundle.open(str(p)).verify()
    manifest = Bundle.open(path).manifest.to_json()
    manifest["entries"][0]["blob"] = "f" * 64
    p.write_bytes(seal(manifest, cubins))
    with pytest.raises(BundleCorruptError, match="names a blob ffffffffffff the manifest does not list"):
        Bundle.open(str(p)).verify()


def test_other_format_version_is_a_mismatch(tmp_path):
    p = str(tmp_path / "v.nojit")
    _with_manifest(p, {"format": 1}, fmt=7)
    with pytest.raises(BundleMismatchError, match=f"bundle format 7, this nojit reads format {FORMAT_VERSION}"):
        Bundle.open(p)


def test_a_format_1_bundle_is_refused_with_the_fix(tmp_path):
    """Bundles written before the indexed layout: one typed error saying what it is and to rebuild."""
    p = str(tmp_path / "old.nojit")
    _with_manifest(p, {"format": 1, "entries": []}, fmt=1)
    with pytest.raises(BundleMismatchError, match="bundle format 1 .*nojit before the indexed layout") as info:
        Bundle.open(p)
    assert "nojit build" in info.value.fix


def test_manifest_is_canonical_json(tmp_path):
    path = str(tmp_path / "b.nojit")
    _write(path)
    with open(path, "rb") as f:
        header = HEADER.unpack(f.read(HEADER.size))
        assert header[0] == MAGIC
        f.seek(header[3])
        raw = zstandard.ZstdDecompressor().decompress(f.read(header[4]))
        index = json.loads(raw)
        assert raw == canonical_json(index)
        for record in index["kernels"].values():
            f.seek(record["section"]["offset"])
            section = zstandard.ZstdDecompressor().decompress(f.read(record["section"]["length"]))
            assert section == canonical_json(json.loads(section))


def test_a_format_1_bundle_upgrades_to_the_same_bytes_a_build_writes(tmp_path):
    """tools/upgrade_bundle.py: format 1 (one manifest) -> format 2, byte-identical to write_bundle's output."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "upgrade_bundle", os.path.join(ROOT, "tools", "upgrade_bundle.py"))
    upgrade = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(upgrade)
    new = str(tmp_path / "new.nojit")
    cubins = _write(new)
    manifest = Bundle.open(new).manifest.to_json()
    body, refs = b"", {}
    for sha in sorted(cubins):  # format 1, laid out by hand: header, blobs, one manifest
        frame = zstandard.ZstdCompressor(write_content_size=True).compress(cubins[sha])
        refs[sha] = {"offset": HEADER.size + len(body), "length": len(frame), "size": len(cubins[sha])}
        body += frame
    raw = json.dumps(dict(manifest, format=1, blobs=refs)).encode()
    comp = zstandard.ZstdCompressor(write_content_size=True).compress(raw)
    old = tmp_path / "old.nojit"
    old.write_bytes(Header(1, 0, HEADER.size + len(body), len(comp), len(raw), hashlib.sha256(comp).digest()).pack()
                    + body + comp)
    with pytest.raises(BundleMismatchError, match="bundle format 1"):
        Bundle.open(str(old))
    out = str(tmp_path / "upgraded.nojit")
    assert upgrade.upgrade(str(old), out) == len(cubins)
    assert open(out, "rb").read() == open(new, "rb").read()
