"""The one-call C path (csrc/nojit_fast.c, loader/runtimes/triton/fast.py) against the Python path and Triton.

For drawn calls (ints around every class boundary, aligned and misaligned tensors of many
dtypes, None, bools, floats, constexprs, launch options): the C table finds an entry exactly
when the call's key (nojit's Python key, itself checked against Triton's binder) is that
entry's key, and the bytes it packs equal the bytes computed here independently with struct.
End to end, on the stand-in driver, a real bundle served through the fast path hands the
driver the same launches as the Python path.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.loader.bundle.test_triton_key_parity import DTYPES, call_args, ours, specializer, tensor, theirs
from nojit.loader.runtimes.triton.fast import TritonFastPath, fast_module
from nojit.loader.bundle.triton_key import make_binder
from tests.support.common import ROOT

pytestmark = pytest.mark.skipif(fast_module() is None, reason="the C fast path is not built")

_CODE = {"i32": "i", "i64": "l", "u64": "L", "u1": "c", "fp32": "f", "fp16": "e", "bf16": "b", "fp64": "d"}


def variant_for(key) -> SimpleNamespace:
    """A stand-in variant with the launch arguments Triton's cubin for `key` would take."""
    args = []
    for i, (ty, attr) in enumerate(key[0]):
        if ty != "constexpr":
            args.append((i, "p" if ty.startswith("*") else _CODE[ty]))
    launch = SimpleNamespace(args=tuple(args), num_ctas=1, num_warps=4, shared=0, launch_pdl=False,
                             launch_cooperative_grid=False)
    return SimpleNamespace(launch=launch, _scratch=False, _cluster=(1, 1, 1))


def bound_of(fn, kwargs, options):
    return make_binder(fn, specializer)(**kwargs, **options)[0]


def expected_bytes(launch, bound) -> bytes:
    """The 8-byte parameter slots, by struct: independent of both the C and the Python packer."""
    out = b""
    for i, code in launch.args:
        v = bound[i]
        if code == "p":
            b = struct.pack("<Q", v.data_ptr())
        elif code in "fedb":
            f = float(v)
            if code == "f":
                b = np.float32(f).tobytes()  # IEEE rounding, overflow to inf, like the C cast
            elif code == "d":
                b = struct.pack("<d", f)
            elif code == "e":
                b = np.float16(f).tobytes()
            else:
                b = torch.tensor([f], dtype=torch.bfloat16).view(torch.int16).numpy().tobytes()
        else:
            n = {"i": 4, "l": 8, "L": 8, "c": 1}[code]
            b = (int(v) & ((1 << (8 * n)) - 1)).to_bytes(n, "little")
        out += b.ljust(8, b"\0")
    return out


def check_pair(fn, first, second):
    """An entry for the first call's key; both calls looked up in C."""
    m = fast_module()
    try:
        key1 = theirs(fn, *first)
    except (OverflowError, TypeError):
        return "refused"
    assert ours(fn, *first) == key1
    fast = TritonFastPath(fn, specializer, {key1: variant_for(key1)})
    table = fast.tables.get(key1[1])
    if table is None:  # the key holds something C does not compare (NaN, ...): always the Python path
        assert fast.codes(key1[0]) is None
        return "python-only"
    idx, _codes = m.lookup(table, bound_of(fn, *first))
    bound = bound_of(fn, *first)
    if idx == 0:
        packed = m.pack(table, 0, bound)
        if packed is None:  # C declines where Python's int() raises (a non-finite float in an int slot)
            with pytest.raises((ValueError, OverflowError)):
                expected_bytes(variant_for(key1).launch, bound)
        else:
            assert packed == expected_bytes(variant_for(key1).launch, bound)
    try:
        key2 = theirs(fn, *second)
    except (OverflowError, TypeError):
        key2 = None
    if first[1] == second[1]:  # same options: the same table decides
        idx2, _ = m.lookup(table, bound_of(fn, *second)) if key2 is not None else (-1, None)
        if idx2 == 0:
            assert key2 == key1, f"C matched a different key:\n{key2}\n{key1}"
    return "hit" if idx == 0 else "miss"


OUTCOMES: dict[str, int] = {}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_c_key_and_bytes_match_python_every_kind(data):
    from tests.support.triton_test_kernels import every_kind

    first = data.draw(call_args(every_kind))
    # the second call often differs from the first in one argument only
    second = data.draw(st.sampled_from(["same", "other"]))
    if second == "same":
        kwargs, options = first
        name = data.draw(st.sampled_from(sorted(kwargs)))
        alt = data.draw(call_args(every_kind))[0][name]
        second = ({**kwargs, name: alt}, options)
    else:
        second = data.draw(call_args(every_kind))
    outcome = check_pair(every_kind, first, second)
    OUTCOMES[outcome] = OUTCOMES.get(outcome, 0) + 1


def test_the_drawn_calls_mostly_hit():
    """The property above must not pass by never matching: most drawn keys are served by C."""
    if not OUTCOMES:
        pytest.skip("run together with the property test")
    assert OUTCOMES.get("hit", 0) > 5 * OUTCOMES.get("miss", 0), OUTCOMES


def test_boundary_values_hit_and_pack_exactly():
    from tests.support.triton_test_kernels import every_kind

    m = fast_module()
    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False), q=tensor(torch.bfloat16, False),
                n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
    cases = [("n", v) for v in [0, 1, 16, -16, 17, -17, 2**31, -(2**31) - 1, 2**63, 2**64 - 16]]
    cases += [("n_dns", v) for v in [0, 1, 16]] + [("n_noalign", v) for v in [1, 16, 17]]
    cases += [("n64", v) for v in [1, 16, 17, -1]] + [("x", v) for v in [2.5, 1, 16, True, 2**63]]
    cases += [("maybe_ptr", v) for v in [None, tensor(torch.float32, True), tensor(torch.int32, False)]]
    cases += [("p", tensor(d, a)) for d in DTYPES for a in (True, False)] + [("BLOCK", v) for v in (1, 16, True)]
    keys = {}
    for field, v in cases:
        kw = {**base, field: v}
        keys[theirs(every_kind, kw, {})] = kw
    exact = {k: variant_for(k) for k in keys}
    fast = TritonFastPath(every_kind, specializer, exact)
    seen = set()
    for key, kw in keys.items():
        table = fast.tables[key[1]]
        idx, _ = m.lookup(table, bound_of(every_kind, kw, {}))
        assert idx >= 0, f"no C hit for {key}"
        variant = fast.variants[id(table)][idx]
        assert variant is exact[key], f"C chose another entry for {key}"
        bound = bound_of(every_kind, kw, {})
        assert m.pack(table, idx, bound) == expected_bytes(variant.launch, bound), key
        seen.add(idx)
    assert len(seen) == len(keys)


def test_unknown_arguments_are_misses_not_errors():
    from tests.support.triton_test_kernels import every_kind

    m = fast_module()
    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False), q=tensor(torch.bfloat16, False),
                n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
    key = theirs(every_kind, base, {})
    fast = TritonFastPath(every_kind, specializer, {key: variant_for(key)})
    table = fast.tables[key[1]]
    for field, v in [("n", 2**64), ("n", -(2**63) - 1), ("n", "text"), ("n", (1, 2)), ("BLOCK", 64.0), ("BLOCK", 65),
                     ("p", object()), ("n", 17)]:
        bound = list(bound_of(every_kind, base, {}))  # Python's binder would refuse some values: set them directly
        bound[[p.name for p in every_kind.params].index(field)] = v
        bound = tuple(bound)
        assert m.lookup(table, bound)[0] == -1, (field, v)
    assert m.lookup(table, (1, 2))[0] == -1  # wrong arity


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    """The stand-in libcuda.so.1 of the launcher tests (tests/csrc/fake_libcuda.c)."""
    import shutil

    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler to build the stand-in driver")
    d = tmp_path_factory.mktemp("fakecuda")
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "csrc", "fake_libcuda.c"), "-o", str(d / "libcuda.so.1")], check=True)
    return d


def test_real_bundle_fast_and_python_paths_hand_the_driver_the_same_launches(small_build, fake_driver, tmp_path):
    """A real bundle's exact keys, called through kernel[grid] in one process: each call once through the C bound
    grid, once through Triton's own lambda into the C runner and once through the Python path; the stand-in driver
    sees the same launch byte for byte; uninstall gives every kernel its own class back."""
    script = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, "tests/gpu/checks")
        from nojit.loader.install import install
        from triton_harness import synthesize
        import nojit.loader.launch.torch_cuda as tc
        import nojit.loader.runtimes.triton.serving as ts
        import nojit.loader.runtimes.triton.fast as tf
        tc.current_device = ts.current_device = tf.current_device = lambda: 0
        tc.current_stream = ts.current_stream = tf.current_stream = lambda d: 77
        tc.device_capability = lambda d: (9, 0)
        inst = install(sys.argv[1], mode="strict", allow_mismatch=frozenset({"arch"}))
        SIZE = dict(p=8, l=8, L=8, d=8, i=4, u=4, f=4, h=2, H=2, e=2, b=2, c=1)
        n = 0
        for kid, server in sorted(inst.servers("triton").items()):
            assert server.entry_point != server.run, kid
            server.prepare()
            assert type(server.entry_point).__name__ == "builtin_function_or_method", kid  # the C runner
            fn = server.fn
            for key, variant in sorted(server.exact.items(), key=repr):
                kwargs, _bufs, _ = synthesize(fn, key, 7, device="cpu")
                # the stand-in driver logs each parameter by the size the cubin declares
                sizes = [SIZE[c] for _, c in variant.launch.args] + [8, 8]
                os.environ["FAKE_CUDA_PARAM_SIZES"] = ",".join(map(str, sizes))
                bound = server._binder(**kwargs)[0]
                assert tf.fast_module().lookup(server.fast.tables[key[1]], bound)[0] >= 0, (kid, key)
                served = type(fn)
                assert "_nj_served_base" in served.__dict__ and isinstance(fn, served.__mro__[1]), kid
                assert type(fn[(3, 2, 1)]).__name__ == "builtin_function_or_method", kid  # kernel[grid] bound in C
                assert fn[(3, 2, 1)](**kwargs) is variant, (kid, key)  # the C path
                tf.restore_getitem(fn)
                assert fn[(3, 2, 1)](**kwargs) is variant, (kid, key)  # the C runner behind Triton's lambda
                tf.serve_getitem(fn)
                assert type(fn) is served
                fn.run = server.run
                assert fn[(3, 2, 1)](**kwargs) is variant, (kid, key)  # the Python path
                fn.run = server.entry_point
                n += 1
        fns = [s.fn for s in inst.servers("triton").values()]
        inst.uninstall()
        from triton.runtime.jit import JITFunction
        assert all(type(f) is JITFunction and "run" not in f.__dict__ for f in fns)  # their own class back
        print("launched", n)
    """)
    log = tmp_path / "log"
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_driver), "FAKE_CUDA_LOG": str(log)}
    p = subprocess.run([sys.executable, "-c", script, small_build["bundle"]], capture_output=True, text=True, env=env,
                       cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [x for x in log.read_text().splitlines() if x.startswith("grid=")]
    n = int(p.stdout.split("launched")[1])
    assert n >= 10 and len(lines) == 3 * n
    for fast, runner, python in zip(lines[::3], lines[1::3], lines[2::3]):
        assert fast == runner == python


# ------------------------------------------------------------------------------ the C runner's binding
def _runner_for(fn, exact):
    """make_run over a stand-in server whose Python paths record that they were taken."""
    from nojit.loader.runtimes.triton.fast import make_run
    from nojit.loader.runtimes.triton.serving import TritonKernelServer

    fast = TritonFastPath(fn, specializer, exact)
    taken = []
    server = SimpleNamespace(fn=fn, names=tuple(p.name for p in fn.params), record=SimpleNamespace(id="t"),
                             _options={}, _debug=False, _instrumentation_mode="",
                             run=lambda *a, **k: taken.append(("slow", a, k)) or "slow")
    server.options_key = lambda o: TritonKernelServer.options_key(server, o)
    import nojit.loader.launch.torch_cuda as tc

    saved = tc.current_device, tc.current_stream
    tc.current_device, tc.current_stream = (lambda: 0), (lambda d: 77)  # no GPU here; C takes them at make_run
    try:
        run = make_run(server, fast)
    finally:
        tc.current_device, tc.current_stream = saved
    return fast, run, taken


def _call_forms(draw, fn, kwargs, options):
    """The same call written as vLLM might: a positional prefix, the rest as keywords in any order,
    defaults left out."""
    names = [p.name for p in fn.params]
    npos = draw(st.integers(0, len(names)))
    pos = tuple(kwargs[n] for n in names[:npos])
    rest = [n for n in names[npos:]]
    rest = draw(st.permutations(rest))
    kw = {n: kwargs[n] for n in rest if not (n == "MODE" and kwargs[n] == "relu" and draw(st.booleans()))}
    return pos, kw, dict(options)


def draw_keyed_call(data: Any, kernel: Any) -> tuple[dict, dict, Any] | None:
    """A drawn call of `kernel` (keywords, launch options, one MODE) with Triton's own key for it; None where
    Triton refuses the call (a value out of its range)."""
    kwargs, options = data.draw(call_args(kernel))
    kwargs = {**kwargs, "MODE": data.draw(st.sampled_from(["relu", "gelu"]))}
    try:
        return kwargs, options, theirs(kernel, kwargs, options)
    except (OverflowError, TypeError):
        return None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_c_binding_gives_the_python_key_and_bytes(data):
    """The C runner binds positional, keyword and default arguments (and launch options) to the same key
    and the same packed bytes as the Python binder, for an entry of the first call's key."""
    from tests.support.triton_test_kernels import every_kind

    m = fast_module()
    drawn = draw_keyed_call(data, every_kind)
    if drawn is None:
        return
    kwargs, options, key = drawn
    variant = variant_for(key)
    fast, run, taken = _runner_for(every_kind, {key: variant})
    table = fast.tables.get(key[1])
    if table is None:
        assert fast.codes(key[0]) is None
        return
    if options:  # the options' table as the general run records it
        fast.tables_by_raw[tuple(options.items())] = table
    for _ in range(2):  # the second time the options come from the runner's own cache
        pos, kw, opts = _call_forms(data.draw, every_kind, kwargs, options)
        how, codes, idx, packed = m.probe(fast.runner, *pos, grid=(1,), warmup=False, **kw, **opts)
        assert how == "table"
        bound = bound_of(every_kind, kwargs, options)
        assert (idx, codes) == m.lookup(table, bound)
        assert idx == 0
        assert codes == fast.codes(key[0])
        if packed is not None:
            assert packed == expected_bytes(variant.launch, bound)
        else:
            with pytest.raises((ValueError, OverflowError)):
                expected_bytes(variant.launch, bound)
    # another drawn call: C finds the entry only for the same key
    kwargs2, _ = data.draw(call_args(every_kind))
    kwargs2 = {**kwargs2, "MODE": kwargs["MODE"]}
    pos, kw, opts = _call_forms(data.draw, every_kind, kwargs2, options)
    how, codes, idx, _ = m.probe(fast.runner, *pos, grid=(1,), warmup=False, **kw, **opts)
    if idx == 0:
        assert theirs(every_kind, kwargs2, options) == key


def test_calls_the_runner_does_not_take_go_to_python_unchanged():
    """Warmup, a missing or repeated argument, unseen options, a list grid: handed to the generated Python
    run as they came; Python then raises the TypeError or takes its own path."""
    from tests.support.triton_test_kernels import every_kind

    m = fast_module()
    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False), q=tensor(torch.bfloat16, False),
                n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
    key = theirs(every_kind, base, {})
    fast, run, taken = _runner_for(every_kind, {key: variant_for(key)})
    general = ("general", None, -1, None)
    assert m.probe(fast.runner, grid=(1,), warmup=False, **base)[2] == 0
    assert m.probe(fast.runner, grid=(1,), warmup=True, **base) == general
    assert m.probe(fast.runner, grid=(1,), **base) == general
    assert m.probe(fast.runner, warmup=False, **base) == general
    assert m.probe(fast.runner, grid=(1,), warmup=False, **{k: v for k, v in base.items() if k != "n"}) == general
    assert m.probe(fast.runner, base["p"], grid=(1,), warmup=False, **base) == general  # p given twice
    assert m.probe(fast.runner, grid=(1,), warmup=False, num_warps=8, **base) == general  # options not seen yet
    assert m.probe(fast.runner, *base.values(), "relu", 7, grid=(1,), warmup=False) == general  # too many
    with pytest.raises(TypeError):
        run(grid=(1,), warmup=False, **{k: v for k, v in base.items() if k != "n"})
    with pytest.raises(TypeError):
        run(base["p"], grid=(1,), warmup=False, **base)
    # a miss (an int the entry does not cover) goes to the server's own run with the call as it came
    run(grid=(1,), warmup=False, **{**base, "n": 17})
    assert taken and taken[-1][0] == "slow" and taken[-1][2]["n"] == 17 and taken[-1][2]["grid"] == (1,)


def test_the_runner_launches_through_the_driver_entry_with_grid_callables_and_options(tmp_path):
    """The runner's launch hands the driver entry the packed bytes (a recording stand-in for cuLaunchKernelEx),
    for a tuple grid, a grid callable (given {name: value}) and launch options."""
    import ctypes
    import shutil

    from tests.support.triton_test_kernels import every_kind

    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler for the stand-in driver entry")
    src = tmp_path / "rec.c"
    src.write_text(textwrap.dedent("""
        #include <string.h>
        #include "nojit_cuda_abi.h"
        unsigned grid[3]; unsigned long long stream; unsigned char params[512]; int calls;
        int rec_launch(const NjLaunchConfig *cfg, void *f, void **p, void **extra) {
            grid[0] = cfg->gridDimX; grid[1] = cfg->gridDimY; grid[2] = cfg->gridDimZ;
            stream = (unsigned long long)cfg->hStream;
            for (int i = 0; i < 12; i++) memcpy(params + 8 * i, p[i], 8);
            calls++; return 0;
        }
    """))
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(ROOT, "csrc"), str(src), "-o",
                    str(tmp_path / "librec.so")], check=True)
    lib = ctypes.CDLL(str(tmp_path / "librec.so"))
    m = fast_module()
    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False), q=tensor(torch.bfloat16, False),
                n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
    key = theirs(every_kind, base, {})
    key8 = theirs(every_kind, base, {"num_warps": 8})
    variant, variant8 = variant_for(key), variant_for(key8)
    fast, run, taken = _runner_for(every_kind, {key: variant, key8: variant8})

    device_type = m.dlpack_launch_device_type(1)  # the recording driver takes CPU tensors (kDLCPU)
    try:
        m.configure(m.tensor_type, m.dtypes, ctypes.cast(lib.rec_launch, ctypes.c_void_p).value)
        for t in fast.tables.values():
            m.set_function(t, 0, 0, 1)
        fast.tables_by_raw[(("num_warps", 8),)] = fast.tables[key8[1]]
        seen = []
        for grid, options, want in [((3, 2, 1), {}, variant), (lambda meta: (meta["n"] + 1,), {}, variant),
                                    ((5,), {"num_warps": 8}, variant8)]:
            assert every_kind_run(every_kind, run, grid, base, options) is want
            g = grid(dict(base)) if callable(grid) else grid
            assert ctypes.c_ulonglong.in_dll(lib, "stream").value == 77
            assert tuple((ctypes.c_uint * 3).in_dll(lib, "grid")) == tuple(g) + (1,) * (3 - len(g))
            n = len(want.launch.args)
            params = bytes((ctypes.c_ubyte * 512).in_dll(lib, "params"))
            assert params[: 8 * n] == expected_bytes(want.launch, bound_of(every_kind, base, {}))
            seen.append(ctypes.c_int.in_dll(lib, "calls").value)
        assert seen == [1, 2, 3] and not taken
    finally:
        from nojit.loader.launch import fast_module as fast_c

        m.configure(m.tensor_type, m.dtypes, 0)
        m.dlpack_launch_device_type(device_type)
        fast_c._launch_ready = False


def every_kind_run(fn, run, grid, kwargs, options):
    """kernel[grid](**kwargs) with `run` installed, as Triton's own __getitem__ calls it."""
    fn.run = run
    try:
        return fn[grid](**kwargs, **options)
    finally:
        del fn.run
