"""Tests added for surviving mutants of the reader, the manifest schema and the expression evaluator
(issue 13, tools/mutation/): each one fails with a mutant that the older tests let through.

Fast and deterministic (no hypothesis): tools/mutation/run.sh runs this file for every mutant.
"""

from __future__ import annotations

import hashlib
import os

import pytest
import zstandard

from tests.support.bundle_bytes import index_json, index_offset, seal
from nojit.loader.bundle.file import HEADER, Bundle, Header
from nojit.loader.errors import BundleCorruptError, BundleError, BundleMismatchError
from nojit.loader.bundle.manifest import FORMAT_VERSION
from tests.loader.bundle.test_schema_rules import CUBIN_B, SHA_A, SHA_B, valid, write


def _data() -> bytes:
    m, blobs = valid()
    return seal(m, blobs)


# ---------------------------------------------------------------------------- reader (loader/bundle/file.py)
def test_a_pin_may_use_every_hex_digit(tmp_path):
    """`set(want) <= hex digits`, not a proper subset: a digest holding all sixteen digits is a digest."""
    path = write(tmp_path, b"not a bundle")
    with pytest.raises(BundleMismatchError, match="pins 0123456789abcdef"):
        Bundle.open(path, expected_sha256="0123456789abcdef" * 4)
    with pytest.raises(BundleError, match="not a sha256 hex digest"):
        Bundle.open(path, expected_sha256="0123456789abcdeg" * 4)


def test_trailing_bytes_are_counted(tmp_path):
    with pytest.raises(BundleCorruptError, match=r": 5 bytes follow the index"):
        Bundle.open(write(tmp_path, _data() + b"\0" * 5))


def _frame_length_case(tmp_path, raw_size: int, frame_length: int) -> str:
    """A file whose header declares an index of raw_size bytes in a frame of frame_length bytes (zeros)."""
    data = _data()
    moff = index_offset(data)
    header = Header(FORMAT_VERSION, 0, moff, frame_length, raw_size, b"\0" * 32)
    return write(tmp_path, header.pack() + data[HEADER.size:moff] + b"\0" * frame_length)


@pytest.mark.parametrize("raw_size", [1500, 128 << 10, 200_000])
def test_index_frame_cap_is_zstd_bound_plus_header_exactly(tmp_path, raw_size):
    """The index frame may be as long as zstandard's worst case for its content (size + size/256, + 128 KiB
    below 128 KiB of content) plus 64 bytes of frame header and checksum, and not one byte longer."""
    bound = raw_size + (raw_size >> 8) + 64 + ((128 << 10) if raw_size < (128 << 10) else 0)
    with pytest.raises(BundleCorruptError, match="index frame of"):
        Bundle.open(_frame_length_case(tmp_path, raw_size, bound + 1))
    with pytest.raises(BundleCorruptError) as info:  # past the cap check: the digest is wrong
        Bundle.open(_frame_length_case(tmp_path, raw_size, bound))
    assert "index digest mismatch" in info.value.message


def test_index_size_cap_is_16_mib(tmp_path):
    """The index cap is 16 MiB of JSON (bundle_file.MAX_MANIFEST_BYTES), written out here so that a looser
    cap fails this test even though the reader's own constant moved with it."""
    with pytest.raises(BundleCorruptError, match=r"index size 16777217 is out of range \(at most 16777216\)"):
        Bundle.open(_frame_length_case(tmp_path, (16 << 20) + 1, 100))
    with pytest.raises(BundleCorruptError, match="index digest mismatch"):
        Bundle.open(_frame_length_case(tmp_path, 16 << 20, 100))
    with pytest.raises(BundleCorruptError, match=r"index size 0 is out of range"):
        Bundle.open(_frame_length_case(tmp_path, 0, 100))


def test_a_cubin_cut_short_after_open_names_its_digest(tmp_path):
    m, blobs = valid()
    path = write(tmp_path, seal(m, blobs))
    b = Bundle.open(path)
    first = min(b.index.blobs.values(), key=lambda r: r.offset)
    with open(path, "r+b") as fh:  # the same file cut inside the first cubin (damage, not a redeploy)
        fh.truncate(first.offset + first.length - 1)
    with pytest.raises(BundleCorruptError, match=rf"{path}: cubin {first.sha256[:12]} is truncated\n"):
        b.read_blob(first.sha256)
    b.close()


def test_a_recorded_pin_mismatch_is_damage_and_shows_both_digests(tmp_path):
    from nojit.loader.bundle.file import Pin

    data = b"not the recorded bundle"
    path = write(tmp_path, data)
    have = hashlib.sha256(data).hexdigest()
    pin = Pin("0123456789abcdef" * 4, by="the bundle wheel", fix="reinstall it", recorded=True)
    with pytest.raises(BundleCorruptError, match=rf"the bundle wheel: {path} has sha256 {have[:16]}\.\.\., the bundle "
                                                 r"wheel recorded 0123456789abcdef\.\.\. \(the file") as info:
        Bundle.open(path, pin=pin)
    assert info.value.fix == "reinstall it"


def test_close_releases_the_descriptor_and_header_is_immutable(tmp_path):
    import dataclasses

    from nojit.loader.bundle.file import Pin

    b = Bundle.open(write(tmp_path, _data()))
    fd = b._fd
    os.fstat(fd)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.header.index_offset = 0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        Pin("0" * 64).sha256 = "1" * 64  # type: ignore[misc]
    b.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    b.close()  # twice is harmless


def test_a_duplicate_key_is_named_up_to_64_characters(tmp_path):
    from tests.support.bundle_bytes import with_index

    data = _data()
    name = "k" * 70
    raw = index_json(data)[:-1] + f',"{name}":1,"{name}":2}}'.encode()
    with pytest.raises(BundleCorruptError, match=rf"key '{'k' * 64}' appears twice in one object"):
        Bundle.open(write(tmp_path, with_index(data, raw)))


def test_canonical_json_refuses_non_finite_numbers():
    from nojit.loader.bundle.canonical import canonical_json

    assert canonical_json({"b": 1, "a": [1.5, "x"]}) == b'{"a":[1.5,"x"],"b":1}'
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError):
            canonical_json({"x": bad})


def test_blob_errors_name_the_digest_by_12_digits(tmp_path):
    m, _ = valid()
    b = Bundle.open(write(tmp_path, seal(m, {SHA_A: b"\x7fELF not the cubin A names", SHA_B: CUBIN_B})))
    with pytest.raises(BundleCorruptError, match=rf": cubin {SHA_A[:12]} fails its sha256 check\n"):
        b.read_blob(SHA_A)
    assert b.read_blob(SHA_B) == CUBIN_B
    with pytest.raises(BundleCorruptError, match=r": no blob abababababab\n"):
        b.read_blob("ab" * 32)
    b.close()


def test_an_index_outside_the_file_is_named_at_the_header(tmp_path):
    data = _data()
    moff = index_offset(data)
    for offset, length in [(moff, len(data) - moff + 1), (moff, 0), (HEADER.size - 1, 10)]:
        header = Header(FORMAT_VERSION, 0, offset, length, 1000, b"\0" * 32)
        with pytest.raises(BundleCorruptError, match=rf"index at {offset}\+{length} lies outside the {len(data)}-byte"):
            Bundle.open(write(tmp_path, header.pack() + data[HEADER.size:]))


# ---------------------------------------------------------------------------- schema (loader/bundle/manifest.py)
def _open_all(tmp_path, m: dict, blobs: dict | None = None) -> Bundle:
    b = Bundle.open(write(tmp_path, seal(m, valid()[1] if blobs is None else blobs)))
    b.verify()
    return b


def _refused(tmp_path, m: dict, match: str) -> None:
    with pytest.raises(BundleCorruptError, match=match):
        _open_all(tmp_path, m)


def test_manifest_records_are_frozen():
    """Records are shared by every thread of a server once parsed: none can be changed in place."""
    from nojit.loader.bundle import manifest as mf

    for cls in (mf.Producer, mf.Target, mf.BlobRef, mf.SectionRef, mf.TritonLaunch, mf.TileLangLaunch, mf.CuteLaunch,
                mf.DeepGemmLaunch, mf.KernelRecord, mf.Entry, mf.Manifest, mf.Index):
        assert cls.__dataclass_params__.frozen, cls.__name__


@pytest.mark.parametrize("name, lo, hi", [
    ("num_warps", 1, 32), ("num_ctas", 1, 16), ("shared", 0, 1 << 20), ("global_scratch_size", 0, 1 << 20),
    ("global_scratch_align", 1, 1 << 20), ("profile_scratch_size", 0, 1 << 20), ("profile_scratch_align", 1, 1 << 20),
])
def test_triton_launch_ranges_at_both_ends(tmp_path, name, lo, hi):
    """The ranges the schema documents (csrc and the driver get nothing outside them), at both ends."""
    for value, ok in [(lo, True), (hi, True), (lo - 1, False), (hi + 1, False)]:
        m, _ = valid()
        m["entries"][0]["launch"][name] = value
        if ok:
            assert _open_all(tmp_path, m).entries("vllm.m:k")[0].launch.__dict__[name] == value
        else:
            _refused(tmp_path, m, rf"launch.{name} = {value} is outside \[{lo}, {hi}\]")


@pytest.mark.parametrize("name, value, match", [
    ("global_scratch_size", 1 << 40, "outside"), ("profile_scratch_size", 1 << 40, "outside"),
    ("global_scratch_size", (1 << 20) + 1, "outside"), ("global_scratch_align", 3, "not a power of two"),
    ("profile_scratch_align", 48, "not a power of two"),
])
def test_scratch_sizes_are_capped_when_the_kernel_is_read(tmp_path, name, value, match):
    """A scratch size of 2^40 per program was accepted (and handed to torch's allocator at launch, times the
    grid); it is refused with the entry, when the kernel's section is read, before any launch can use it."""
    m, _ = valid()
    m["entries"][0]["launch"][name] = value
    _refused(tmp_path, m, rf"launch.{name} = {value} is {match}")
    m, _ = valid()
    m["entries"][0]["launch"][name] = 1 << 10  # control: a real-sized value is served
    assert _open_all(tmp_path, m).entries("vllm.m:k")[0].launch.__dict__[name] == 1 << 10


def test_a_flashinfer_module_entry_is_keyed_by_its_module_name(tmp_path):
    def with_flashinfer(key):
        m, blobs = valid()
        m["kernels"]["flashinfer.jit:gen_sampling_module"] = {"runtime": "flashinfer", "source_hash": "3" * 64,
                                                              "params": [], "info": {}}
        m["entries"].append({"kernel": "flashinfer.jit:gen_sampling_module", "key": key, "variant": "exact",
                             "blob": SHA_A, "launch": {"module": "sampling"}, "origin": "declared"})
        return m

    assert _open_all(tmp_path, with_flashinfer("sampling")).entries("flashinfer.jit:gen_sampling_module")
    for key in ("aaa", "zzz", "sampling2"):
        _refused(tmp_path, with_flashinfer(key), "is not the FlashInfer module's name")


@pytest.mark.parametrize("field, value, match", [
    ("offset", -1, r"offset = -1 is outside \[0, "), ("length", 0, r"length = 0 is outside \[1, "),
    ("size", 0, r"size = 0 is outside \[1, "), ("size", (64 << 20) + 1, r"size = 67108865 is outside \[1, 67108864\]"),
    ("offset", True, "offset has type bool"), ("length", 1.0, "length has type float"),
])
def test_blob_table_fields_are_named_at_their_bounds(tmp_path, field, value, match):
    import json

    from tests.support.bundle_bytes import with_index

    data = _data()
    index = json.loads(index_json(data))
    index["blobs"][SHA_A][field] = value
    with pytest.raises(BundleCorruptError, match=rf"manifest\.blobs\.{SHA_A[:12]}\.{match}"):
        Bundle.open(write(tmp_path, with_index(data, json.dumps(index).encode())))


@pytest.mark.parametrize("what, axis, hi", [("grid", 0, (1 << 31) - 1), ("grid", 1, 65535), ("grid", 2, 65535),
                                            ("block", 0, 1024), ("block", 1, 1024), ("block", 2, 64)])
def test_tilelang_literal_launch_sizes_at_cuda_limits(tmp_path, what, axis, hi):
    """CUDA's per-axis limits (grid 2^31-1 x 65535 x 65535; block 1024 x 1024 x 64, 1024 threads in all)."""
    for value, ok in [(hi, True), (hi + 1, False), (-1, False)]:
        m, _ = valid()
        dims = [1, 1, 1]
        dims[axis] = value
        m["entries"][1]["launch"][what] = dims
        if ok:
            launch = _open_all(tmp_path, m).entries("vllm.t:tl")[0].launch
            assert getattr(launch, what)[axis] == value
        else:
            _refused(tmp_path, m, rf"launch.{what} \[.*\] is not a launch size")


def test_digests_are_exactly_64_hex_digits(tmp_path):
    for bad in (SHA_A + "0", SHA_A[:-1], SHA_A.upper()):
        m, _ = valid()
        m["entries"][0]["blob"] = bad
        _refused(tmp_path, m, r"section\[0\]\.blob is not a lowercase sha256 hex digest")


def test_source_hash_is_at_most_128_characters(tmp_path):
    for n, ok in [(128, True), (129, False)]:
        m, _ = valid()
        m["kernels"]["vllm.m:k"]["source_hash"] = "a" * n
        if ok:
            assert _open_all(tmp_path, m).index.kernels["vllm.m:k"].source_hash == "a" * n
        else:
            _refused(tmp_path, m, r"source_hash is longer than 128 characters")


def _with_deepgemm(calls) -> dict:
    m, _ = valid()
    m["kernels"]["deep_gemm:fp8_gemm_nt"] = {"runtime": "deepgemm", "source_hash": "4" * 64, "params": [], "info": {}}
    m["entries"].append({"kernel": "deep_gemm:fp8_gemm_nt", "key": "kernel.abc123", "variant": "exact", "blob": SHA_A,
                         "launch": {"entry": "kernel.abc123", "source": "// kernel.cu\n", "calls": calls},
                         "origin": "declared"})
    return m


def test_deepgemm_calls_are_five_items(tmp_path):
    launch = _open_all(tmp_path, _with_deepgemm([["wo_b", 4096, 2048, 1, 31]])).entries("deep_gemm:fp8_gemm_nt")[0].launch
    assert launch.calls == (("wo_b", 4096, 2048, 1, 31),)
    # the key is the entry's name, or a call NOJIT_MODE=record wrote (an object)
    m = _with_deepgemm([])
    m["entries"][-1]["key"] = {"shape": "wo_b", "m": 7}
    assert _open_all(tmp_path, m).entries("deep_gemm:fp8_gemm_nt")[0].key == {"shape": "wo_b", "m": 7}
    for key in ("kernel.abc124", ["kernel.abc123"], None):
        m["entries"][-1]["key"] = key
        _refused(tmp_path, m, r"key names .*, its launch serves kernel.abc123")
    for bad in ([["wo_b", 4096, 2048, 1]], [["wo_b", 4096, 2048, 1, 31, 7]], [[1, 4096, 2048, 1, 31]],
                [["wo_b", 4096, 2048, 1, True]], [["wo_b", -1, 2048, 1, 31]], [["wo_b", 4096, 2048, 1, 1 << 40]]):
        _refused(tmp_path, _with_deepgemm(bad), r"launch.calls holds a call that is not \[shape, N, K, first M, last M\]")


def test_target_and_name_lengths_at_their_bounds(tmp_path):
    for name, hi in [("capability", 1000), ("warp_size", 1024)]:
        for value, ok in [(1, True), (hi, True), (0, False), (hi + 1, False)]:
            m, _ = valid()
            m["target"][name] = value
            if ok:
                assert getattr(_open_all(tmp_path, m).index.target, name) == value
            else:
                _refused(tmp_path, m, rf"manifest.target.{name} = {value} is outside \[1, {hi}\]")
    long = "t" * 256  # a tensor parameter's name: up to 256 characters, in tensor_params and params alike
    m, _ = valid()
    launch = m["entries"][1]["launch"]
    launch["tensor_params"][1]["name"] = long
    launch["params"][1]["name"] = long
    assert _open_all(tmp_path, m).entries("vllm.t:tl")[0].launch.params[1]["name"] == long
    launch["tensor_params"][1]["name"] = launch["params"][1]["name"] = long + "t"
    _refused(tmp_path, m, r"name is longer than 256 characters")


def test_cutedsl_options_are_at_most_1024_characters(tmp_path):
    def with_cute(options):
        m, _ = valid()
        m["kernels"]["vllm.c:cute_kernel"] = {"runtime": "cutedsl", "source_hash": "5" * 64, "params": [], "info": {}}
        m["entries"].append({"kernel": "vllm.c:cute_kernel", "key": ["key", "vllm.c.cute_kernel", []],
                             "variant": "exact", "blob": SHA_A, "launch": {"symbol": "f", "options": options},
                             "origin": "declared"})
        return m

    assert _open_all(tmp_path, with_cute("o" * 1024)).entries("vllm.c:cute_kernel")[0].launch.options == "o" * 1024
    _refused(tmp_path, with_cute("o" * 1025), r"launch.options is longer than 1024 characters")


def test_blob_table_entry_missing_a_field_or_not_an_object(tmp_path):
    import json

    from tests.support.bundle_bytes import with_index

    for edit, match in [(lambda ref: ref.pop("size"), r"\.size is missing"), (lambda ref: ref.pop("offset"), r"\.offset is missing")]:
        data = _data()
        index = json.loads(index_json(data))
        edit(index["blobs"][SHA_A])
        with pytest.raises(BundleCorruptError, match=rf"manifest\.blobs\.{SHA_A[:12]}{match}"):
            Bundle.open(write(tmp_path, with_index(data, json.dumps(index).encode())))
    data = _data()
    index = json.loads(index_json(data))
    index["blobs"][SHA_A] = [1, 2, 3]
    with pytest.raises(BundleCorruptError, match=rf"manifest\.blobs\.{SHA_A[:12]} is not an object"):
        Bundle.open(write(tmp_path, with_index(data, json.dumps(index).encode())))


def test_format_0_is_another_format_not_a_range_error(tmp_path):
    import json

    from tests.support.bundle_bytes import with_index

    data = _data()
    index = json.loads(index_json(data))
    index["format"] = 0
    with pytest.raises(BundleMismatchError, match=r"bundle format 0, this nojit reads format 2"):
        Bundle.open(write(tmp_path, with_index(data, json.dumps(index).encode())))


@pytest.mark.parametrize("item", [[0, "p", 7], [0], 5, "p", [0, "pp"], [True, "p"], [0, "x"], [4096, "p"], ["x", "p"],
                                  [0.0, "p"], [-1, "p"]])
def test_triton_launch_args_items_are_index_type_pairs(tmp_path, item):
    m, _ = valid()
    m["entries"][0]["launch"]["args"][0] = item
    _refused(tmp_path, m, r"launch.args has a malformed item")


def test_cluster_dims_and_block_threads_are_kept_as_given(tmp_path):
    m, _ = valid()
    m["entries"][0]["launch"]["cluster_dims"] = [1, 2, 4]
    m["entries"][1]["launch"]["block"] = [32, 32, 1]
    b = _open_all(tmp_path, m)
    assert b.entries("vllm.m:k")[0].launch.cluster_dims == (1, 2, 4)
    assert b.entries("vllm.t:tl")[0].launch.block == (32, 32, 1)
    m["entries"][1]["launch"]["block"] = [41, 25, 1]  # 1025 threads, each axis in range
    _refused(tmp_path, m, r"launch.block \[41, 25, 1\] is not 1 to 1024 threads")


def test_producer_toolchain_origin_and_duplicate_messages_at_their_bounds(tmp_path):
    import json
    import re

    for n, ok in [(65536, True), (65537, False)]:
        m, _ = valid()
        m["producer"]["toolchain"] = {"nvcc": {"--version": {"stdout": "v" * n, "stderr": ""}}}
        if ok:
            assert len(_open_all(tmp_path, m).index.producer.toolchain["nvcc"]["--version"]["stdout"]) == n
        else:
            _refused(tmp_path, m, r"producer.toolchain.nvcc is not an object of version probes")
    for n, ok in [(1024, True), (1025, False)]:
        m, _ = valid()
        m["entries"][0]["origin"] = "o" * n
        if ok:
            assert _open_all(tmp_path, m).entries("vllm.m:k")[0].origin == "o" * n
        else:
            _refused(tmp_path, m, r"origin is longer than 1024 characters")
    m, _ = valid()
    m["entries"][1]["key"] = {"args": [["block", ["str", "x" * 300]]]}
    m["entries"].append(dict(m["entries"][1]))
    shown = json.dumps(m["entries"][1]["key"], sort_keys=True, separators=(",", ":"))[:200]
    _refused(tmp_path, m, rf"kernel vllm.t:tl has two exact entries for key {re.escape(shown)}\n")


def test_producer_json_has_a_toolchain_only_when_recorded():
    from nojit.loader.bundle.manifest import Producer

    plain = Producer("0.1.0", "0.33.0", "3.8.0", None, None, None, "3.11", None)
    assert "toolchain" not in plain.to_json() and plain.to_json()["nojit"] == "0.1.0"
    probes = {"nvcc": {"--version": {"stdout": "13.0", "stderr": ""}}}
    assert Producer("0.1.0", None, None, None, None, None, "3.11", None, probes).to_json()["toolchain"] == probes


# ---------------------------------------------------------------------------- expressions (loader/bundle/launch_expr.py)
def test_comparison_operators_evaluate_as_integers():
    from nojit.loader.bundle.launch_expr import evaluate, validate_expr

    for op, want in [("<", (1, 0, 0)), ("<=", (1, 1, 0)), ("==", (0, 1, 0))]:
        got = []
        for a, b in [(3, 5), (5, 5), (7, 5)]:
            e = {"op": op, "args": [{"var": "a"}, b]}
            validate_expr(e, {"a"})
            got.append(evaluate(e, {"a": a}))
        assert tuple(got) == want, op
    for op in ("xor", "~", "sum", "", "Select"):
        with pytest.raises(ValueError, match="unknown operator"):
            validate_expr({"op": op, "args": [1, 2]}, set())


def _balanced(leaves: int):
    """A '+' tree over `leaves` literals: 2*leaves - 1 nodes, depth about log2(leaves)."""
    if leaves == 1:
        return 1
    half = leaves // 2
    return {"op": "+", "args": [_balanced(half), _balanced(leaves - half)]}


def test_expression_size_counts_every_node_once():
    from nojit.loader.bundle.launch_expr import evaluate, validate_expr

    validate_expr(_balanced(128), set())  # 255 nodes
    assert evaluate(_balanced(128), {}) == 128
    with pytest.raises(ValueError, match="more than 256 nodes"):
        validate_expr(_balanced(129), set())  # 257 nodes
    validate_expr({"op": "select", "args": [_balanced(64), _balanced(32), _balanced(32)]}, set())  # 1+127+63+63 = 254
