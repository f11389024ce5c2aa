"""Host cost of nojit's dispatch on the CPU box: what Python and C add on top of the driver call (issue 15).

    python bench/cpu_dispatch.py [--calls 20000]

No GPU: the driver's cuLaunchKernelEx is a no-op C function compiled here (cc), torch's device
and stream accessors are stand-in builtins (`int`, `abs`), and the kernel is the key-parity test's
`every_kind` (13 parameters: tensors, ints, floats, bool, None, constexprs) plus a 4-parameter
kernel shaped like vLLM's small helpers. Per call shape (positional, keywords, defaults, launch
options, a grid callable), host us per `kernel[grid](...)` (best batch: the box is shared):
  site      `fn[grid](a, b, name=value, ...)` from a call site with literal keywords (bench_fastpath.call_site),
            as vLLM's call sites are: the bound grid without the benchmark's own dict unpacking;
  bound     `fn[grid](*pos, **kw)`, __getitem__ included, on a served kernel: the C bound grid
            (csrc/nojit_fast.c bind_grid), no Triton lambda: nojit's path;
  lambda    `fn[grid](...)`, __getitem__ included, through Triton's own lambda into the C runner: the path
            before the bound grid;
  c-run     the C runner (`fn.run`, csrc/nojit_fast.c new_runner) through Triton's lambda, made once;
  py-run    the generated Python run in front of the same C launch (the path before the runner);
  launch    the C launch alone with the arguments bound already (m.launch(table, bound, grid, ...));
  no-op     `fn.run` a Python lambda that does nothing: Triton's own lambda and the keyword passing alone;
  floor     the no-op driver call in a C loop (m.floor).
Tensors are read through torch's DLPack C exchange API where torch has one (csrc/nojit_dlpack.h); the
`-torch` columns time the same calls with that read off (torch's `dtype` and `data_ptr()`: the path before).
Streams: the stand-in accessor here, so the DLPack stream read is timed on the H200 only.
The H200 numbers (real driver, real torch accessors) come from bench/bench_fastpath.py.
"""

from __future__ import annotations

import argparse
import ctypes
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))  # the repository root: tests.*

NOOP_C = "int noop_launch(const void *cfg, void *f, void **params, void **extra) { return 0; }\n"


def noop_launch_address(tmp: str) -> tuple[int, ctypes.CDLL]:
    src, lib = os.path.join(tmp, "noop.c"), os.path.join(tmp, "libnoop.so")
    with open(src, "w") as f:
        f.write(NOOP_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", src, "-o", lib], check=True)
    dll = ctypes.CDLL(lib)
    return ctypes.cast(dll.noop_launch, ctypes.c_void_p).value, dll


def per_call_us(f, calls: int, batches: int = 25) -> float:
    for _ in range(calls // 10):
        f()
    samples = []
    for _ in range(batches):
        t0 = time.thread_time_ns()  # CPU time of this thread: the box is shared, scheduling is not timed
        for _ in range(calls):
            f()
        samples.append((time.thread_time_ns() - t0) / calls / 1000)
    return min(samples)  # the box is shared: the least disturbed batch


def _not_served(*args, **kwargs):
    raise AssertionError("the call left the C table (a miss): the benchmark would time the wrong path")


def served(fn, kwargs: dict, options: dict):
    """A stand-in server whose exact entry is this call's key, with the C runner and the Python run built."""
    import tests.loader.runtimes.triton.test_fast as tfp
    from tests.loader.bundle.test_triton_key_parity import specializer, theirs

    from nojit.loader.runtimes.triton import fast as triton_fast
    from nojit.loader.runtimes.triton.serving import TritonKernelServer

    key = theirs(fn, kwargs, options)
    variant = tfp.variant_for(key)
    fast = triton_fast.TritonFastPath(fn, specializer, {key: variant})
    server = SimpleNamespace(fn=fn, names=tuple(p.name for p in fn.params), record=SimpleNamespace(id="bench"),
                             options_key=lambda o: TritonKernelServer.options_key(server, o), _options={},
                             _debug=False, _instrumentation_mode="", run=_not_served)
    run = triton_fast.make_run(server, fast)
    table = fast.tables[key[1]]
    triton_fast.fast_module().set_function(table, 0, 0, 1)
    return run, fast, table, variant


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    import torch
    import triton
    import triton.language as tl

    import nojit.loader.launch.torch_cuda as tc
    from nojit.loader.runtimes.triton import fast as triton_fast
    from tests.loader.bundle.test_triton_key_parity import tensor
    from tests.support.triton_test_kernels import every_kind

    from bench_fastpath import call_site  # after the tests' imports: it puts tests/gpu first on sys.path

    tc.current_device, tc.current_stream = int, abs  # builtins standing in for torch's raw accessors
    m = triton_fast.fast_module()
    tmp = tempfile.mkdtemp(prefix="nojit-cpu-dispatch-")
    addr, _keep = noop_launch_address(tmp)
    m.configure(m.tensor_type, m.dtypes, addr)
    m.dlpack_launch_device_type(1)  # the no-op driver takes these CPU tensors (kDLCPU)
    dlpack = triton_fast.dlpack_status().startswith("on")

    @triton.jit
    def small(out_ptr, in_ptr, n, BLOCK: tl.constexpr = 128):
        pass

    full = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False), q=tensor(torch.bfloat16, True),
                n=16, n_dns=1, n_noalign=32, n64=7, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
    a, b = tensor(torch.float32, True), tensor(torch.bfloat16, True)
    cases = [
        ("every_kind, 12 keywords", every_kind, (), full, {}, (4, 1, 1)),
        ("every_kind, 12 keywords + num_warps", every_kind, (), full, {"num_warps": 8}, (4, 1, 1)),
        ("every_kind, grid callable", every_kind, (), full, {}, lambda meta: (4,)),
        ("small, 3 positional, default", small, (a, b, 1024), {}, {}, (8,)),
        ("small, 2 positional + 2 keywords", small, (a, b), dict(n=1024, BLOCK=256), {}, (8,)),
    ]
    print(f"== CPU dispatch: host us per kernel[grid](...) call (no-op driver; python {sys.version.split()[0]}, "
          f"torch {torch.__version__}, triton {triton.__version__})")
    print(f"   tensors read through: {triton_fast.dlpack_status()}")
    print(f"{'call':40s} {'site':>7s} {'bound':>7s} {'lambda':>7s} {'c-run':>7s} {'py-run':>7s} {'launch':>7s} {'no-op':>7s} "
          f"{'floor':>7s} {'site-torch':>10s} {'bound-torch':>11s} {'launch-torch':>12s}")
    for name, fn, pos, kw, options, grid in cases:
        sig_kwargs = dict(zip([p.name for p in fn.params], pos)) | kw
        for p in fn.params:  # the key is the call's, defaults included
            d = inspect.signature(fn.fn).parameters[p.name].default
            if p.name not in sig_kwargs and d is not inspect.Parameter.empty:
                sig_kwargs[p.name] = d
        run, fast, table, variant = served(fn, sig_kwargs, options)
        fn.run = run
        launcher = fn[grid]
        assert launcher(*pos, **kw, **options) is variant, name
        c_us = per_call_us(lambda: launcher(*pos, **kw, **options), args.calls)
        lambda_us = per_call_us(lambda: fn[grid](*pos, **kw, **options), args.calls)
        assert triton_fast.serve_getitem(fn), name
        assert fn[grid](*pos, **kw, **options) is variant, name
        assert type(fn[grid]).__name__ == "builtin_function_or_method", name
        bound_us = per_call_us(lambda: fn[grid](*pos, **kw, **options), args.calls)
        site = call_site(fn, grid, {**kw, **options}, pos)
        assert site() is variant, name
        site_us = per_call_us(site, args.calls)
        site_torch_us = bound_torch_us = launch_torch_us = float("nan")
        bound_call = lambda: fn[grid](*pos, **kw, **options)  # noqa: E731
        if dlpack:  # the same calls with tensors read through torch's Python API (the path before)
            m.dlpack_enable(False)
            try:
                assert site() is variant, name
                site_torch_us = per_call_us(site, args.calls)
                bound_torch_us = per_call_us(bound_call, args.calls)
            finally:
                m.dlpack_enable(True)
        triton_fast.restore_getitem(fn)
        fn.run = fast.general
        assert launcher(*pos, **kw, **options) is variant, name
        py_us = per_call_us(lambda: launcher(*pos, **kw, **options), args.calls)
        del fn.run
        bound = tuple(sig_kwargs[p.name] for p in fn.params)
        g = grid if isinstance(grid, tuple) else grid(None)
        launch_us = per_call_us(lambda: m.launch(table, bound, g, 0, 0), args.calls)
        if dlpack:
            m.dlpack_enable(False)
            try:
                launch_torch_us = per_call_us(lambda: m.launch(table, bound, g, 0, 0), args.calls)
            finally:
                m.dlpack_enable(True)
        floor_us = statistics.median(m.floor(table, bound, g, 0, 0, 100000) / 1000 for _ in range(5))
        fn.run = lambda *a, **k: variant
        none_us = per_call_us(lambda: launcher(*pos, **kw, **options), args.calls)
        del fn.run
        print(f"{name:40s} {site_us:7.3f} {bound_us:7.3f} {lambda_us:7.3f} {c_us:7.3f} {py_us:7.3f} {launch_us:7.3f} "
              f"{none_us:7.3f} {floor_us:7.3f} {site_torch_us:10.3f} {bound_torch_us:11.3f} {launch_torch_us:12.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
