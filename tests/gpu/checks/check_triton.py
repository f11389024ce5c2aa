"""GPU check: every bundled Triton key, loader vs Triton JIT, bit for bit, with zero compiles.

Run on an sm_90 machine (the H200 through the device tool):

    python tests/gpu/checks/check_triton.py --bundle B.nojit [--sources MAP.json] [--variant exact|generic]

For each kernel two fresh processes run the same keys on the same seeded inputs:
  loader: NOJIT_MODE=strict, CUDA_DISABLE_PTX_JIT=1, an empty Triton cache, an audit hook
          counting every process started; Triton's post-compile hook counts compiles.
  jit:    plain Triton `kernel[grid](...)` on the kernel's source (compiles each key).
Both hash every byte of every buffer afterwards; the table says whether they are identical,
how many compiles and processes the loader run saw (must be 0), and whether the JIT's own
cubin equals the bundled one. `--variant generic` launches each kernel's universal entry
with the arguments of every exact key instead (the loader must serve them as fallbacks, from
the entry laid out for the key). `--variant misaligned` launches that same generic entry
directly on copies of the inputs shifted one element off their 16-byte alignment (same
values, other addresses) against the JIT on the aligned originals: the entry must give the
same bits (its code assumes no alignment; its reduction order follows its layout, not the
addresses). `--variant perturbed` launches keys with nothing specialized.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
JIT_REPEATS = 2  # extra JIT runs per key, to tell racy inputs from loader differences
sys.path.insert(0, HERE)


def _resolver(sources: str | None):
    from nojit.aot.runtimes.triton.sources import load_source_map, resolve_kernel

    smap = load_source_map(sources) if sources else None
    return lambda kid: resolve_kernel(kid, smap)


def _entries(bundle_path: str, kernel: str, variant: str, plan: str | None):
    """(index, key, entry) to launch: the bundle's exact keys (from --plan's exact keys if given), or
    for `perturbed` each distinct generic form of them (no alignment or divisibility, no ints equal to 1)."""
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.bundle.triton_key import generic_spec, key_from_json, runtime_params

    b = Bundle.open(bundle_path)
    rec = b.manifest.kernels[kernel]
    if plan:
        with open(plan) as f:
            keys = [r["key"] for r in json.load(f)["requests"] if r["kernel"] == kernel and r["variant"] == "exact"]
    else:
        keys = [e.key for e in b.entries(kernel) if e.variant == "exact"]
    # Exact entries only: a generic entry laid out for a key with no value-1 argument has that key's JSON.
    by_key = {json.dumps(e.key, sort_keys=True): e for e in b.entries(kernel) if e.variant == "exact"}
    out, seen = [], set()
    runtime = runtime_params(rec.info, len(rec.params))
    for i, k in enumerate(keys):
        key = key_from_json(k)
        if variant == "perturbed":
            key = (generic_spec(key[0], runtime), key[1])
            if key in seen:
                continue
            seen.add(key)
        out.append((i, key, by_key.get(json.dumps(k, sort_keys=True))))
    return b, out


def child(role: str, bundle_path: str, kernel: str, sources: str | None, seed: int, variant: str, out: str,
          mode: str = "strict", record_file: str | None = None, plan: str | None = None, timing: bool = False) -> None:
    events: list[str] = []
    if role == "loader":
        os.environ["CUDA_DISABLE_PTX_JIT"] = "1"
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="nojit-empty-triton-cache-")
        sys.addaudithook(lambda ev, args: events.append(f"{ev}:{str(args[0])[:60]}")
                         if ev in ("subprocess.Popen", "os.posix_spawn", "os.system", "os.exec") else None)
    import torch
    import triton

    from nojit.loader.bundle.triton_key import key_text
    from triton_harness import (
        fingerprint,
        grid_for,
        misaligned_copies,
        read_modify_write_names,
        synthesize,
        written_elements,
    )

    if role == "jit":  # the build names kernel sources the same way (aot/reproducible.py): cubins comparable
        from nojit.aot.reproducible import canonical_source_paths

        canonical_source_paths()
    compiles: list[str] = []
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: compiles.append(str(kw.get("key"))[:80])
    resolve = _resolver(sources)
    from nojit.loader.resolve import jit_function_of

    fn = jit_function_of(resolve(kernel))
    GRID = grid_for(fn)
    bundle, entries = _entries(bundle_path, kernel, variant, plan)
    results = {}
    if role == "loader":
        from nojit.loader.strict import guards
        from nojit.loader.install import install

        inst = install(bundle_path, mode=mode, resolver=resolve, allow_mismatch=frozenset({"vllm"}),
                       kernels={kernel}, record_file=record_file)
        server = inst.servers("triton")[kernel]
        server.all_exact = dict(server.exact)  # kept for timing exact against generic
        if variant in ("generic", "misaligned"):
            server.exact.clear()  # every call must now be served by the kernel's universal entries
    t0 = time.perf_counter()
    for i, key, entry in entries:
        kwargs, buffers, outputs = synthesize(fn, key, seed + i)
        row: dict = {"key": key_text(key)}
        if role == "loader":
            bound, spec, options = server._binder(**{**kwargs, "debug": False, "instrumentation_mode": ""})
            from nojit.loader.bundle.triton_key import layout_spec, options_key

            row["key_matches"] = (spec, options_key(options)) == key
            okey = server.options_key(options)
            laid_out_entry = server.generic.get((layout_spec(spec, server._runtime_param), okey))
            if variant == "generic":
                chosen = server.fallback_for((spec, okey))
                row["served"] = ("generic" if chosen is not None and chosen is laid_out_entry
                                 else "generic (nearest)" if chosen is not None else "missing")
            if variant == "misaligned":
                shifted_kwargs, buffers, row["shifted"] = misaligned_copies(fn, key, kwargs, buffers)
                shifted, _spec, _options = server._binder(**{**shifted_kwargs, "debug": False,
                                                             "instrumentation_mode": ""})
                row["served"] = "generic" if laid_out_entry is not None else "missing"
                if laid_out_entry is not None:
                    laid_out_entry(shifted, GRID)
            else:
                fn[GRID](**kwargs)
        else:
            compiled = fn[GRID](**kwargs)
            import hashlib

            row["jit_hash"] = compiled.hash
            row["jit_cubin"] = hashlib.sha256(compiled.asm["cubin"]).hexdigest()
            row["bundle_hash"] = entry.launch.compile_hash if entry else None
            row["bundle_cubin"] = entry.blob if entry else None
            # Run the JIT twice more on fresh copies: a key whose result differs between JIT runs
            # is nondeterministic on these inputs (programs racing), and cannot be compared bit for bit.
            first = fingerprint(buffers)
            row["deterministic"] = True
            for _ in range(JIT_REPEATS):
                again_kwargs, again_buffers, _ = synthesize(fn, key, seed + i)
                fn[GRID](**again_kwargs)
                row["deterministic"] &= fingerprint(again_buffers) == first
        row["hash"] = fingerprint(buffers)
        row["written"] = written_elements(fn, buffers, kwargs, outputs)
        if role == "loader" and timing and not read_modify_write_names(fn):
            # After hashing: timing relaunches on the same buffers. Kernels that update their own
            # inputs are not timed (hundreds of launches would drift their state).
            row["device_us"] = _time_exact_vs_generic(server, kwargs, GRID)
        results[i] = row
    torch.cuda.synchronize()
    summary = {"role": role, "results": results, "seconds": time.perf_counter() - t0, "compiles": compiles,
               "processes": events}
    if role == "loader":
        summary["guard_attempts"] = list(guards.compile_attempts)
        summary["served"] = {k: v for k, v in inst.policy.summary().items()}
        summary["loads"] = __import__("nojit.loader.launch.cuda_launch", fromlist=["launcher"]).launcher().loads
    with open(out, "w") as f:
        json.dump(summary, f)


def _time_exact_vs_generic(server, kwargs: dict, grid: tuple) -> dict:
    """Device time per launch (CUDA events, 200 launches) of the exact entry and the generic one, same arguments."""
    import torch

    bound, spec, options = server._binder(**kwargs)
    okey = server.options_key(options)
    variants = {"exact": server.all_exact.get((spec, okey)), "generic": server.fallback_for((spec, okey))}
    out = {}
    for name, v in variants.items():
        if v is None:
            continue
        for _ in range(20):
            v(bound, grid)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(200):
            v(bound, grid)
        end.record()
        end.synchronize()
        out[name] = start.elapsed_time(end) * 1000 / 200
    return out


def run_kernel(args: argparse.Namespace, kernel: str, seed: int, workdir: str) -> dict:
    outs = {}
    procs = {}
    for role in ("loader", "jit"):
        outs[role] = os.path.join(workdir, f"{abs(hash(kernel))}-{role}.json")
        cmd = [sys.executable, __file__, "--child", role, "--bundle", args.bundle, "--kernel", kernel, "--seed", str(seed),
               "--variant", args.variant, "--out", outs[role], "--mode", args.mode]
        for flag, value in (("--sources", args.sources), ("--record-file", args.record_file), ("--plan", args.plan)):
            if value:
                cmd += [flag, value]
        if args.time:
            cmd.append("--time")
        env = None
        if role == "loader" and os.environ.get("NOJIT_CHECK_LOADER_PATH"):  # e.g. a PATH with no compiler
            env = {**os.environ, "PATH": os.environ["NOJIT_CHECK_LOADER_PATH"]}
        procs[role] = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    report = {"kernel": kernel}
    for role, p in procs.items():
        if p.returncode != 0:
            report["error"] = f"{role} exited {p.returncode}: {p.stderr[-1500:]}"
            return report
        with open(outs[role]) as f:
            report[role] = json.load(f)
    return report


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--sources")
    ap.add_argument("--variant", default="exact", choices=["exact", "generic", "misaligned", "perturbed"])
    ap.add_argument("--mode", default="strict", choices=["strict", "record"])
    ap.add_argument("--record-file", help="with --mode record: where the loader appends requested keys")
    ap.add_argument("--plan", help="launch this plan's exact keys instead of the bundle's")
    ap.add_argument("--time", action="store_true", help="time exact vs generic entries per key (device time)")
    ap.add_argument("--kernels", help="substring filter on kernel ids")
    ap.add_argument("--json", help="write the full report here")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--child")
    ap.add_argument("--kernel")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.bundle, args.kernel, args.sources, args.seed, args.variant, args.out, args.mode,
              args.record_file, args.plan, args.time)
        return 0
    from nojit.loader.bundle.file import Bundle

    bundle = Bundle.open(args.bundle)
    kernels = [k for k, r in sorted(bundle.manifest.kernels.items())
               if r.runtime == "triton" and (not args.kernels or args.kernels in k)]
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"bundle {args.bundle}: {len(kernels)} Triton kernels, variant {args.variant}, seed {seed}", flush=True)
    workdir = tempfile.mkdtemp(prefix="nojit-gpu-check-")
    with ThreadPoolExecutor(args.parallel) as pool:
        reports = list(pool.map(lambda k: run_kernel(args, k, seed, workdir), kernels))
    rows, ok_all = [], True
    for r in reports:
        name = r["kernel"].rpartition(":")[2] + "  (" + r["kernel"].partition(":")[0].rpartition(".")[2] + ")"
        if "error" in r:
            ok_all = False
            rows.append((name, "-", "ERROR", "-", "-", "-", "-", r["error"].splitlines()[-1][:80], "-"))
            continue
        lo, ji = r["loader"], r["jit"]
        n = len(lo["results"])
        same = sum(lo["results"][i]["hash"] == ji["results"][i]["hash"] for i in lo["results"])
        racy = sum(not ji["results"][i]["deterministic"] for i in ji["results"])
        key_ok = all(v.get("key_matches") for v in lo["results"].values())
        cubin_same = sum(ji["results"][i]["jit_cubin"] == ji["results"][i]["bundle_cubin"] for i in ji["results"])
        timed = [v["device_us"] for v in lo["results"].values() if "device_us" in v and len(v["device_us"]) == 2]
        timing = (f"{statistics.mean(t['exact'] for t in timed):.2f}/{statistics.mean(t['generic'] for t in timed):.2f}"
                  if timed else "-")
        written = sum(v["written"] for v in lo["results"].values())
        compiles = len(lo["compiles"]) + len(lo["guard_attempts"])
        procs = len(lo["processes"])
        served = lo.get("served", {})
        fallback_ok = all(v.get("served", "generic") == "generic" for v in lo["results"].values())
        if args.variant == "misaligned":
            served = {**served, "pointers shifted": sum(v.get("shifted", 0) for v in lo["results"].values())}
        ok = same == n and key_ok and compiles == 0 and procs == 0 and fallback_ok
        ok_all &= ok
        ident = "yes" if same == n else f"NO ({same}/{n})"
        if racy:
            ident += f", {racy} nondeterministic in JIT too"
        rows.append((name, str(n), ident, f"{cubin_same}/{n}", str(compiles),
                     str(procs), str(written), ",".join(f"{k}={v}" for k, v in sorted(served.items())) or "-", timing))
    header = ("kernel", "keys", "identical", "same cubin", "compiles", "procs", "written", "served",
              "us exact/generic")
    widths = [max(len(str(x[i])) for x in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    print(f"\nRESULT: {'PASS' if ok_all else 'FAIL'} ({len(kernels)} kernels, variant {args.variant})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seed": seed, "reports": reports}, f)
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
