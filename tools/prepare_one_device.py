"""Assemble the one folder the `one` step carries (tests/gpu/checks/check_one_process.py): ignored, never committed.

    python tools/prepare_one_device.py --bundle B.nojit --plan P.json [--out /work/main/.device-one] [--jit-headers]

The device call sends the coordinator's checkout plus carried ignored folders (64 MiB in all), so everything the step
needs goes into OUT/repo, a copy of this worktree's files (tracked and untracked-not-ignored) with, beside them:
  .device-one/rest.nojit       the bundle without its Triton entries (the device's Triton differs: those are built
                               there from the plan and merged back, `nojit build --from-plan ... --merge`)
  .device-one/preflight.plan.json  the plan less the Triton kernels that were not extracted (what the device can hold)
  .device/ .whl/               tools/prepare_device.py's output (vLLM's Triton kernels, call-site and mHC files,
                               the nojit wheel); .device/vllm_src also gets the CuTeDSL references' vLLM files
  .device-fi/ .device-cu/ .device-hg/  the FlashInfer, CuTeDSL and Humming preparations (their prepare_*_device.py),
                               without their own bundle copies: the one bundle serves all of them
  .device-dg/section/          only for a bundle without DeepGEMM: prepare_deepgemm_device.py's section and cubins
  .device-dg/                  vLLM's vendored DeepGEMM as deep_gemm.tar.xz (its extension and include/deep_gemm;
                               with --jit-headers also cute/ and cutlass/, which only DeepGEMM's JIT reads: the JIT
                               side of the table), libcudart.so.13, rows.json (the ops and shapes checked, at the
                               composed step's decode batch and prefill chunk)
Prints the size of each part and refuses a payload over the limit.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu", "checks"))
LIMIT = 63 << 20
STEP_MS = (1, 64, 8192)  # decode batch 1 and 64, prefill chunk max_num_batched_tokens


def tree_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs
               if not os.path.islink(os.path.join(d, f)))


def copy_worktree(repo: str) -> int:
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard"], capture_output=True,
                           text=True, check=True).stdout.split()
    for rel in files:
        src = os.path.join(ROOT, rel)
        if not os.path.isfile(src):
            continue
        dst = os.path.join(repo, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)
    return len(files)


def copy_without_bundles(src: str, dst: str) -> None:
    shutil.copytree(src, dst, ignore=lambda d, names: {n for n in names if n.endswith(".nojit") or n == "__pycache__"})


def preflight_plan(plan_path: str, device_plan_path: str, out: str, subset: dict[str, set[str]] | None = None
                   ) -> dict[str, int]:
    """The plan the device's preflight checks: Triton restricted to the kernels extracted for the device; a runtime
    in `subset` (runtime -> kernel ids of a bundle built with --kernels) restricted to those kernels."""
    with open(plan_path) as f:
        plan = json.load(f)
    with open(device_plan_path) as f:
        extracted = set(json.load(f)["kernels"])
    subset = subset or {}
    keep = {k for k, v in plan["kernels"].items() if (v["runtime"] != "triton" or k in extracted)
            and (v["runtime"] not in subset or k in subset[v["runtime"]])}
    plan["kernels"] = {k: v for k, v in plan["kernels"].items() if k in keep}
    plan["requests"] = [r for r in plan["requests"] if r["kernel"] in keep]
    with open(out, "w") as f:
        json.dump(plan, f, sort_keys=True)
    counts: dict[str, int] = {}
    for r in plan["requests"]:
        rt = plan["kernels"][r["kernel"]]["runtime"]
        counts[rt] = counts.get(rt, 0) + (r["variant"] == "exact")
    return counts


def deepgemm_dir(out: str, jit_headers: bool) -> None:
    import vllm.third_party.deep_gemm as dg

    from nojit.aot.deployment import load_deployment
    from nojit.aot.runtimes.deepgemm.shapes import deepgemm_shapes, op_row

    pkg = os.path.dirname(dg.__file__)
    os.makedirs(os.path.join(out, "lib"), exist_ok=True)

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = info.name.split("/")
        if "__pycache__" in parts:
            return None
        if not jit_headers and len(parts) > 2 and parts[1] == "include" and parts[2] in ("cute", "cutlass"):
            return None
        return info

    with tarfile.open(os.path.join(out, "deep_gemm.tar.xz"), "w:xz", preset=6) as tar:
        tar.add(pkg, arcname="deep_gemm", filter=keep)
    import nvidia.cu13

    cudart = os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libcudart.so.13")
    shutil.copy(os.path.realpath(cudart), os.path.join(out, "lib", "libcudart.so.13"))
    d = load_deployment()
    rows = [op_row(op, s, list(STEP_MS), d.platform.sm_count) for op, shapes in deepgemm_shapes(d).items()
            for s in shapes]
    with open(os.path.join(out, "rows.json"), "w") as f:
        json.dump(rows, f, indent=1)


def merge_bundles(paths: list[str], out: str) -> None:
    """Several bundles of distinct kernels as one (what `nojit build --merge` does after compiling), for the parts
    built separately on this box; the producer's tool facts (TileLang, nvcc, the toolchain record) are joined."""
    import dataclasses

    from nojit.aot.bundle_writer import write_bundle
    from nojit.loader.bundle.file import Bundle

    kernels, entries, cubins, producer = {}, [], {}, None
    for path in paths:
        b = Bundle.open(path)
        m = b.manifest
        for kid, rec in m.kernels.items():
            if kid in kernels:
                raise SystemExit(f"{path}: kernel {kid} is in two of the merged bundles")
            kernels[kid] = rec
        entries += list(m.entries)
        cubins.update({e.blob: b.read_blob(e.blob) for e in m.entries})
        if producer is None:
            producer, target, deployment = m.producer, m.target, m.deployment
        else:
            facts = {f: getattr(producer, f) or getattr(m.producer, f) for f in ("tilelang", "nvcc", "ptxas")}
            chain = {**(m.producer.toolchain or {}), **(producer.toolchain or {})}
            producer = dataclasses.replace(producer, toolchain=chain or None, **facts)
    write_bundle(out, producer, target, deployment, kernels.values(), entries, cubins)


def deepgemm_sources(work: str, out: str) -> int:
    """DeepGEMM's generated kernels of an enumeration (prepare_deepgemm_device.py's work folder: DeepGEMM's own
    kernel.cu and nvcc command per entry, the keys it chose) for the device to compile with nojit's compile code and
    its nvcc (same release as here, 13.0.88): the build step nojit runs on the box, run there instead because the box
    was too loaded to finish it. Returns the entry count."""
    import vllm.envs as envs
    import vllm.third_party.deep_gemm as dg

    from nojit.aot.deployment import load_deployment
    from nojit.aot.runtimes.deepgemm.compile import deep_gemm_dir, portable_flags
    from nojit.aot.runtimes.deepgemm.enumerate import find_nvcc, recorded_flags
    from nojit.loader.runtimes.deepgemm.cache import compress_keys

    build = os.path.join(work, "build")
    with open(os.path.join(build, "keys.jsonl")) as f:
        keys = [json.loads(line) for line in f]
    with open(os.path.join(build, "spec.json")) as f:
        spec = json.load(f)
    package = deep_gemm_dir()
    entries = {}
    for name in sorted({k["entry"] for k in keys if k.get("entry")}):
        d = os.path.join(build, "dg_cache", "cache", name)
        with open(os.path.join(d, "kernel.cu")) as f:
            entries[name] = {"source": f.read(), "flags": portable_flags(recorded_flags(d), package)}
    dep = load_deployment()
    nvcc = find_nvcc()
    facts = {"deep_gemm_version": dg.__version__, "nvcc_version": subprocess.run(
                 [nvcc, "--version"], capture_output=True, text=True, check=True).stdout,
             "sm_count": dep.platform.sm_count, "pdl": dep.platform.pdl, "use_ue8m0": bool(envs.VLLM_USE_DEEP_GEMM_E8M0),
             "keys": compress_keys([{k: v for k, v in key.items() if k in ("op", "name", "n", "k", "m", "entry")}
                                    for key in keys if key.get("entry")]),
             "check_rows": spec["ops"], "sources": entries}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "sources.json"), "w") as f:
        json.dump(facts, f)
    return len(entries)


def one_wheel_each(repo: str) -> list[str]:
    """Keep one wheel per (project, version) over the carried wheel folders: FlashInfer's and CuTeDSL's preparations
    both download apache-tvm-ffi, with different platform tags, and the `one` step installs every wheel it finds into
    one target (two of one project stop pip), besides carrying 2.7 MB twice."""
    seen: set[tuple[str, str]] = set()
    dropped = []
    for folder in (".device-fi", ".device-cu", ".device-hg"):
        wheels = os.path.join(repo, folder, "wheels")
        for name in sorted(os.listdir(wheels)) if os.path.isdir(wheels) else []:
            project, version = name.split("-")[:2]
            if (project.lower(), version) in seen:
                os.remove(os.path.join(wheels, name))
                dropped.append(f"{folder}/wheels/{name}")
            seen.add((project.lower(), version))
    return dropped


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True, action="append", help="the bundle (repeat: parts merged into one)")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", default="/work/main/.device-one")
    ap.add_argument("--jit-headers", action="store_true")
    ap.add_argument("--box-times", help="JSON runtime -> the build box's measured compile time (text, with its source)")
    ap.add_argument("--skip-deepgemm", action="store_true", help="keep OUT/repo/.device-dg as it is")
    ap.add_argument("--deepgemm-work", help="prepare_deepgemm_device.py's work folder: its entries compiled there")
    ap.add_argument("--subset", default="", help="runtimes the bundle holds only some kernels of (built with "
                    "--kernels): the preflight plan keeps only those kernels of them")
    args = ap.parse_args()
    repo = os.path.join(args.out, "repo")
    keep_dg = os.path.join(args.out, "dg-kept")
    if args.skip_deepgemm and os.path.isdir(os.path.join(repo, ".device-dg")):
        shutil.rmtree(keep_dg, ignore_errors=True)
        shutil.move(os.path.join(repo, ".device-dg"), keep_dg)
    shutil.rmtree(repo, ignore_errors=True)
    if len(args.bundle) > 1:
        merged = os.path.join(args.out, "merged-parts.nojit")
        merge_bundles(args.bundle, merged)
        args.bundle = merged
    else:
        args.bundle = args.bundle[0]
    n = copy_worktree(repo)
    one = os.path.join(repo, ".device-one")
    os.makedirs(one)
    from check_one_process import bundle_without

    bundle_without(args.bundle, os.path.join(one, "rest.nojit"), frozenset({"triton"}))
    for name in (".whl", ".device"):
        shutil.copytree(os.path.join(ROOT, name), os.path.join(repo, name),
                        ignore=lambda d, names: {x for x in names if x.endswith(".nojit")
                                                 or x in ("__pycache__", "vllm_mhc", "deepgemm")})
    from nojit.loader.bundle.file import Bundle

    runtimes = {r.runtime for r in Bundle.open(args.bundle).manifest.kernels.values()}
    for name, rt in ((".device-fi", "flashinfer"), (".device-cu", "cutedsl"), (".device-hg", "humming")):
        if rt in runtimes and os.path.isdir(os.path.join(ROOT, name)):  # only what the bundle's runtimes need
            copy_without_bundles(os.path.join(ROOT, name), os.path.join(repo, name))
    print(f"wheels dropped as the same project and version twice: {one_wheel_each(repo)}")
    cu_src = os.path.join(ROOT, ".device-cu", "vllm_src", "vllm")
    if os.path.isdir(cu_src):  # one vLLM tree in the process: the CuTeDSL references' files join the call sites'
        shutil.copytree(cu_src, os.path.join(repo, ".device", "vllm_src", "vllm"), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    if args.box_times:
        shutil.copy(args.box_times, os.path.join(one, "box_compile_times.json"))
    from nojit.loader.bundle.file import Bundle

    kernels = Bundle.open(args.bundle).manifest.kernels
    subset = {rt: {k for k, r in kernels.items() if r.runtime == rt} for rt in filter(None, args.subset.split(","))}
    counts = preflight_plan(args.plan, os.path.join(ROOT, ".device", "device.plan.json"),
                            os.path.join(one, "preflight.plan.json"), subset)
    if args.skip_deepgemm and os.path.isdir(keep_dg):
        shutil.move(keep_dg, os.path.join(repo, ".device-dg"))
    else:
        deepgemm_dir(os.path.join(repo, ".device-dg"), args.jit_headers)
    section = os.path.join(ROOT, ".device", "deepgemm")
    from nojit.loader.bundle.file import Bundle

    if os.path.isfile(os.path.join(section, "section.json")) and not any(
            r.runtime == "deepgemm" for r in Bundle.open(args.bundle).manifest.kernels.values()):
        # a bundle without DeepGEMM: prepare_deepgemm_device.py's entries (the composed step's M) in its place
        target = os.path.join(repo, ".device-dg", "section")
        shutil.rmtree(target, ignore_errors=True)
        os.makedirs(target)
        shutil.copy(os.path.join(section, "section.json"), target)
        shutil.copytree(os.path.join(section, "cubins"), os.path.join(target, "cubins"))
    if args.deepgemm_work:
        print(f"DeepGEMM sources: {deepgemm_sources(args.deepgemm_work, os.path.join(repo, '.device-dg', 'src'))} entries")
    sizes = {name: tree_size(os.path.join(repo, name)) for name in sorted(os.listdir(repo))}
    total = tree_size(repo)
    for name, size in sorted(sizes.items(), key=lambda x: -x[1])[:12]:
        print(f"  {size / 2**20:7.2f} MiB  {name}")
    print(f"{n} worktree files; preflight plan exact keys {counts}; payload {total / 2**20:.2f} MiB in {repo}")
    if total > LIMIT:
        print(f"over the {LIMIT >> 20} MiB a device call carries")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
