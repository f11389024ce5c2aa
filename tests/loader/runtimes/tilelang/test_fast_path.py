"""The C launch path of TileLang variants (csrc/nojit_fast_tilelang.h) against the Python path.

For every call, the C plan's dims and packed parameters must equal what the Python path hands the
cffi launcher; where the Python path raises, C must decline (so the Python path raises the same
typed error); where C declines a call the Python path accepts, only an eager `select` may be the
reason. Plans are the mHC launch shapes, random expression trees (hypothesis), and, where
NOJIT_TEST_TILELANG_BUNDLE names a bundle, its real variants (tests/loader/runtimes/tilelang/test_serving.py runs the
same check on the 40 variants it builds).
"""

from __future__ import annotations

import os
import struct
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nojit.loader.runtimes.tilelang.serving as ts
from nojit.loader.bundle.manifest import Entry, TileLangLaunch
from nojit.loader.bundle.tilelang_key import MISSING
from nojit.loader.runtimes.triton.fast import fast_module
from tests.support.common import ROOT

pytestmark = pytest.mark.skipif(fast_module() is None, reason="the C extension is not built")

FUNCTION = 0x5EED


class _Bundle:
    path = "<test bundle>"

    def read_blob(self, blob: str) -> bytes:  # pragma: no cover - never loaded: the function is preset
        raise AssertionError("no module load in these tests")


def variant_for(launch: TileLangLaunch, tensor_order: tuple[str, ...] | None = None,
                blob: str = "0" * 64) -> ts.TileLangVariant:
    order = tensor_order or tuple(t["name"] for t in sorted(launch.tensor_params, key=lambda t: t["position"]))
    entry = Entry("m:k", {"args": []}, "exact", blob, launch)
    v = ts.TileLangVariant(entry, _Bundle(), order)
    v._functions[0] = FUNCTION
    return v


def python_outcome(v: ts.TileLangVariant, tensors: tuple, monkeypatch) -> Any:
    """What the Python path does with the call: ("launch", grid, block, smem, packed bytes), ("empty",) or the error."""
    seen: list[Any] = []

    def record(function, gx, gy, gz, bx, by, bz, smem, stream, types, args, nargs, *rest):
        assert function == FUNCTION and stream == 77 and nargs == len(args) == len(types)
        if not all(0 <= x < 2**32 for x in (gx, gy, gz, bx, by, bz, smem)):
            raise OverflowError("as cffi raises for a uint32_t argument out of range")
        packed = b"".join(struct.pack("<Q", a) if t in b"pl" else struct.pack("<I", a & 0xFFFFFFFF) + b"\0" * 4
                          for t, a in zip(types, args))
        seen.append(("launch", (gx, gy, gz), (bx, by, bz), smem, packed))
        return 0

    monkeypatch.setattr(ts, "current_device", lambda: 0)
    monkeypatch.setattr(ts, "current_stream", lambda d: 77)
    v._c_launch = record
    try:
        v._launch_python(tensors)
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the error itself
        return exc
    return seen[0] if seen else ("empty",)


def c_outcome(v: ts.TileLangVariant, tensors: tuple) -> Any:
    r = fast_module().tl_pack(v._plan, tensors)
    if r is None or r == 0:
        return None if r is None else ("empty",)
    grid, block, smem, packed = r
    return ("launch", grid, block, smem, packed)


def has_select(expr: Any) -> bool:
    return isinstance(expr, dict) and "op" in expr and (expr["op"] == "select" or any(map(has_select, expr["args"])))


def assert_parity(v: ts.TileLangVariant, tensors: tuple, monkeypatch, exact: bool = True) -> Any:
    py, c = python_outcome(v, tensors, monkeypatch), c_outcome(v, tensors)
    if isinstance(py, Exception):
        assert c is None, (py, c)
    elif c is None:  # C evaluates select eagerly, and range-checks every grid value even where another is 0
        assert not exact and (py == ("empty",) or any(map(has_select, (*v.launch.grid, *v.launch.block)))), py
    else:
        assert c == py
    return py


def post_launch(grid=({"var": "num_tokens"}, 1, 1), block=(128, 1, 1)) -> TileLangLaunch:
    """The shape of vLLM's mhc_post plan: five tensors, num_tokens from a's first axis."""
    names = [("a", "float32", 3), ("b", "bfloat16", 3), ("c", "float32", 2), ("d", "bfloat16", 2), ("x", "bfloat16", 3)]
    tparams = tuple({"dtype": dt, "name": n, "position": i, "shape": [{"var": "num_tokens"}] + [4] * (nd - 1),
                     "strides": [1] * nd, "used_by_kernel": True} for i, (n, dt, nd) in enumerate(names))
    params = tuple({"dtype": dt, "kind": "tensor", "name": n} for n, dt, _ in names) + (
        {"ctype": "int32", "kind": "scalar", "name": "num_tokens"},)
    return TileLangLaunch("k", params, tparams, {"num_tokens": {"param": "a", "dim": 0}}, grid, block, 10240, True,
                          None, False)


def fused_launch(grid, ctype: str = "int32") -> TileLangLaunch:
    """The shape of mhc_fused: num_tokens and split_k from two tensors, both passed as scalars."""
    tparams = ({"dtype": "bfloat16", "name": "x", "position": 0, "shape": [{"var": "num_tokens"}, 8], "strides": [8, 1],
                "used_by_kernel": True},
               {"dtype": "float32", "name": "yp_out", "position": 1, "shape": [{"var": "split_k"}, 4],
                "strides": [4, 1], "used_by_kernel": True})
    params = ({"dtype": "bfloat16", "kind": "tensor", "name": "x"},
              {"dtype": "float32", "kind": "tensor", "name": "yp_out"},
              {"ctype": ctype, "kind": "scalar", "name": "num_tokens"},
              {"ctype": "int32", "kind": "scalar", "name": "split_k"})
    dyn = {"num_tokens": {"param": "x", "dim": 0}, "split_k": {"param": "yp_out", "dim": 0}}
    return TileLangLaunch("k", params, tparams, dyn, grid, (128, 1, 1), 0, True, None, False)


def post_tensors(n: int, **override: Any) -> tuple:
    t = {"a": torch.empty(n, 4, 4), "b": torch.empty(n, 4, 8, dtype=torch.bfloat16), "c": torch.empty(n, 4),
         "d": torch.empty(n, 8, dtype=torch.bfloat16), "x": torch.empty(n, 4, 8, dtype=torch.bfloat16)}
    t.update(override)
    return tuple(t[k] for k in "abcdx")


@pytest.mark.parametrize("n", [0, 1, 7, 64, 513])
def test_post_plan_matches_the_python_path(n, monkeypatch):
    v = variant_for(post_launch())
    assert v._plan is not None
    out = assert_parity(v, post_tensors(n), monkeypatch)
    assert out == ("empty",) if n == 0 else out[1] == (n, 1, 1) and out[3] == 10240


@pytest.mark.parametrize("bad", [
    {"a": torch.empty(3, 4, 4, dtype=torch.float16)},  # dtype
    {"c": torch.empty(3, 4, 1)},  # rank
    {"d": torch.empty(8, 3, dtype=torch.bfloat16).t()},  # not contiguous
    {"x": MISSING},
    {"b": "not a tensor"},
])
def test_every_check_fails_the_same_way(bad, monkeypatch):
    """C declines each bad call; through __call__ the Python path raises the error it raised before."""
    v = variant_for(post_launch())
    tensors = post_tensors(3, **bad)
    assert c_outcome(v, tensors) is None
    py = python_outcome(v, tensors, monkeypatch)
    assert isinstance(py, Exception)
    with pytest.raises(type(py)) as info:
        v(tensors)  # the C path first, then the Python path
    assert str(info.value) == str(py)


def test_call_launches_through_c_and_falls_back_only_when_declined(monkeypatch):
    """__call__ on the C plan hands the driver entry nothing through the cffi launcher; a declined call does."""
    v = variant_for(post_launch())
    calls: list[Any] = []
    monkeypatch.setattr(ts, "current_device", lambda: 0)
    monkeypatch.setattr(ts, "current_stream", lambda d: 77)
    v._c_launch = lambda *a: calls.append(a) or 0
    v._tl_launch = lambda plan, tensors, d, s: 0  # C launched
    v(post_tensors(5))
    assert calls == []
    v._tl_launch = lambda plan, tensors, d, s: 1  # C declined
    v(post_tensors(5))
    assert len(calls) == 1 and calls[0][1:4] == (5, 1, 1)
    v._tl_launch = lambda plan, tensors, d, s: -700
    with pytest.raises(ts.LaunchError, match="CUresult 700"):
        v(post_tensors(5))


def test_fast_path_setting_off_keeps_the_python_path(monkeypatch):
    monkeypatch.setenv("NOJIT_FAST_PATH", "0")
    assert variant_for(post_launch())._plan is None


@pytest.mark.parametrize("n,k", [(1, 1), (7, 8), (32, 4), (70000, 3), (2**31 + 5, 1)])
@pytest.mark.parametrize("ctype", ["int32", "int64"])
def test_fused_plan_two_variables(n, k, ctype, monkeypatch):
    v = variant_for(fused_launch(({"var": "num_tokens"}, 12, {"var": "split_k"}), ctype))
    x = torch.empty(1, 8, dtype=torch.bfloat16).expand(n, 8) if n > 4096 else torch.empty(n, 8, dtype=torch.bfloat16)
    tensors = (x, torch.empty(k, 4))
    out = assert_parity(v, tensors, monkeypatch)
    if n <= 4096:
        assert out[1] == (n, 12, k)
    else:  # an expanded (stride-0) tensor is not contiguous: both refuse it
        assert isinstance(out, TypeError)


_OPNAMES = ["+", "-", "*", "//", "%", "min", "max", "<", "<=", "=="]
_leaf = st.one_of(st.integers(-40, 40), st.sampled_from([{"var": "num_tokens"}, {"var": "split_k"}]),
                  st.integers(-(2**62), 2**62))


def _node(children):
    binary = st.builds(lambda op, a, b: {"op": op, "args": [a, b]}, st.sampled_from(_OPNAMES), children, children)
    select = st.builds(lambda c, a, b: {"op": "select", "args": [c, a, b]}, children, children, children)
    return st.one_of(binary, select)


exprs = st.recursive(_leaf, _node, max_leaves=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gx=exprs, gy=exprs, bx=exprs, n=st.integers(0, 40), k=st.integers(0, 9))
def test_random_geometry_matches_the_python_evaluator(gx, gy, bx, n, k, monkeypatch):
    launch = fused_launch((gx, gy, {"var": "split_k"}))
    launch = TileLangLaunch(launch.symbol, launch.params, launch.tensor_params, launch.dynamic_vars, launch.grid,
                            (bx, 1, 1), 0, False, None, False)
    v = variant_for(launch)
    assert v._plan is not None
    assert_parity(v, (torch.empty(n, 8, dtype=torch.bfloat16), torch.empty(k, 4)), monkeypatch, exact=False)


def tensors_for(launch: TileLangLaunch, v: ts.TileLangVariant, n: int, split_k: int) -> tuple:
    """Contiguous tensors of the plan's dtypes and shapes, num_tokens = n and any other variable = split_k."""
    by_name = {}
    for t in launch.tensor_params:
        shape = [d if isinstance(d, int) else (n if d["var"] == "num_tokens" else split_k) for d in t["shape"]]
        by_name[t["name"]] = torch.empty(shape, dtype=getattr(torch, t["dtype"]))
    order = tuple(t["name"] for t in sorted(launch.tensor_params, key=lambda t: t["position"]))
    return tuple(by_name[name] for name in order)


def bundle_parity(path: str, monkeypatch) -> int:
    """Every TileLang variant of a bundle: C and Python agree over several token counts (no declines)."""
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(path)
    n_checked = 0
    for e in b.manifest.entries:
        if not isinstance(e.launch, TileLangLaunch):
            continue
        v = variant_for(e.launch)
        assert v._plan is not None, e.kernel
        for n in (0, 1, 5, 64, 300):
            for split_k in (1, 3):
                tensors = tensors_for(e.launch, v, n, split_k)
                out = assert_parity(v, tensors, monkeypatch)
                assert not isinstance(out, Exception), (e.kernel, out)
        n_checked += 1
    return n_checked


@pytest.mark.skipif(not os.environ.get("NOJIT_TEST_TILELANG_BUNDLE"), reason="NOJIT_TEST_TILELANG_BUNDLE not set")
def test_real_bundle_variants(monkeypatch):
    assert bundle_parity(os.environ["NOJIT_TEST_TILELANG_BUNDLE"], monkeypatch) >= 1


def test_c_and_python_paths_reach_the_stand_in_driver_identically(tmp_path):
    """End to end on the stand-in libcuda (tests/csrc/fake_libcuda.c): module load, the driver entry handed to C,
    then each call once through the C path and once through the Python path; the driver logs the same launch."""
    import shutil
    import subprocess
    import sys
    import textwrap

    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler to build the stand-in driver")
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(ROOT, "csrc"),
                   os.path.join(ROOT, "tests", "csrc", "fake_libcuda.c"), "-o", str(tmp_path / "libcuda.so.1")], check=True)
    script = textwrap.dedent("""
        import torch
        import nojit.loader.runtimes.tilelang.serving as ts
        from tests.loader.runtimes.tilelang.test_fast_path import fused_launch, post_launch, post_tensors, variant_for

        class Blobs:
            path = "<stand-in>"
            def __init__(self, image): self.image = image
            def read_blob(self, blob): return self.image

        ts.current_device = lambda: 0
        ts.current_stream = lambda d: 99
        post = variant_for(post_launch())
        post._functions.clear()
        post._bundle = Blobs(b"FAKE k 8,8,8,8,8,4")
        fused = variant_for(fused_launch(({"var": "num_tokens"}, 12, {"var": "split_k"}), "int64"), blob="1" * 64)
        fused._functions.clear()
        fused._bundle = Blobs(b"FAKE k 8,8,8,4")
        calls = [(post, post_tensors(n)) for n in (1, 7, 300)]
        calls += [(fused, (torch.empty(n, 8, dtype=torch.bfloat16), torch.empty(k, 4))) for n, k in ((7, 8), (32, 4))]
        for v, tensors in calls:
            v(tensors)  # the C path (the first call loads the module and hands C the driver entry)
            v._launch_python(tensors)
        print("C plans", sum(v._plan is not None for v in (post, fused)))
    """)
    log = tmp_path / "log"
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path), "FAKE_CUDA_LOG": str(log)}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode == 0 and "C plans 2" in p.stdout, p.stderr[-3000:]
    lines = [x for x in log.read_text().splitlines() if x.startswith("grid=")]
    assert len(lines) == 10
    for c_line, py_line in zip(lines[::2], lines[1::2]):
        assert c_line == py_line
    assert lines[0].startswith("grid=1,1,1 block=128,1,1 smem=10240 stream=99 nattrs=1 attrs=6:1,")
    assert lines[6].startswith("grid=7,12,8 ") and lines[6].endswith(",0000000000000007,00000008")


@pytest.mark.parametrize("grid, block, why", [
    (({"op": "-", "args": [{"var": "split_k"}, 9]}, 1, 1), (128, 1, 1), "outside \\[0, 2\\^32\\)"),  # negative
    (({"op": "*", "args": [{"var": "num_tokens"}, 1 << 40]}, 1, 1), (128, 1, 1), "outside"),  # past 2^32
    (({"op": "//", "args": [{"var": "num_tokens"}, {"op": "-", "args": [{"var": "split_k"}, 3]}]}, 1, 1), (128, 1, 1),
     "division by zero"),
    (({"op": "*", "args": [{"var": "num_tokens"}, 1 << 28]}, 1, 1), (128, 1, 1), "x = .* is outside \\[0, 2147483647\\]"),
    ((1, {"op": "*", "args": [{"var": "num_tokens"}, 20000]}, 1), (128, 1, 1), "y = .* is outside \\[0, 65535\\]"),
    ((1, 1, 1), ({"op": "*", "args": [{"var": "num_tokens"}, 512]}, 1, 1), "block .* x = .* outside \\[1, 1024\\]"),
    ((1, 1, 1), (1, 1, {"op": "*", "args": [{"var": "split_k"}, 32]}), "z = 96 is outside \\[1, 64\\]"),
    ((1, 1, 1), ({"op": "-", "args": [{"var": "split_k"}, 3]}, 1, 1), "x = 0 is outside \\[1, 1024\\]"),
    ((1, 1, 1), (512, {"op": "+", "args": [{"var": "split_k"}, 0]}, 1), "more than 1024 threads"),
])
def test_launch_sizes_out_of_range_are_a_launch_error_on_both_paths(grid, block, why, monkeypatch):
    """Negative, overflowing, zero-dividing or past CUDA's grid/block limits at launch (num_tokens 8, split_k 3):
    C declines and the Python path raises LaunchError (it raised a raw ValueError, or passed 2^40 to the driver)."""
    from nojit.loader.errors import LaunchError

    launch = fused_launch(grid)
    launch = TileLangLaunch(launch.symbol, launch.params, launch.tensor_params, launch.dynamic_vars, grid, block, 0,
                            False, None, False)
    v = variant_for(launch)
    tensors = (torch.empty(8, 8, dtype=torch.bfloat16), torch.empty(3, 4))
    assert c_outcome(v, tensors) is None
    py = python_outcome(v, tensors, monkeypatch)
    assert isinstance(py, LaunchError) and py.fix, py
    assert __import__("re").search(why, py.message), py.message
    with pytest.raises(LaunchError):
        v(tensors)  # the C path first, then the Python path
    ok = variant_for(fused_launch(({"var": "num_tokens"}, 1, {"var": "split_k"})))  # control: in range, launched
    assert c_outcome(ok, tensors)[1] == (8, 1, 3) == python_outcome(ok, tensors, monkeypatch)[1]
