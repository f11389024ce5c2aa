"""Host cost of one launch, side by side in one process: nojit loader vs Triton's JIT path vs the bare C launcher.

    python bench/bench_dispatch.py --bundle B.nojit [--sources MAP.json] [--kernel SUBSTRING]

Same kernel, same key, same arguments, same stream. Each path is warmed up, then timed as
the median over batches of back-to-back calls (host time per call; the kernels are tiny, so
this is launch overhead, not GPU time). Also reports what it costs to get ready: opening the
bundle and installing, the first launch (module load), and Triton's own cold compile of the
same key for contrast. Prints ratios; numbers go to bench/RESULTS.md by hand with the date,
machine and command.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu", "checks"))


def per_call_us(fn, calls: int = 2000, batches: int = 15, warmup: int = 200) -> float:
    """Median host microseconds per call of `fn` over `batches` batches of `calls` calls, after `warmup` calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter_ns() - t0) / calls / 1000)
        torch.cuda.synchronize()
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--sources")
    ap.add_argument("--kernel", default="ComputePrefillMetadataKernel")
    args = ap.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="nojit-bench-triton-"))

    import torch
    import triton

    from nojit.aot.runtimes.triton.sources import load_source_map, resolve_kernel
    from nojit.loader.resolve import jit_function_of
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.bundle.triton_key import key_from_json
    from triton_harness import grid_for, synthesize

    smap = load_source_map(args.sources) if args.sources else None
    bundle = Bundle.open(args.bundle)
    kid = next(k for k in bundle.kernel_ids() if args.kernel in k)
    entry = next(e for e in bundle.entries(kid) if e.variant == "exact")
    key = key_from_json(entry.key)
    fn = jit_function_of(resolve_kernel(kid, smap))
    kwargs, _buffers, _ = synthesize(fn, key, 7)
    GRID = grid_for(fn)
    torch.cuda.synchronize()

    # Triton JIT: cold compile of this key, then warm launches through kernel[grid].
    t0 = time.perf_counter()
    fn[GRID](**kwargs)
    torch.cuda.synchronize()
    triton_cold_ms = (time.perf_counter() - t0) * 1e3
    triton_us = per_call_us(lambda: fn[GRID](**kwargs))

    # nojit: install (open + checks + per-kernel setup), first launch (module load), warm launches.
    from nojit.loader.install import install

    t0 = time.perf_counter()
    inst = install(args.bundle, mode="strict", resolver=lambda k: resolve_kernel(k, smap),
                   allow_mismatch=frozenset({"vllm"}), kernels={kid})
    install_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    fn[GRID](**kwargs)
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    nojit_us = per_call_us(lambda: fn[GRID](**kwargs))

    # The C launcher alone, arguments already packed: the floor nojit's Python layer adds to.
    server = inst.servers("triton")[kid]
    variant = server.exact[key]
    bound, _spec, _opts = server._binder(**{**kwargs, "debug": False, "instrumentation_mode": ""})
    from nojit.loader.launch.cuda_launch import launcher
    from nojit.loader.launch.torch_cuda import current_device, current_stream

    dev = current_device()
    function = variant.load(dev)
    values = variant._pack(bound)
    lch = launcher()
    stream = current_stream(dev)
    launch = variant.launch
    c_us = per_call_us(lambda: lch.launch(function, (GRID[0], GRID[1], GRID[2]), (32 * launch.num_warps, 1, 1),
                                          launch.shared, stream, variant._types, values, (1, 1, 1), launch.launch_pdl,
                                          False))
    key_us = per_call_us(lambda: server._binder(**kwargs), calls=5000)

    print(f"kernel {kid} ({len(fn.params)} params), grid {GRID}, triton {triton.__version__}, torch {torch.__version__}")
    print(f"{'path':44s} {'us/call':>9s} {'vs nojit':>9s}")
    for name, us in [("Triton JIT kernel[grid](...) (warm cache)", triton_us), ("nojit loader kernel[grid](...)", nojit_us),
                     ("nojit C launch only (args pre-packed)", c_us), ("nojit key computation only", key_us)]:
        print(f"{name:44s} {us:9.2f} {us / nojit_us:9.2f}x")
    print(f"speed-up of nojit over Triton's launch path: {triton_us / nojit_us:.2f}x")
    print(f"ready to launch: Triton cold compile {triton_cold_ms:.0f} ms vs nojit install {install_ms:.1f} ms + first launch "
          f"{first_ms:.2f} ms ({triton_cold_ms / (install_ms + first_ms):.0f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
