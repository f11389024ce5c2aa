"""The CPU part of a strict worker's time to ready, two nojit trees side by side in one run (issue 23).

    python bench/bench_ready_cpu.py --old-root /work/main --new-root . [--python PY] [--bundle B.nojit] [--repeat 3]
                                    [--plan PLAN.json] [--deepgemm-so EXT.so] [--json OUT]

--only STEP,STEP runs only those steps (names as below; "install" for the three install rows and the rows
measured in their processes). Python's bytecode: nojit's modules imported inside a timed step are compiled from
source when no .pyc can be read or written (PYTHONDONTWRITEBYTECODE=1 and no __pycache__, as a fresh checkout run
that way has): the table says which (a pip-installed nojit has its bytecode).

Both sides run in fresh processes of ONE interpreter (--python, default this one: a venv with nojit installed
editable) and one site-packages; only the nojit tree differs
(the editable install's finder is pointed at --old-root or --new-root before nojit is imported), so the numbers
compare code, not environments. Sides alternate, each step --repeat times; the table gives the best and the median
CPU time (user + system of the process, which a loaded shared box inflates less than wall time), the median wall
time, and the median CPU time of the calling thread alone (another thread of the process running meanwhile, which
the process CPU time counts, does not count there).
Steps (a fresh runtime folder, XDG_RUNTIME_DIR, where "first" is said; "later" reuses the first's):
  scan            the compiler scan of the site-packages folders (compilers._site_folders over --site)
  landlock first  landlock.enforce in a fresh runtime folder: the compiler search, the exec plan, the ruleset
  landlock later  the same in a later process (compilers.json and exec-plan.json reused)
  deepgemm first  DeepGEMM's cache seeded from a section of 203 entries of 48 KiB (the H200 run's count; the
                  size of a DeepGEMM sm90 cubin) into an empty folder
  deepgemm later  the same section seeded again (a later process: every entry checked, none written)
  install later   install(strict) of --bundle in a later process, vLLM's kernel modules imported first (not timed)
  plan keys       with --plan: the device check's preflight of the plan's Triton keys against --bundle (the plan
                  file parsed before, apart: a harness cost a server does not pay)
  prepare         every Triton kernel of --bundle prepared after that install (what the preflight does)
  install worker  install(strict) of --bundle in a child of a process that enforced Landlock: a vLLM worker of a
                  strict tree, which inherits the domain (landlock.enforce answers "inherited")
  install worker fw  the same in a child of a process that put the firewall up and enforced Landlock, as the
                  plugin's install() does in vLLM's engine core: a spawned worker inherits both (the firewall's
                  folder through NOJIT_FIREWALL_DIR, firewall._inherited), which is what a real worker gets
  deepgemm slots  with --deepgemm-so: DeepGEMM's popen/pclose PLT slots found in its extension
No GPU: the deployment's stand-in H200 answers device questions; nothing is launched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, os, sys, time, resource
root, step, arg = sys.argv[1], sys.argv[2], sys.argv[3]
import __editable___nojit_0_1_0_finder as finder
finder.MAPPING.update({"nojit.aot": os.path.join(root, "aot"), "nojit.loader": os.path.join(root, "loader")})
os.environ["NOJIT_QUIET"] = "1"
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1e3
def timed(f):
    c, t, th = cpu(), time.perf_counter(), time.thread_time()
    out = f()
    return {"cpu_ms": cpu() - c, "wall_ms": (time.perf_counter() - t) * 1e3, "thread_ms": (time.thread_time() - th) * 1e3,
            "out": out}
import nojit.loader
assert nojit.loader.__file__.startswith(root), nojit.loader.__file__
if step == "scan":
    from nojit.loader.strict import compilers
    r = timed(lambda: len(compilers._site_folders(arg)))
elif step == "landlock":
    from nojit.loader.strict import firewall, landlock
    rt = firewall.runtime_dir()
    r = timed(lambda: landlock.enforce(None, rt).state)
elif step == "deepgemm":
    import hashlib
    from nojit.loader.runtimes.deepgemm.cache import seed
    blobs = {}
    entries = {}
    for i in range(203):
        b = hashlib.sha256(str(i).encode()).digest() * (48 * 1024 // 32)
        sha = hashlib.sha256(b).hexdigest()
        blobs[sha] = b
        entries[f"sm90_fp8_gemm_1d2d.{sha[:32]}"] = {"cubin": sha, "source": "// kernel.cu\n" * 200}
    section = {"nvcc_version": "release 13.0", "entries": entries, "keys": []}
    r = timed(lambda: bool(seed(section, blobs.__getitem__, "b.nojit", base=arg)))
elif step == "slots":
    from nojit.loader.runtimes.deepgemm.popen import plt_slots
    r = timed(lambda: len(plt_slots(arg, ("popen", "pclose"))))
else:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    from nojit.aot.deployment import load_deployment
    from nojit.aot.vllm_env import import_kernel_module, install_deployment_platform
    install_deployment_platform(load_deployment().platform)
    import gc, torch, triton
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.resolve import resolve_object
    b = Bundle.open(arg)
    ids = [k for k in sorted(b.manifest.kernels) if b.manifest.kernels[k].runtime == "triton"]
    for kid in ids:
        resolve_object(kid, import_module=import_kernel_module)
    from nojit.loader.launch.fast_module import fast_module
    fast_module()  # once per process, whoever calls it first; not what is compared here
    gc.collect(); gc.freeze()
    from nojit.loader.install import install
    allow = frozenset({"vllm", "source", "triton"})
    r = timed(lambda: len(install(arg, mode="strict", allow_mismatch=allow, kernels=set(ids)).servers("triton")))
    inst = install(arg, mode="strict", allow_mismatch=allow, kernels=set(ids))
    r["steps"] = {k: round(v, 2) for k, v in inst.timings.items()}
    out = {"install": r}
    plan = os.environ.get("BENCH_PLAN")
    if plan:  # the device check's preflight of the plan's keys (tests/gpu/checks/check_one_process.py), this tree's
        sys.path.insert(0, os.path.join(root, "tests", "gpu", "checks"))
        import check_one_process as one
        one._plan_requests(plan)  # the plan file parsed apart: a harness cost, not a server's
        out["plan keys"] = timed(lambda: one.plan_preflight(inst.bundle, plan, {"triton"}).get("triton", 0))
    out["prepare"] = timed(lambda: [sv.prepare() for sv in inst.servers("triton").values()] and len(inst.servers("triton")))
    r = out
print("RESULT " + json.dumps(r))
"""


PARENT = r"""
import os, subprocess, sys
root = sys.argv[1]
import __editable___nojit_0_1_0_finder as finder
finder.MAPPING.update({"nojit.aot": os.path.join(root, "aot"), "nojit.loader": os.path.join(root, "loader")})
os.environ["NOJIT_QUIET"] = "1"
from nojit.loader.strict import firewall, landlock
if os.environ.get("BENCH_PARENT_FIREWALL"):
    firewall.activate(None)  # as install() does before Landlock: the worker inherits NOJIT_FIREWALL_DIR
assert landlock.enforce(None, firewall.runtime_dir()).state == "on"
sys.exit(subprocess.call(sys.argv[2:]))
"""


def child(python: str, root: str, step: str, arg: str, env: dict[str, str], worker: bool | str = False) -> dict:
    """One step in a fresh process; worker: in a child of a process that enforced Landlock (a vLLM worker of a
    strict tree: the domain is inherited, not built again)."""
    cmd = [python, "-c", CHILD, root, step, arg]
    if worker:
        cmd = [python, "-c", PARENT, root, *cmd]
        env = {**env, "BENCH_PARENT_FIREWALL": "1"} if worker == "firewall" else env
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{root} {step} failed:\n{p.stderr[-3000:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-root", required=True)
    ap.add_argument("--new-root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--site", default=next((p for p in sys.path if p.endswith("site-packages")
                                            and os.path.isdir(os.path.join(p, "torch"))), ""))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--bundle", default="")
    ap.add_argument("--plan", default="", help="with --bundle: time the device check's preflight of this plan's "
                    "Triton keys against the bundle (check_one_process.plan_preflight) before the prepare")
    ap.add_argument("--deepgemm-so", default="", help="DeepGEMM's extension (_C_extension.abi3.so): time finding "
                    "its popen/pclose slots (the in-process nvcc probe answer's setup)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--only", default="", help="comma-separated steps to run (scan, landlock, deepgemm, slots, "
                    "install); default all")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    sides = {"old": os.path.abspath(args.old_root), "new": os.path.abspath(args.new_root)}
    rows: dict[str, dict[str, list[dict]]] = {}

    def add(name: str, side: str, r: dict) -> None:
        rows.setdefault(name, {}).setdefault(side, []).append(r)

    only = set(filter(None, args.only.split(","))) or {"scan", "landlock", "deepgemm", "slots", "install"}
    cached = {side: os.path.isdir(os.path.join(r, "loader", "runtimes", "triton", "__pycache__")) for side, r in sides.items()}
    print(f"bytecode: PYTHONDONTWRITEBYTECODE {'set' if os.environ.get('PYTHONDONTWRITEBYTECODE') else 'unset'}; "
          f"__pycache__ there before the run: old {cached['old']}, new {cached['new']}")
    for _ in range(args.repeat):
        for side, root in sides.items():
            env = dict(os.environ)
            if "scan" in only:
                add("scan", side, child(args.python, root, "scan", args.site, env))
            env["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="nojit-bench-")
            if "landlock" in only:
                add("landlock first", side, child(args.python, root, "landlock", "", env))
                add("landlock later", side, child(args.python, root, "landlock", "", env))
            base = tempfile.mkdtemp(prefix="nojit-bench-dg-")
            if "deepgemm" in only:
                add("deepgemm first", side, child(args.python, root, "deepgemm", base, env))
                add("deepgemm later", side, child(args.python, root, "deepgemm", base, env))
            if args.deepgemm_so and "slots" in only:
                add("deepgemm slots", side, child(args.python, root, "slots", args.deepgemm_so, env))
            if args.bundle and "install" in only:
                if args.plan:
                    env["BENCH_PLAN"] = os.path.abspath(args.plan)
                child(args.python, root, "install", args.bundle, env)  # the first process: the stand-ins and caches made
                r = child(args.python, root, "install", args.bundle, env)
                add("install later", side, r["install"])
                if "plan keys" in r:
                    add("plan keys", side, r["plan keys"])
                add("prepare", side, r["prepare"])
                w = child(args.python, root, "install", args.bundle, env, worker=True)
                add("install worker", side, w["install"])
                w = child(args.python, root, "install", args.bundle, env, worker="firewall")
                add("install worker fw", side, w["install"])
    print(f"{'step':17s} {'CPU ms: old best / median':>26s} {'new best / median':>20s} {'wall ms: old median':>20s} "
          f"{'new median':>11s} {'thread ms: old / new':>21s}  what")
    table = {}
    for name, by in rows.items():
        med = {side: {k: statistics.median(r.get(k, 0.0) for r in by[side]) for k in ("cpu_ms", "wall_ms", "thread_ms")}
               for side in by}
        best = {side: min(r["cpu_ms"] for r in by[side]) for side in by}
        what = by["new"][-1].get("out")
        table[name] = {**med, "best_cpu_ms": best, "out": what, "steps_new": by["new"][-1].get("steps"),
                       "steps_old": by["old"][-1].get("steps")}
        print(f"{name:17s} {best['old']:17.1f} / {med['old']['cpu_ms']:6.1f} {best['new']:11.1f} / "
              f"{med['new']['cpu_ms']:6.1f} {med['old']['wall_ms']:20.1f} {med['new']['wall_ms']:11.1f} "
              f"{med['old']['thread_ms']:12.1f} / {med['new']['thread_ms']:6.1f}  {what}")
    for name in ("install later", "install worker", "install worker fw"):
        if name in table:
            print(f"install steps (ms, last run): old {table[name]['steps_old']}\n                           new "
                  f"{table[name]['steps_new']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sides": sides, "python": args.python, "repeat": args.repeat, "site": args.site, "bundle": args.bundle,
                       "rows": rows, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
