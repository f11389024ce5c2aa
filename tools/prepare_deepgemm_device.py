"""Prepare .device/deepgemm/ for tests/gpu/check_deepgemm.py on a machine without vLLM or nvcc.

Builds DeepGEMM entries here (DeepGEMM's own enumeration and generated source, nvcc on this box)
for the given shapes at the given M, and copies what the device needs into the ignored folder:
    .device/deepgemm/section.json   the bundle section (loader/deepgemm_cache.py documents it)
    .device/deepgemm/cubins/<sha256>.cubin
    .device/deepgemm/deep_gemm/     vLLM's vendored DeepGEMM package (its extension), without the
                                    headers only a compile needs
    .device/deepgemm/lib/           libcudart.so.13, which the extension links against
Usage: python tools/prepare_deepgemm_device.py [--shapes attention.wq_b,attention.wo_b] [--ms 1,31,...] [-j N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="attention.wq_b,attention.wo_b")
    ap.add_argument("--ms", default="1,31,32,64,513,4096,8192")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--out", default=".device/deepgemm")
    ap.add_argument("--work", default="/tmp/nojit-deepgemm-prepare")
    args = ap.parse_args()

    import vllm.third_party.deep_gemm as dg

    from nojit.aot.deployment import load_deployment
    from nojit.aot.runtimes.deepgemm.build import build_deepgemm_section
    from nojit.aot.runtimes.deepgemm.enumerate import enumerate_keys

    d = load_deployment()
    ms = [int(x) for x in args.ms.split(",")]
    wanted = set(args.shapes.split(","))
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    probe = enumerate_keys(d, os.path.join(args.work, "probe"), ms=ms)
    only = {k["entry"] for k in probe.keys if k["name"] in wanted}
    start = time.monotonic()
    section, cubins, stats = build_deepgemm_section(d, os.path.join(args.work, "build"), jobs=args.j, only=only, ms=ms)
    print(f"compiled {len(section['entries'])} entries in {time.monotonic() - start:.0f} s: {stats}", file=sys.stderr)
    section["check_shapes"] = sorted(wanted)
    section["check_ms"] = ms
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(os.path.join(args.out, "cubins"))
    for sha, raw in cubins.items():
        with open(os.path.join(args.out, "cubins", sha + ".cubin"), "wb") as f:
            f.write(raw)
    with open(os.path.join(args.out, "section.json"), "w") as f:
        json.dump(section, f, indent=1, sort_keys=True)
    pkg = os.path.dirname(dg.__file__)
    shutil.copytree(pkg, os.path.join(args.out, "deep_gemm"),
                    ignore=shutil.ignore_patterns("include", "__pycache__"))
    os.makedirs(os.path.join(args.out, "lib"))
    import nvidia.cu13  # the CUDA 13 runtime wheel vLLM's torch uses

    cudart = os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libcudart.so.13")
    shutil.copy(os.path.realpath(cudart), os.path.join(args.out, "lib", "libcudart.so.13"))
    print(json.dumps({"entries": len(section["entries"]), "stats": stats, "out": args.out}))


if __name__ == "__main__":
    main()
