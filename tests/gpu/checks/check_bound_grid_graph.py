"""GPU: `kernel[grid](...)` through nojit's C bound grid is CUDA-graph safe (issue 15).

    python tests/gpu/checks/check_bound_grid_graph.py --bundle B.nojit [--sources MAP.json] [--kernels 6]

For the first exact key of each bundled kernel (arguments from triton_harness.synthesize): the same
buffers launched eagerly and, from the same starting bytes, captured in a torch.cuda.CUDAGraph (on
torch's capture stream, which the bound grid must read at call time) and replayed; every buffer must
come out byte for byte the same, the call must be the C bound grid's (an exact entry, no Python path),
and the launches must have written something (outputs are poisoned by synthesize). Prints RESULT: PASS.

The runner reads torch's current stream through the DLPack C exchange API (csrc/nojit_dlpack.h) where torch
has one: checked here to be the stream torch.cuda.current_stream() names, eagerly, under a side stream and
inside torch.cuda.graph capture (the capture stream), and the runners must be reading it that way. Every
replayed result is also compared with Triton's own JIT on the same starting bytes (an independent source;
a kernel whose two JIT runs differ from each other is reported as racy and not compared).
"""

from __future__ import annotations

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--sources", default=None)
    ap.add_argument("--kernels", type=int, default=6)
    args = ap.parse_args()
    import torch

    from nojit.aot.runtimes.triton.sources import load_source_map, resolve_kernel
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.install import install
    from nojit.loader.bundle.triton_key import key_from_json
    from triton_harness import grid_for, synthesize

    smap = load_source_map(args.sources) if args.sources else None
    bundle = Bundle.open(args.bundle)
    kids = [k for k in bundle.kernel_ids() if bundle.index.kernels[k].runtime == "triton"][: args.kernels]
    resolver = (lambda k: resolve_kernel(k, smap)) if smap else None  # no map: the installed vLLM's modules
    # permissive, not strict: Triton's JIT runs after uninstall for the reference (strict's compiler firewall stays
    # for the process); every timed call must still be its exact entry's (checked per call below)
    inst = install(args.bundle, mode="permissive", resolver=resolver, allow_mismatch=frozenset({"vllm"}),
                   kernels=set(kids))
    failures, checked, wrote = [], 0, 0
    from nojit.loader.runtimes.triton import fast as triton_fast

    m = triton_fast.fast_module()
    status = triton_fast.dlpack_status()
    print(f"  tensors and stream read through: {status}")
    dl_stream = status.startswith("on")
    if dl_stream:  # what the runners launch on is torch's current stream: eager, side stream, capture stream
        dev = torch.cuda.current_device()
        seen = {"eager": (m.dlpack_current_stream(dev), torch.cuda.current_stream().cuda_stream)}
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            seen["side stream"] = (m.dlpack_current_stream(dev), torch.cuda.current_stream().cuda_stream)
        g0 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g0):
            seen["capture"] = (m.dlpack_current_stream(dev), torch.cuda.current_stream().cuda_stream)
        for where, (api, torch_s) in seen.items():
            print(f"  current stream {where}: DLPack {api:#x}, torch {torch_s:#x}")
            if api != torch_s:
                failures.append(f"DLPack current_work_stream {where} is {api:#x}, torch's current stream {torch_s:#x}")
        if seen["capture"][0] == seen["eager"][0]:
            failures.append("the capture stream is the eager stream: the capture check would prove nothing")
    else:
        print("  (the DLPack read is off: the runners read the stream through torch's accessor)")
    jit_inputs = []  # (kid, fn, grid, kwargs, bufs, initial, replayed) for the JIT comparison after uninstall
    for kid in kids:
        server = inst.servers("triton")[kid]
        server.prepare()
        fn = server.fn
        keys = [key_from_json(e.key) if e.decoded is None else e.decoded for e in bundle.entries(kid)
                if e.variant == "exact"]
        if not keys:
            continue
        key = keys[0]
        try:
            kwargs, bufs, _outputs = synthesize(fn, key, 11)
        except Exception as exc:  # a key the harness cannot make arguments for
            print(f"  skip {kid}: {exc}")
            continue
        grid = grid_for(fn)
        fast = getattr(server, "fast", None)
        if dl_stream and fast is not None and fast.runner is not None and \
                not m.runner_reads_stream_through_dlpack(fast.runner):
            failures.append(f"{kid}: the runner does not read the stream through DLPack")
        if type(fn[grid]).__name__ != "builtin_function_or_method":
            failures.append(f"{kid}: kernel[grid] is not the C bound grid ({type(fn[grid]).__name__})")
            continue
        initial = [b.clone() for b in bufs]

        def reset() -> None:
            for b, i in zip(bufs, initial):
                b.copy_(i)

        variant = server.exact[key]
        reset()
        torch.cuda.synchronize()
        if fn[grid](**kwargs) is not variant:
            failures.append(f"{kid}: the eager call was not served by its exact entry")
            continue
        torch.cuda.synchronize()
        eager = [b.clone() for b in bufs]
        wrote += any(not torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(eager, initial))
        reset()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            r = fn[grid](**kwargs)
        if r is not variant:
            failures.append(f"{kid}: the captured call was not served by its exact entry")
            continue
        torch.cuda.synchronize()
        # captured, not run: a launch on any stream but the capture stream would have written the buffers now
        if any(not torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(bufs, initial)):
            failures.append(f"{kid}: capture ran the kernel (launched off the capture stream)")
        reset()
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        diff = [i for i, (a, b) in enumerate(zip(eager, bufs)) if not torch.equal(a.view(torch.uint8),
                                                                                   b.view(torch.uint8))]
        if diff:
            failures.append(f"{kid}: graph replay differs from the eager launch in buffers {diff}")
        replayed = [b.clone() for b in bufs]
        jit_inputs.append((kid, fn, grid, kwargs, bufs, initial, replayed))
        checked += 1
        print(f"  {kid}: eager == graph replay ({len(bufs)} buffers)")
    inst.uninstall()
    jit_same = 0
    for kid, fn, grid, kwargs, bufs, initial, replayed in jit_inputs:  # Triton's own JIT, nojit uninstalled
        runs = []
        try:
            for _ in range(2):
                for b, i in zip(bufs, initial):
                    b.copy_(i)
                torch.cuda.synchronize()
                fn[grid](**kwargs)
                torch.cuda.synchronize()
                runs.append([b.clone() for b in bufs])
        except Exception as exc:  # noqa: BLE001 - the JIT could not run this kernel here: said, not compared
            print(f"  {kid}: Triton's JIT failed ({type(exc).__name__}: {str(exc)[:200]}): not compared")
            continue
        differing = lambda xs, ys: [i for i, (a, b) in enumerate(zip(xs, ys))  # noqa: E731
                                    if not torch.equal(a.view(torch.uint8), b.view(torch.uint8))]
        if differing(runs[0], runs[1]):
            print(f"  {kid}: the JIT's two runs differ (racy): not compared")
            continue
        diff = differing(runs[0], replayed)
        if diff:
            failures.append(f"{kid}: graph replay differs from Triton's JIT in buffers {diff}")
        else:
            jit_same += 1
            print(f"  {kid}: graph replay == Triton's JIT")
    if jit_inputs and not jit_same:
        failures.append("no kernel compared with Triton's JIT")
    if checked < 2 or not wrote:
        failures.append(f"too little checked: {checked} kernels, {wrote} wrote anything")
    for f in failures:
        print("FAIL", f)
    print("RESULT:", "FAIL" if failures else "PASS", f"({checked} kernels)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
