"""The build's compile cache (aot/compile_cache.py): content-addressed, atomic, damage is a miss.

Cheap (no compiler): the store and the codec with real launch types, concurrent writers in
processes, damaged entries, and the build's use of it (a second build with every result
cached starts no compile task; a changed input is a miss).
"""

from __future__ import annotations

import json
import multiprocessing
import os

import pytest

from nojit.aot.compile_cache import ArtifactCache, CompileCache, CompileResultCodec, digest_of, launch_reader
from nojit.aot.faces import CompileResult
from nojit.loader.bundle.manifest import TileLangLaunch, TritonLaunch

LAUNCH = TritonLaunch("k", 4, 1, (1, 1, 1), 16, 0, 1, 0, 1, False, True, ((0, "p"), (2, "i")), "ab" * 32)
TL_LAUNCH = TileLangLaunch(
    symbol="tl", params=({"kind": "tensor", "name": "a"}, {"kind": "scalar", "name": "n", "ctype": "int32"}),
    tensor_params=({"name": "a", "dtype": "bfloat16", "shape": [{"var": "n"}, 64]},),
    dynamic_vars={"n": {"param": "a", "dim": 0}}, grid=({"var": "n"}, 1, 1), block=(128, 1, 1), dynamic_smem=0,
    pdl=True, cluster_dims=None, cooperative=False)
INPUTS = {"runtime": "triton", "kernel": "vllm.m:k", "source_hash": "1" * 64, "key": {"spec": [], "options": []},
          "variant": "exact", "triton": "3.8.0", "ptxas": "12.9.86"}


def _result(launch=LAUNCH, cubin=b"\x7fELF cubin") -> CompileResult:
    return CompileResult(cubin=cubin, launch=launch, source_hash="1" * 64, tools={"ptxas": "12.9.86"},
                         kernel_info={"nvcc_flags": ["-O3"]})


def test_round_trip_for_both_launch_types(tmp_path):
    cache = ArtifactCache(str(tmp_path))
    for launch in (LAUNCH, TL_LAUNCH):
        codec = CompileResultCodec(launch_reader(type(launch)))
        inputs = dict(INPUTS, launch=type(launch).__name__)
        assert cache.get(inputs) is None
        cache.put(inputs, *codec.encode(_result(launch)))
        back = codec.decode(*cache.get(inputs))
        assert back == _result(launch)
    assert (cache.hits, cache.misses, cache.stored) == (2, 2, 2)


def test_every_input_names_another_entry(tmp_path):
    cache = ArtifactCache(str(tmp_path))
    codec = CompileResultCodec(launch_reader(TritonLaunch))
    cache.put(INPUTS, *codec.encode(_result()))
    for name in INPUTS:
        other = dict(INPUTS, **{name: "changed"})
        assert digest_of(other) != digest_of(INPUTS)
        assert cache.get(other) is None
    assert cache.get(dict(INPUTS)) is not None


@pytest.mark.parametrize("damage", ["payload", "truncate", "header", "inputs", "empty"])
def test_a_damaged_entry_is_a_miss_and_is_replaced(tmp_path, damage):
    cache = ArtifactCache(str(tmp_path))
    codec = CompileResultCodec(launch_reader(TritonLaunch))
    cache.put(INPUTS, *codec.encode(_result()))
    path = cache._path(digest_of(INPUTS))
    data = open(path, "rb").read()
    head, _, payload = data.partition(b"\n")
    if damage == "payload":
        data = head + b"\n" + payload[:-1] + bytes([payload[-1] ^ 1])
    elif damage == "truncate":
        data = data[:-3]
    elif damage == "header":
        data = b"{" + data
    elif damage == "inputs":  # an entry written under this digest for other inputs (never by the writer)
        h = json.loads(head)
        h["inputs"]["kernel"] = "vllm.m:other"
        data = json.dumps(h).encode() + b"\n" + payload
    else:
        data = b""
    with open(path, "wb") as f:
        f.write(data)
    assert cache.get(INPUTS) is None
    cache.put(INPUTS, *codec.encode(_result()))
    assert codec.decode(*cache.get(INPUTS)) == _result()


def _writer(root: str, n: int) -> None:
    cache = ArtifactCache(root)
    codec = CompileResultCodec(launch_reader(TritonLaunch))
    for i in range(n):
        cache.put(dict(INPUTS, i=i % 5), *codec.encode(_result(cubin=b"\x7fELF" + bytes([i % 5]) * 100000)))


def test_concurrent_writers_leave_whole_entries(tmp_path):
    """Four processes store the same five entries over and over: every entry reads back whole, no temp files."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), 40)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    cache = ArtifactCache(str(tmp_path))
    codec = CompileResultCodec(launch_reader(TritonLaunch))
    for i in range(5):
        assert codec.decode(*cache.get(dict(INPUTS, i=i))).cubin == b"\x7fELF" + bytes([i]) * 100000
    leftovers = [n for _, _, names in os.walk(tmp_path) for n in names if not n.endswith(".entry")]
    assert leftovers == []


class _Runtime:
    """A runtime face with only what CompileCache reads."""

    def __init__(self, inputs):
        self.cache_inputs = lambda request, kernel: dict(inputs, key=request)
        self.launch_from_json = launch_reader(TritonLaunch)


def test_compile_cache_lookup_and_store(tmp_path):
    cc = CompileCache(str(tmp_path))
    rt = _Runtime(INPUTS)
    first = cc.lookup(rt, "key-1", None)
    assert isinstance(first, dict)  # a miss: the inputs to store under
    cc.store(rt, first, _result())
    assert cc.lookup(rt, "key-1", None) == _result()
    assert isinstance(cc.lookup(rt, "key-2", None), dict)
    rt.cache_inputs = None
    assert cc.lookup(rt, "key-1", None) is None  # a runtime without a cache: nothing looked up


class _NoCompiles:
    """An executor that fails the test if the build hands it any compile."""

    def run(self, fn, tasks, init, initargs):
        tasks = list(tasks)
        if tasks:
            raise AssertionError(f"{len(tasks)} compiles were started although every result is cached")
        return iter(())


def test_a_rebuild_from_the_cache_compiles_nothing_and_writes_the_same_bytes(small_build, tmp_path):
    """The small real bundle again, from its plan and its build's cache: no compile task, identical bytes."""
    from nojit.aot.build import BuildOptions, build

    out = str(tmp_path / "again.nojit")
    build(BuildOptions(output=out, plan_in=small_build["plan"], cache_dir=str(small_build["dir"] / "cache"),
                       executor=_NoCompiles(), progress=False))
    assert open(out, "rb").read() == open(small_build["bundle"], "rb").read()


def test_every_runtime_declares_its_cache_inputs_and_launch_type():
    """A runtime without them would compile every request on every build (aot/compile_cache.py)."""
    from nojit.aot.runtimes import RUNTIMES

    missing = [name for name, rt in RUNTIMES.items() if rt.cache_inputs is None or rt.launch_from_json is None]
    assert missing == []
