"""GPU check: a bundle replaced at its path (a redeploy) while servers and readers use it.

    python tests/gpu/checks/check_replace_under_load.py --bundle B.nojit --rebuilt B2.nojit --sources MAP.json \
        [--servers 4] [--readers 2] [--duration 120] [--keys-per-kernel 3] [--json OUT]

B2 is a different bundle of the same kernels (device_run.sh builds it with --no-generic). Steps:
  1. as many JIT processes as servers, at once, compute per kernel and exact key (at most
     --keys-per-kernel) the fingerprint of every buffer after plain Triton `kernel[grid](...)` on seeded
     inputs, --jit-runs times each: a kernel with a key whose JIT runs differ has racy synthetic inputs
     and is left out whole (named in the summary);
  2. the bundle is copied to a fresh path P; --servers processes (one per GPU when there are several,
     else all on GPU 0) install P in strict mode and signal; --readers processes open P and keep
     reading every cubin through the open bundle, and others reopen P from scratch in a loop;
  3. P is replaced by an atomic rename of a copy of B; only then do the servers start launching (so
     every cubin load happens after the file under them was replaced); halfway through, P is
     replaced by B2;
  4. every launch's buffers must equal the JIT's fingerprints, no process may see an error, and the
     fresh opens must each see one whole bundle (B or B2, never a mix). A summary table is printed.
Exit status 0 only if all of that held and every process launched or read something.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _keys(bundle_path: str, per_kernel: int, only: str | None) -> dict[str, list]:
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(bundle_path)
    out = {}
    for kid in b.kernel_ids():
        if b.manifest.kernels[kid].runtime != "triton" or (only and only not in kid):
            continue
        exact = [e.key for e in b.entries(kid) if e.variant == "exact"][:per_kernel]
        if exact:
            out[kid] = exact
    b.close()
    return out


def _wait_for(path: str, timeout: float = 600) -> None:
    t0 = time.time()
    while not os.path.exists(path):
        if time.time() - t0 > timeout:
            raise TimeoutError(path)
        time.sleep(0.05)


def child_jit(a: argparse.Namespace) -> dict:
    import torch

    from check_triton import _resolver
    from nojit.loader.resolve import jit_function_of
    from nojit.loader.bundle.triton_key import key_from_json
    from triton_harness import fingerprint, grid_for, synthesize

    torch.cuda.set_device(a.rank % torch.cuda.device_count())  # the same GPUs the servers will use
    keys = json.load(open(a.keys_file))
    resolve = _resolver(a.sources)
    ref: dict = {}
    for kid, key_list in keys.items():
        fn = jit_function_of(resolve(kid))
        grid = grid_for(fn)
        for i, k in enumerate(key_list):
            prints = []
            for _ in range(a.jit_runs):  # a key whose JIT runs disagree (racy synthetic inputs) is not compared
                kwargs, buffers, _ = synthesize(fn, key_from_json(k), 1000 + i)
                fn[grid](**kwargs)
                torch.cuda.synchronize()
                prints.append(fingerprint(buffers))
            ref[f"{kid}#{i}"] = prints[0] if all(p == prints[0] for p in prints) else None
    return {"reference": ref}


def child_server(a: argparse.Namespace) -> dict:
    import torch

    from check_triton import _resolver
    from nojit.loader.resolve import jit_function_of
    from nojit.loader.install import install
    from nojit.loader.bundle.triton_key import key_from_json
    from triton_harness import fingerprint, grid_for, synthesize

    os.environ["CUDA_DISABLE_PTX_JIT"] = "1"
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="nojit-empty-triton-cache-")
    ngpu = torch.cuda.device_count()
    torch.cuda.set_device(a.rank % ngpu)
    keys = json.load(open(a.keys_file))
    ref = json.load(open(a.reference))["reference"]
    resolve = _resolver(a.sources)
    inst = install(a.bundle, mode="strict", resolver=resolve, allow_mismatch=frozenset({"vllm"}), kernels=set(keys))
    open(a.ready, "w").close()
    _wait_for(a.go)  # the file under us has been replaced once: every cubin load below reads the replaced-away file
    fns = {kid: jit_function_of(resolve(kid)) for kid in keys}
    launches = mismatches = skipped = 0
    bad: list[str] = []
    deadline = time.time() + a.duration
    passes = 0
    while time.time() < deadline:
        for kid, key_list in keys.items():
            fn = fns[kid]
            grid = grid_for(fn)
            for i, k in enumerate(key_list):
                want = ref.get(f"{kid}#{i}")
                kwargs, buffers, _ = synthesize(fn, key_from_json(k), 1000 + i)
                fn[grid](**kwargs)
                torch.cuda.synchronize()
                launches += 1
                if want is None:
                    skipped += 1
                elif fingerprint(buffers) != want:
                    mismatches += 1
                    if len(bad) < 10:
                        bad.append(f"{kid}#{i}")
        passes += 1
    from nojit.loader.launch.cuda_launch import launcher

    return {"device": a.rank % ngpu, "launches": launches, "passes": passes, "mismatches": mismatches,
            "nondeterministic_skipped": skipped, "bad": bad, "served": inst.policy.summary(),
            "module_loads": launcher().loads}


def child_reader(a: argparse.Namespace) -> dict:
    """Even ranks: one open bundle, every cubin read again and again. Odd ranks: reopen the path each time."""
    from nojit.loader.bundle.file import Bundle

    seen: dict[str, int] = {}
    reads = opens = 0
    held = Bundle.open(a.bundle) if a.rank % 2 == 0 else None
    open(a.ready, "w").close()
    deadline = time.time() + a.duration + 30
    while time.time() < deadline:
        if held is not None:
            reads += held.verify()
        else:
            b = Bundle.open(a.bundle)  # each open sees one whole file: the old one or the new one
            reads += b.verify()
            manifest = b.header.index_sha256.hex()[:16]
            seen[manifest] = seen.get(manifest, 0) + 1
            b.close()
            opens += 1
    return {"mode": "held" if held is not None else "reopen", "cubin_reads": reads, "opens": opens,
            "manifests_seen": seen}


def _spawn(role: str, a: argparse.Namespace, rank: int, work: str, extra: list[str]) -> tuple[subprocess.Popen, str]:
    out = os.path.join(work, f"{role}-{rank}.json")
    cmd = [sys.executable, __file__, "--child", role, "--rank", str(rank), "--out", out, "--keys-file",
           os.path.join(work, "keys.json"), "--duration", str(a.duration), "--jit-runs", str(a.jit_runs), *extra]
    if a.sources:
        cmd += ["--sources", a.sources]
    log = open(os.path.join(work, f"{role}-{rank}.log"), "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), out


def _jit_reference(a: argparse.Namespace, work: str) -> tuple[dict | None, str, list[str]]:
    """The JIT's fingerprints, taken under the same contention as the servers: as many JIT processes as servers,
    at once, each running every key --jit-runs times. A key is compared only if every run of every JIT process
    gave one fingerprint; a kernel with any such racy key (its synthetic inputs let programs race on one output,
    e.g. colliding random indices) is left out whole, by name, because contention decides which program wins."""
    spawned = [_spawn("jit", a, r, work, []) for r in range(max(1, a.servers))]
    runs = []
    for proc, out in spawned:
        proc.wait()
        res = json.load(open(out))
        if res["error"]:
            print("JIT reference failed:", res["error"], res.get("traceback", ""), file=sys.stderr)
            return None, "", []
        runs.append(res["reference"])
    merged: dict = {}
    for key in runs[0]:
        prints = [r[key] for r in runs]
        merged[key] = prints[0] if all(p is not None and p == prints[0] for p in prints) else None
    racy = sorted({k.rsplit("#", 1)[0] for k, v in merged.items() if v is None})
    for key in merged:
        if key.rsplit("#", 1)[0] in racy:
            merged[key] = None
    jit = {"reference": merged, "racy_kernels": racy}
    ref_path = os.path.join(work, "jit-reference.json")
    with open(ref_path, "w") as f:
        json.dump(jit, f)
    return jit, ref_path, racy


def _atomic_copy(src: str, dst: str) -> None:
    tmp = dst + ".incoming"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle")
    ap.add_argument("--rebuilt", help="a different bundle of the same kernels (the second replacement)")
    ap.add_argument("--sources")
    ap.add_argument("--servers", type=int, default=4)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--jit-runs", type=int, default=8, help="JIT runs per key for the reference (racy keys are skipped)")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--keys-per-kernel", type=int, default=3)
    ap.add_argument("--kernels", help="substring filter on kernel ids")
    ap.add_argument("--json")
    ap.add_argument("--child")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--out")
    ap.add_argument("--keys-file")
    ap.add_argument("--reference")
    ap.add_argument("--ready")
    ap.add_argument("--go")
    a = ap.parse_args()
    if a.child:
        try:
            result = {"child_jit": child_jit, "child_server": child_server, "child_reader": child_reader}[
                f"child_{a.child}"](a)
            result["error"] = None
        except BaseException as exc:  # reported, never swallowed: the parent fails the run
            result = {"error": f"{type(exc).__name__}: {exc}"[:2000], "traceback": traceback.format_exc()[-3000:]}
        with open(a.out, "w") as f:
            json.dump(result, f)
        return 0 if result["error"] is None else 1

    work = tempfile.mkdtemp(prefix="nojit-replace-")
    served = os.path.join(work, "served.nojit")
    shutil.copyfile(a.bundle, served)
    keys = _keys(a.bundle, a.keys_per_kernel, a.kernels)
    rebuilt_keys = _keys(a.rebuilt, 10**6, a.kernels)
    missing = [f"{k}" for k, ks in keys.items() if any(x not in rebuilt_keys.get(k, []) for x in ks)]
    if missing:
        print(f"the rebuilt bundle lacks exact keys of {missing[:5]}", file=sys.stderr)
        return 2
    with open(os.path.join(work, "keys.json"), "w") as f:
        json.dump(keys, f)
    t0 = time.time()
    jit, ref_path, racy = _jit_reference(a, work)
    if jit is None:
        return 1
    go = os.path.join(work, "go")
    procs = []
    for r in range(a.servers):
        ready = os.path.join(work, f"ready-server-{r}")
        procs.append(("server", r, ready, *_spawn("server", a, r, work, ["--bundle", served, "--reference", ref_path,
                                                                         "--ready", ready, "--go", go])))
    for r in range(a.readers * 2):
        ready = os.path.join(work, f"ready-reader-{r}")
        procs.append(("reader", r, ready, *_spawn("reader", a, r, work, ["--bundle", served, "--ready", ready])))
    for role, r, ready, proc, _ in procs:
        while not os.path.exists(ready):
            if proc.poll() is not None:
                break
            time.sleep(0.1)
    events = []
    _atomic_copy(a.bundle, served)  # replacement 1: the same bytes under a new inode
    events.append(("replaced by a copy", time.time() - t0))
    open(go, "w").close()
    time.sleep(a.duration / 2)
    _atomic_copy(a.rebuilt, served)  # replacement 2: a different bundle
    events.append(("replaced by the rebuilt bundle", time.time() - t0))
    results = []
    ok = True
    for role, r, _ready, proc, out in procs:
        proc.wait()
        try:
            res = json.load(open(out))
        except (OSError, ValueError):
            res = {"error": f"exit {proc.returncode}, no result; see {out[:-5]}.log"}
        results.append({"role": role, "rank": r, **res})
        if res.get("error"):
            ok = False
        if role == "server" and (res.get("mismatches") or not res.get("launches")):
            ok = False
        if role == "reader" and not res.get("cubin_reads"):
            ok = False
        if role == "reader" and res.get("mode") == "reopen" and len(res.get("manifests_seen", {})) != 2:
            ok = False  # a reader reopening the path must have seen both bundles, whole
    compared = sum(v is not None for v in jit["reference"].values())
    print(f"replace under load: {len(keys)} kernels, {len(jit['reference'])} keys ({compared} deterministic, compared)")
    print(f"  left out whole (racy under {max(1, a.servers)} concurrent JIT processes): {len(racy)} kernels: "
          + ", ".join(k.rsplit(":", 1)[-1] for k in racy))
    for what, at in events:
        print(f"  {at:7.1f} s  {what}")
    print(f"  {'process':<10} {'dev':>3} {'launches':>9} {'mismatch':>8} {'loads':>6} {'reads':>7} {'opens':>6}  error")
    for r in results:
        print(f"  {r['role'] + '-' + str(r['rank']):<10} {str(r.get('device', '')):>3} {r.get('launches', ''):>9} "
              f"{r.get('mismatches', ''):>8} {r.get('module_loads', ''):>6} {r.get('cubin_reads', ''):>7} "
              f"{r.get('opens', ''):>6}  {(r.get('error') or '')[:100]}")
        if r.get("manifests_seen"):
            print(f"             manifests seen by fresh opens: {r['manifests_seen']}")
    print("REPLACE-UNDER-LOAD:", "PASS" if ok else "FAIL")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ok": ok, "events": events, "results": results, "keys": len(jit["reference"]),
                       "compared": compared, "racy_kernels": racy}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
