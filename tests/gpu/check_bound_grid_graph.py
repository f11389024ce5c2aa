"""GPU: `kernel[grid](...)` through nojit's C bound grid is CUDA-graph safe (issue 15).

    python tests/gpu/check_bound_grid_graph.py --bundle B.nojit [--sources MAP.json] [--kernels 6]

For the first exact key of each bundled kernel (arguments from triton_harness.synthesize): the same
buffers launched eagerly and, from the same starting bytes, captured in a torch.cuda.CUDAGraph (on
torch's capture stream, which the bound grid must read at call time) and replayed; every buffer must
come out byte for byte the same, the call must be the C bound grid's (an exact entry, no Python path),
and the launches must have written something (outputs are poisoned by synthesize). Prints RESULT: PASS.
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
    from nojit.loader.bundle_file import Bundle
    from nojit.loader.install import install
    from nojit.loader.triton_key import key_from_json
    from triton_harness import grid_for, synthesize

    smap = load_source_map(args.sources) if args.sources else None
    bundle = Bundle.open(args.bundle)
    kids = [k for k in bundle.kernel_ids() if bundle.index.kernels[k].runtime == "triton"][: args.kernels]
    resolver = (lambda k: resolve_kernel(k, smap)) if smap else None  # no map: the installed vLLM's modules
    inst = install(args.bundle, mode="strict", resolver=resolver, allow_mismatch=frozenset({"vllm"}),
                   kernels=set(kids))
    failures, checked, wrote = [], 0, 0
    for kid in kids:
        server = inst.triton[kid]
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
        reset()
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        diff = [i for i, (a, b) in enumerate(zip(eager, bufs)) if not torch.equal(a.view(torch.uint8),
                                                                                   b.view(torch.uint8))]
        if diff:
            failures.append(f"{kid}: graph replay differs from the eager launch in buffers {diff}")
        checked += 1
        print(f"  {kid}: eager == graph replay ({len(bufs)} buffers)")
    inst.uninstall()
    if checked < 2 or not wrote:
        failures.append(f"too little checked: {checked} kernels, {wrote} wrote anything")
    for f in failures:
        print("FAIL", f)
    print("RESULT:", "FAIL" if failures else "PASS", f"({checked} kernels)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
