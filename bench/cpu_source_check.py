"""Triton's cache_key vs nojit's recorded-parts check at first launch, CPU thread time, fresh processes (issue 15).

    python bench/cpu_source_check.py [--plan .device/default.plan.json] [--kernels N]

One child records every Triton kernel's source parts (as the build does); then fresh children each time
one way of checking every kernel once: Triton's `cache_key` (the check before), and
`loader.source_parts.unchanged_since_build` (the check now; it must prove every kernel, calling cache_key
for none).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _kernels(plan_path: str, limit: int) -> list:
    from nojit.aot.runtimes.triton.sources import resolve_kernel
    from nojit.aot.vllm_env import PlatformFacts, install_deployment_platform
    from nojit.loader.resolve import jit_function_of

    install_deployment_platform(PlatformFacts())
    with open(plan_path) as f:
        kids = sorted(k for k, v in json.load(f)["kernels"].items() if v["runtime"] == "triton")
    kids = kids[:limit] if limit else kids
    return [(kid, jit_function_of(resolve_kernel(kid, None))) for kid in kids]


def child(mode: str, plan: str, limit: int, parts_path: str) -> None:
    kernels = _kernels(plan, limit)
    if mode == "record":
        from nojit.aot.runtimes.triton.source_parts import source_parts

        with open(parts_path, "w") as f:
            json.dump({kid: source_parts(fn) for kid, fn in kernels}, f)
        return
    with open(parts_path) as f:
        parts = json.load(f)
    from triton.runtime.jit import JITFunction

    calls = [0]
    real = JITFunction.cache_key.fget

    def counted(self):
        calls[0] += 1
        return real(self)

    JITFunction.cache_key = property(counted)
    t = time.thread_time()
    proven = 0
    if mode == "cache_key":
        for kid, fn in kernels:
            proven += fn.cache_key == parts[kid]["key"]
    else:
        from nojit.loader.runtimes.triton.source_parts import unchanged_since_build

        for kid, fn in kernels:
            proven += unchanged_since_build(fn, parts[kid], parts[kid]["key"])
    ms = (time.thread_time() - t) * 1e3
    print(json.dumps({"mode": mode, "kernels": len(kernels), "ms": ms, "matched": proven, "cache_key_calls": calls[0]}))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", default=".device/default.plan.json")
    ap.add_argument("--kernels", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--parts", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.plan, args.kernels, args.parts)
        return 0
    parts = os.path.join(tempfile.mkdtemp(prefix="nojit-parts-"), "parts.json")
    base = [sys.executable, __file__, "--plan", args.plan, "--kernels", str(args.kernels), "--parts", parts]
    subprocess.run(base + ["--child", "record"], check=True, stderr=subprocess.DEVNULL)
    print(f"record size: {os.path.getsize(parts)} bytes of JSON")
    for mode in ("cache_key", "parts") * args.repeat:
        out = subprocess.run(base + ["--child", mode], check=True, capture_output=True, text=True).stdout
        print(out.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
