"""TileLang mHC dispatch: host us per call for nojit's C path, its Python path and the C floor (issue 15).

    python bench/bench_tilelang_dispatch.py --bundle TILELANG.nojit [--tokens 64] [--json OUT.json]

Also a section of bench/bench_fastpath.py (--tilelang-bundle). Per kernel of the bundle (its first
entry), on tensors of the plan's shapes and dtypes:
  server     the whole call as vLLM makes it: binding, the key lookup, the variant (C path)
  server-Py  the same call with the variant on its Python path (NOJIT_FAST_PATH=0: the call before the C path)
  C path     the variant's one C call (checks, shapes, geometry, packing, cuLaunchKernelEx)
  Python     the variant's Python path (NOJIT_FAST_PATH=0 equivalent)
  floor      cuLaunchKernelEx of the same launch in a C loop, parameters packed once
  TileLang   TileLang 0.1.12's own JITImpl.__call__ up to its executable (which then does its host checks and the
             driver call), measured on the 2-core build box with the executable replaced by a no-op: recorded
             in shared/tilelang-internals.md section 4, not measured in this run.
Without a GPU (the CPU box) it runs on a stand-in libcuda.so.1 (tests/csrc/fake_libcuda.c, no log file: a
no-op launch) when LD_LIBRARY_PATH points at one, so the numbers are the host cost without the driver's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

# TileLang 0.1.12 JITImpl.__call__, us, build box, executable replaced by a no-op (shared/tilelang-internals.md s4,
# re-measured without background load); keyed by kernel name.
TILELANG_RECORDED_US = {"mhc_post_tilelang": 21.0, "mhc_pre_big_fuse_with_norm_tilelang": 52.0}


def per_call_us(fn, calls: int = 1000, batches: int = 9, warmup: int = 200) -> float:
    """Median host us per call over batches (synchronized between batches where there is a GPU)."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for _ in range(warmup):
        fn()
    sync()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        sync()
    return statistics.median(samples)


class _Policy:
    recording = False


def _server_for(entry: Any, variant: Any) -> Any:
    """A TileLangKernelServer over a function with the kernel's parameters (tensors in plan order, then the key's
    scalars with the key's values as defaults): the binding and lookup vLLM's call pays, without vLLM."""
    from nojit.loader.bundle.tilelang_key import key_from_json, make_binder
    from nojit.loader.runtimes.tilelang.serving import TileLangKernelServer

    names = [t["name"] for t in sorted(entry.launch.tensor_params, key=lambda t: t["position"])]
    scalars = [item[0] for item in entry.key["args"]]
    values = key_from_json(entry.key)
    namespace: dict[str, Any] = {f"_d{i}": v for i, v in enumerate(values)}
    params = ", ".join(names + [f"{s}=_d{i}" for i, s in enumerate(scalars)])
    exec(compile(f"def kernel({params}):\n    pass\n", "<bench kernel>", "exec"), namespace)
    fn = namespace["kernel"]
    server = TileLangKernelServer(fn, None, None, _Policy(), frozenset())  # type: ignore[arg-type]
    server._bind, server.tensor_names, server.scalar_names = make_binder(fn, set(names))
    server._variants = {values: variant}
    server._ready = True
    return server


def tilelang_dispatch(bundle_path: str, tokens: int = 1, split_k: int = 2, device: str = "cuda") -> list[dict]:
    import torch

    import nojit.loader.runtimes.tilelang.serving as ts
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.bundle.manifest import TileLangLaunch
    from nojit.loader.launch.fast_module import ensure_launch_entry, fast_module

    gpu = device == "cuda" and torch.cuda.is_available()
    if not gpu:  # the stand-in driver: device 0, a fixed stream
        ts.current_device = lambda: 0
        ts.current_stream = lambda d: 7
        device = "cpu"
    bundle = Bundle.open(bundle_path)
    rows = []
    seen = set()
    for entry in bundle.manifest.entries:
        kernel = entry.kernel.rpartition(":")[2]
        if not isinstance(entry.launch, TileLangLaunch) or kernel in seen:
            continue
        seen.add(kernel)
        launch = entry.launch
        order = tuple(t["name"] for t in sorted(launch.tensor_params, key=lambda t: t["position"]))
        variant = ts.TileLangVariant(entry, bundle, order)
        if variant._plan is None:
            rows.append({"kernel": kernel, "skipped": "no C plan (NOJIT_FAST_PATH=0 or outside C's limits)"})
            continue
        by_name = {}
        for t in launch.tensor_params:
            shape = [d if isinstance(d, int) else (tokens if d["var"] == "num_tokens" else split_k) for d in t["shape"]]
            by_name[t["name"]] = torch.zeros(shape, dtype=getattr(torch, t["dtype"]), device=device)
        tensors = tuple(by_name[n] for n in order)
        dev = ts.current_device()
        stream = ts.current_stream(dev)
        if not gpu:
            os.environ["FAKE_CUDA_PARAM_SIZES"] = ",".join("8" if p["kind"] == "tensor" else "4" for p in launch.params)
            variant._bundle = _FakeBlobs(launch.symbol, launch.params)
        ensure_launch_entry()
        fast_module().tl_set_function(variant._plan, dev, variant.load(dev))
        server = _server_for(entry, variant)
        server(*tensors)  # warm: a served call through the C path
        if gpu:
            torch.cuda.synchronize()
        c_us = per_call_us(lambda: variant(tensors))
        py_us = per_call_us(lambda: variant._launch_python(tensors))
        server_us = per_call_us(lambda: server(*tensors))
        plan, variant._plan = variant._plan, None  # the server call on the Python path (NOJIT_FAST_PATH=0)
        server_py_us = per_call_us(lambda: server(*tensors))
        variant._plan = plan
        floors = []
        for _ in range(5):
            floors.append(fast_module().tl_floor(variant._plan, tensors, dev, stream, 1000) / 1000)
            if gpu:
                torch.cuda.synchronize()
        floor_us = statistics.median(floors)
        rows.append({"kernel": kernel, "tokens": tokens, "server_us": server_us, "server_python_us": server_py_us, "c_us": c_us, "python_us": py_us,
                     "floor_us": floor_us, "tilelang_recorded_us": TILELANG_RECORDED_US.get(kernel)})
    return rows


class _FakeBlobs:
    """The stand-in driver's "cubin" for the CPU box (tests/csrc/fake_libcuda.c)."""

    path = "<stand-in>"

    def __init__(self, symbol: str, params: Any) -> None:
        self.image = f"FAKE {symbol} {','.join('8' if p['kind'] == 'tensor' else '4' for p in params)}".encode()

    def read_blob(self, blob: str) -> bytes:
        return self.image


def print_table(rows: list[dict]) -> None:
    print("\n== TileLang mHC dispatch, host us per call (tokens as given; TileLang's own: recorded, see header)")
    print(f"{'kernel':44s} {'server':>7s} {'server-Py':>9s} {'C path':>7s} {'Python':>7s} {'floor':>6s} {'TileLang':>8s} "
          f"{'C/floor':>7s} {'server/floor':>12s} {'Python/C':>8s} {'server/TileLang':>15s}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['kernel']:44s} skipped: {r['skipped']}")
            continue
        tl = r["tilelang_recorded_us"]
        print(f"{r['kernel']:44s} {r['server_us']:7.2f} {r['server_python_us']:9.2f} {r['c_us']:7.2f} {r['python_us']:7.2f} {r['floor_us']:6.2f} "
              f"{(f'{tl:.1f}' if tl else '-'):>8s} {r['c_us'] / r['floor_us']:7.2f} "
              f"{r['server_us'] / r['floor_us']:12.2f} {r['python_us'] / r['c_us']:8.2f} "
              f"{(format(r['server_us'] / tl, '.3f') if tl else '-'):>15s}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--tokens", type=int, default=1, help="num_tokens (1: the shortest kernels, so the host is timed)")
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = tilelang_dispatch(args.bundle, args.tokens)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
