"""Prepare .device/deepgemm/ for tests/gpu/checks/check_deepgemm.py on a machine without vLLM or nvcc.

Builds DeepGEMM entries here (DeepGEMM's own enumeration and generated source, nvcc on this box)
for the given shapes at the given M, and copies what the device needs into the ignored folder:
    .device/deepgemm/section.json   the bundle section (loader/runtimes/deepgemm/cache.py documents it)
    .device/deepgemm/cubins/<sha256>.cubin
    .device/deepgemm/deep_gemm/     vLLM's vendored DeepGEMM package (its extension) with include/deep_gemm/
                                    (DeepGEMM hashes those headers into every cache key and reads them on
                                    each lookup, a hit included), without include/cute and include/cutlass
                                    (27 MiB that only a compile reads)
    .device/deepgemm/lib/           libcudart.so.13, which the extension links against
Usage: python tools/prepare_deepgemm_device.py [--shapes attention.wq_b,attention.wo_a,mhc.pre,...] [--ms 1,31,...] [-j N]
       python tools/prepare_deepgemm_device.py --deployment aot/data/qwen3.5-35b-a3b-fp8-h200.toml [--every-entry] \
           --shapes linear_attn.in_proj_qkvz,linear_attn.out_proj,self_attn.qkv_proj,self_attn.o_proj,mlp --ms 32,...
                                                (another deployment: its model's DeepGEMM rows, as `nojit build` plans
                                                them; Qwen3.5's 97 entries, --every-entry: about 5 min at -j1 here)
       python tools/prepare_deepgemm_device.py --every-entry   (every entry of the default deployment checked once)
       python tools/prepare_deepgemm_device.py --every-entry --shapes indexer.prefill,indexer.decode,indexer.schedule
                                                (every entry of those shapes; M over the whole enumerated range)
       python tools/prepare_deepgemm_device.py --package-only   (recopy deep_gemm/ and lib/, keep the entries)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nojit.aot.deployment import Deployment
    from nojit.aot.runtimes.deepgemm.shapes import GemmShape


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deployment", help="deployment TOML as `nojit build --deployment` takes it (path or builtin:<name>; "
                    "default: the built-in DeepSeek-V4-Flash H200 deployment)")
    ap.add_argument("--shapes", default="attention.wq_b,attention.wo_b,attention.wo_a,mhc.pre,mhc.pre_delayed,"
                    "mhc.pre_broadcast,indexer.prefill,indexer.decode,indexer.schedule",
                    help="shape names to compile and check: a name's first words (shapes.py, the model's linears.py); "
                    "`mlp` takes every shape named `mlp ...`, `mlp down_proj` one")
    ap.add_argument("--ms", default="1,31,32,64,513,4096,8192")
    ap.add_argument("-j", type=int, default=2)
    ap.add_argument("--out", default=".device/deepgemm")
    ap.add_argument("--work", default="/tmp/nojit-deepgemm-prepare")
    ap.add_argument("--cache-dir", default=None,
                    help="the compile cache `nojit build` uses (default: its default; entries compiled before are taken from it)")
    ap.add_argument("--package-only", action="store_true", help="recopy deep_gemm/ and lib/ only")
    ap.add_argument("--every-entry", action="store_true",
                    help="every entry of the chosen shapes (all shapes unless --shapes is given; M = "
                    "1..max_num_batched_tokens enumerated): the check runs --ms plus the first M of each run of M that maps to one entry")
    args = ap.parse_args()
    if args.package_only:
        copy_package(args.out)
        return

    from nojit.aot.deployment import DEFAULT_DEPLOYMENT, load_deployment
    from nojit.aot.compile_cache import DEFAULT_CACHE_DIR
    from nojit.aot.runtimes.deepgemm.build import build_deepgemm_section
    from nojit.aot.runtimes.deepgemm.shapes import op_row

    d = load_deployment(args.deployment or DEFAULT_DEPLOYMENT)
    ms = [int(x) for x in args.ms.split(",")]
    every_shape = args.every_entry and "--shapes" not in sys.argv
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    enum_ms = list(range(1, d.max_num_batched_tokens + 1)) if args.every_entry else ms
    shapes, chosen, only = choose(d, None if every_shape else args.shapes.split(","), enum_ms, args.work)
    start = time.monotonic()
    section, cubins, stats = build_deepgemm_section(d, os.path.join(args.work, "build"), jobs=args.j, only=only,
                                                     ms=enum_ms, cache_dir=args.cache_dir or DEFAULT_CACHE_DIR, shapes=shapes)
    print(f"compiled {len(section['entries'])} entries in {time.monotonic() - start:.0f} s: {stats}", file=sys.stderr)

    def check_ms(op: str, name: str) -> list[int]:
        runs = {r[4] for r in section["keys"] if r[0] == op and r[1] == name} if args.every_entry else set()
        return sorted(set(ms) | runs)

    section["check_rows"] = [op_row(op, s, check_ms(op, s.name), d.platform.sm_count)
                             for op, rows in shapes.items() for s in rows if s.name in chosen]
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(os.path.join(args.out, "cubins"))
    for sha, raw in cubins.items():
        with open(os.path.join(args.out, "cubins", sha + ".cubin"), "wb") as f:
            f.write(raw)
    with open(os.path.join(args.out, "section.json"), "w") as f:
        json.dump(section, f, indent=1, sort_keys=True)
    copy_package(args.out)
    print(json.dumps({"entries": len(section["entries"]), "stats": stats, "out": args.out}))


def choose(d: Deployment, wanted: list[str] | None, ms: list[int],
           work: str) -> tuple[dict[str, list[GemmShape]], set[str], set[str] | None]:
    """The deployment's DeepGEMM rows (its model's, as `nojit build` plans them), the shape names `wanted` takes
    (None: all), and the entries those shapes reach at `ms` (None: all), from a probe enumeration under `work`."""
    from nojit.aot.models import model_for
    from nojit.aot.runtimes.deepgemm.enumerate import enumerate_keys

    tables = model_for(d.hf_config, d.hf_config_source).tables.get("deepgemm")
    if tables is None:
        sys.exit(f"{d.name}: its model has no DeepGEMM rows")
    shapes = tables.shapes(d)
    names = [s.name for rows in shapes.values() for s in rows]
    if wanted is None:
        return shapes, set(names), None
    chosen = select_shapes(names, wanted)
    probe = enumerate_keys(d, os.path.join(work, "probe"), ms=ms, shapes=shapes)
    return shapes, chosen, {k["entry"] for k in probe.keys if k["name"] in chosen}


def select_shapes(names: list[str], wanted: list[str]) -> set[str]:
    """The shape names that start with one of `wanted`'s words ("mlp" takes "mlp gate_up_proj ..." and
    "mlp down_proj ..."); a wanted name that takes none stops the run, naming the deployment's shapes."""
    chosen = {n for n in names for w in wanted if n == w or n.startswith(w + " ")}
    unknown = [w for w in wanted if not any(n == w or n.startswith(w + " ") for n in names)]
    if unknown:
        sys.exit(f"--shapes {','.join(unknown)}: no such DeepGEMM shape in this deployment; its shapes:\n  "
                 + "\n  ".join(names))
    return chosen


def copy_package(out: str) -> None:
    """DeepGEMM's package with the headers its key hashes (include/deep_gemm), and its libcudart."""
    import vllm.third_party.deep_gemm as dg

    pkg = os.path.dirname(dg.__file__)
    include = os.path.join(pkg, "include")

    def ignore(folder: str, names: list[str]) -> set[str]:
        skip = {"__pycache__"}
        if os.path.realpath(folder) == os.path.realpath(include):
            skip |= {"cute", "cutlass"}  # only a compile reads these; the key hashes deep_gemm/ only
        return skip & set(names)

    for name in ("deep_gemm", "lib"):
        shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    shutil.copytree(pkg, os.path.join(out, "deep_gemm"), ignore=ignore)
    os.makedirs(os.path.join(out, "lib"))
    import nvidia.cu13  # the CUDA 13 runtime wheel vLLM's torch uses

    cudart = os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libcudart.so.13")
    shutil.copy(os.path.realpath(cudart), os.path.join(out, "lib", "libcudart.so.13"))


if __name__ == "__main__":
    main()
