"""`kernel[grid]` bound in C (csrc/nojit_fast.c bind_grid, loader/runtimes/triton/fast.py serve_getitem): a served
JITFunction's `fn[grid](...)` skips Triton's lambda and its re-packing of keywords, and must do exactly
what `fn.run(grid=grid, warmup=False, *args, **kwargs)` does through Triton's own `__getitem__`: the same
launches (grid, stream, parameter bytes, through a recording stand-in for cuLaunchKernelEx), the same
calls handed to the Python paths (misses, generic entries, warmup, new options) with the same arguments,
the same errors; and a kernel whose `run` is not the C runner goes through Triton's lambda untouched."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.loader.runtimes.triton.test_fast import _call_forms, _runner_for, draw_keyed_call, variant_for
from tests.loader.bundle.test_triton_key_parity import call_args, tensor, theirs
from nojit.loader.launch import fast_module as fast_c
from nojit.loader.runtimes.triton.fast import fast_module, restore_getitem, serve_getitem
from tests.support.common import ROOT

pytestmark = pytest.mark.skipif(fast_module() is None or shutil.which("cc") is None,
                                reason="needs the built C fast path and a C compiler")

REC_C = """
#include <string.h>
#include "nojit_cuda_abi.h"
unsigned grid[3]; unsigned long long stream; unsigned char params[1024]; int calls, nparams;
int rec_launch(const NjLaunchConfig *cfg, void *f, void **p, void **extra) {
    grid[0] = cfg->gridDimX; grid[1] = cfg->gridDimY; grid[2] = cfg->gridDimZ;
    stream = (unsigned long long)cfg->hStream;
    memset(params, 0, sizeof params);
    for (int i = 0; i < nparams; i++) memcpy(params + 8 * i, p[i], 8);
    calls++; return 0;
}
"""


@pytest.fixture(scope="module")
def recorder(tmp_path_factory):
    """A recording cuLaunchKernelEx handed to the C module (restored after)."""
    d = tmp_path_factory.mktemp("rec")
    (d / "rec.c").write_text(REC_C)
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(ROOT, "csrc"), str(d / "rec.c"),
                    "-o", str(d / "librec.so")], check=True)
    lib = ctypes.CDLL(str(d / "librec.so"))
    m = fast_module()
    m.configure(m.tensor_type, m.dtypes, ctypes.cast(lib.rec_launch, ctypes.c_void_p).value)
    device_type = m.dlpack_launch_device_type(1)  # the recording driver takes CPU tensors (kDLCPU)
    try:
        yield lib
    finally:
        m.configure(m.tensor_type, m.dtypes, 0)
        m.dlpack_launch_device_type(device_type)
        fast_c._launch_ready = False


def _record(lib, calls_before: int) -> tuple:
    """(launches since calls_before, the last launch's grid, stream and parameter bytes)."""
    return (ctypes.c_int.in_dll(lib, "calls").value - calls_before, tuple((ctypes.c_uint * 3).in_dll(lib, "grid")),
            ctypes.c_ulonglong.in_dll(lib, "stream").value, bytes((ctypes.c_ubyte * 1024).in_dll(lib, "params")))


def _outcome(call):
    try:
        return ("ok", call())
    except Exception as exc:  # the same error type and text on both paths
        return ("raised", type(exc), str(exc))


def _both(fn, run, taken, lib, grid, pos, kw):
    """The call through Triton's own __getitem__ and through the C bound grid: what each did."""
    base = type(fn)
    fn.run = run
    try:
        n0, c0 = len(taken), ctypes.c_int.in_dll(lib, "calls").value
        triton = _outcome(lambda: base.__getitem__(fn, grid)(*pos, **kw)), taken[n0:], _record(lib, c0)
        assert serve_getitem(fn) and type(fn) is not base and isinstance(fn, base)
        try:
            launcher = fn[grid]
            assert type(launcher).__name__ == "builtin_function_or_method"
            n1, c1 = len(taken), ctypes.c_int.in_dll(lib, "calls").value
            ours = _outcome(lambda: launcher(*pos, **kw)), taken[n1:], _record(lib, c1)
        finally:
            restore_getitem(fn)
        assert type(fn) is base
    finally:
        del fn.run
    return triton, ours


LAUNCHED: list[bool] = []  # per drawn call: the bound grid launched in C
HANDED: list[bool] = []  # per drawn call: handed to a Python path


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_bound_grid_does_what_tritons_lambda_does(recorder, data):
    """Drawn calls (positional prefix, keywords in any order, defaults left out, launch options, a grid
    tuple or callable), an entry for the first one's key: the second drawn call is a hit or a miss; both go
    through Triton's __getitem__ and through the bound grid, and everything observable is the same."""
    from tests.support.triton_test_kernels import every_kind

    drawn = draw_keyed_call(data, every_kind)
    if drawn is None:
        return
    kwargs, options, key = drawn
    fast, run, taken = _runner_for(every_kind, {key: variant_for(key)})
    ctypes.c_int.in_dll(recorder, "nparams").value = len(variant_for(key).launch.args) + 2  # the one entry's
    m = fast_module()
    for t in fast.tables.values():
        m.set_function(t, 0, 0, 1)
    if options and fast.tables.get(key[1]) is not None:
        fast.tables_by_raw[tuple(options.items())] = fast.tables[key[1]]
    import nojit.loader.launch.torch_cuda as tc

    saved = tc.current_device, tc.current_stream
    tc.current_device, tc.current_stream = (lambda: 0), (lambda d: 77)
    try:
        for args in (kwargs, data.draw(call_args(every_kind))[0]):
            args = {**args, "MODE": kwargs["MODE"]}
            pos, kw, opts = _call_forms(data.draw, every_kind, args, options)
            grid = data.draw(st.sampled_from([(3, 2, 1), (5,), lambda meta: (2, 1)]))
            triton, ours = _both(every_kind, run, taken, recorder, grid, pos, {**kw, **opts})
            assert ours == triton
            LAUNCHED.append(ours[2][0] == 1 and ours[0][0] == "ok")
            HANDED.append(bool(ours[1]))
    finally:
        tc.current_device, tc.current_stream = saved


def test_the_drawn_calls_both_launch_and_miss():
    """The parity above compared real launches and real hand-overs, not only refusals."""
    assert sum(LAUNCHED) >= 20 and sum(HANDED) >= 5, (sum(LAUNCHED), sum(HANDED), len(LAUNCHED))


def test_calls_the_runner_does_not_take_go_where_they_go_today(recorder):
    """A miss, a missing or repeated argument, a grid= or warmup= keyword (Triton's lambda raises), a list
    grid: the same outcome and the same Python path as through Triton's lambda."""
    from tests.support.triton_test_kernels import every_kind

    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False), q=tensor(torch.bfloat16, False),
                n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
    key = theirs(every_kind, base, {})
    fast, run, taken = _runner_for(every_kind, {key: variant_for(key)})
    ctypes.c_int.in_dll(recorder, "nparams").value = len(variant_for(key).launch.args) + 2
    for t in fast.tables.values():
        fast_module().set_function(t, 0, 0, 1)
    import nojit.loader.launch.torch_cuda as tc

    saved = tc.current_device, tc.current_stream
    tc.current_device, tc.current_stream = (lambda: 0), (lambda d: 77)
    try:
        cases = [((), base), ((), {**base, "n": 17}), ((), {k: v for k, v in base.items() if k != "n"}),
                 ((base["p"],), base), ((), {**base, "grid": (1,)}), ((), {**base, "warmup": True}),
                 ((), {**base, "num_warps": 8})]
        for grid in [(3, 2, 1), [4, 1]]:
            for pos, kw in cases:
                triton, ours = _both(every_kind, run, taken, recorder, grid, pos, kw)
                assert ours == triton, (grid, sorted(kw))
        assert any(t[0] == "slow" and t[2]["n"] == 17 and t[2]["grid"] == (3, 2, 1) and t[2]["warmup"] is False
                   for t in taken)
    finally:
        tc.current_device, tc.current_stream = saved


def test_a_kernel_not_served_by_the_runner_keeps_tritons_lambda():
    """Where fn.run is not the C runner (not prepared, fast path off, recording, uninstalled after the
    grid was bound), fn[grid] is Triton's own lambda or its call goes through it."""
    from tests.support.triton_test_kernels import every_kind

    seen = []
    fn = every_kind
    base = type(fn)
    fn.run = lambda *a, **k: seen.append((a, k)) or "python run"
    assert serve_getitem(fn)
    try:
        launcher = fn[(1,)]
        assert launcher.__name__ == "<lambda>"  # Triton's own
        assert launcher(1, x=2) == "python run" and seen[-1] == ((1,), {"grid": (1,), "warmup": False, "x": 2})
        key_kwargs = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False),
                          q=tensor(torch.bfloat16, False), n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True,
                          x=2.5, maybe_ptr=None, BLOCK=64)
        key = theirs(fn, key_kwargs, {})
        _fast, run, _taken = _runner_for(fn, {key: variant_for(key)})
        fn.run = run
        bound = fn[(1,)]
        assert type(bound).__name__ == "builtin_function_or_method"
        fn.run = lambda *a, **k: seen.append((a, k)) or "replaced"  # replaced after the grid was bound
        assert bound(3, y=4) == "replaced" and seen[-1] == ((3,), {"grid": (1,), "warmup": False, "y": 4})
        del fn.run
        assert "run" not in fn.__dict__
        assert serve_getitem(fn)  # served twice: one subclass, not two
        assert type(fn).__mro__[1] is base
    finally:
        fn.__dict__.pop("run", None)
        restore_getitem(fn)
    assert type(fn) is base
    restore_getitem(fn)  # restoring twice is harmless
    assert type(fn) is base


def test_the_bound_grid_holds_no_references_after_a_call(recorder):
    """A hit, a miss and a Triton-lambda fallback, 200 times each: no reference to the kernel, the grid, the
    arguments or the variant is left behind (the C callable's own references go with it)."""
    import gc
    import sys

    from tests.support.triton_test_kernels import every_kind

    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False), q=tensor(torch.bfloat16, False),
                n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
    key = theirs(every_kind, base, {})
    variant = variant_for(key)
    fast, run, taken = _runner_for(every_kind, {key: variant})
    ctypes.c_int.in_dll(recorder, "nparams").value = len(variant.launch.args) + 2
    for t in fast.tables.values():
        fast_module().set_function(t, 0, 0, 1)
    import nojit.loader.launch.torch_cuda as tc

    saved = tc.current_device, tc.current_stream
    tc.current_device, tc.current_stream = (lambda: 0), (lambda d: 77)
    grid = tuple([3, 2, 1])  # not a code constant shared with other tests
    watched = [every_kind, grid, variant, base["p"], base["q"]]
    every_kind.run = run
    assert serve_getitem(every_kind)
    try:
        for kw in (base, {**base, "n": 17}, {**base, "warmup": True}):
            for _ in range(5):  # warm caches (option tables, interned names)
                _outcome(lambda: every_kind[grid](**kw))
            taken.clear()
            gc.collect()
            before = [sys.getrefcount(o) for o in watched]
            for _ in range(200):
                _outcome(lambda: every_kind[grid](**kw))
            taken.clear()
            gc.collect()
            assert [sys.getrefcount(o) for o in watched] == before, sorted(kw)
    finally:
        restore_getitem(every_kind)
        del every_kind.run
        tc.current_device, tc.current_stream = saved
