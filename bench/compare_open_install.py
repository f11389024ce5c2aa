"""Bundle.open and install() of two nojit versions side by side, on the CPU build box (issue 15).

    python bench/compare_open_install.py --new-bundle NEW.nojit [--old-python /work/main/.venv/bin/python
                                         --old-bundle OLD.nojit] [--repeat 7] [--json OUT.json]

Each side runs in its own fresh process (its own Python, hence its own nojit): the deployment's GPU
facts are installed (the build's stand-in H200, aot/vllm_env.py), Triton, torch and every bundled
Triton kernel's vLLM module are imported first (install() is timed, not vLLM's imports), then
  open     Bundle.open, best and median of --repeat;
  install  install(strict) + uninstall, best and median of --repeat, with the default resolver (the
           installed vLLM's modules, as in serving); the first install separately (cold: nothing of
           nojit's loader warmed up but its imports); and one more with every kernel prepared
           (Installation.prepare where the version has it: the source hashes and sections that
           install() leaves to first use).
No GPU: nothing is launched. TileLang's mHC module is not imported (nojit installs before it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

CHILD = r"""
import gc, json, os, statistics, sys, time
os.environ["CUDA_VISIBLE_DEVICES"] = ""
os.environ["NOJIT_QUIET"] = "1"
from nojit.aot.deployment import load_deployment
from nojit.aot.vllm_env import import_kernel_module, install_deployment_platform
from nojit.loader.bundle.file import Bundle
from nojit.loader.resolve import resolve_object
install_deployment_platform(load_deployment().platform)
path, repeat = sys.argv[1], int(sys.argv[2])
b = Bundle.open(path)
index = getattr(b, "index", None) or b.manifest
triton_ids = [k for k in sorted(index.kernels) if index.kernels[k].runtime == "triton"]
b.close()
import torch, triton
for kid in triton_ids:
    resolve_object(kid, import_module=import_kernel_module)
gc.collect(); gc.freeze()  # vLLM's heap: keep a full collection out of the timed calls
def best(f):
    ts, cpu = [], []
    for _ in range(repeat):
        c = time.thread_time(); t = time.perf_counter(); f()
        ts.append((time.perf_counter() - t) * 1e3); cpu.append((time.thread_time() - c) * 1e3)
    # cpu: this thread's CPU time, the number that a loaded shared box does not inflate
    return {"best": min(ts), "median": statistics.median(ts), "cpu": min(cpu)}
out = {"open_ms": best(lambda: Bundle.open(path).close())}
from nojit.loader.install import install
c = time.thread_time(); t = time.perf_counter(); inst = install(path, mode="strict"); out["install_first_ms"] = (time.perf_counter() - t) * 1e3
out["install_first_cpu_ms"] = (time.thread_time() - c) * 1e3
out["kernels"] = [len(inst.servers("triton")), len(inst.servers("tilelang"))]
inst.uninstall()
def once():
    install(path, mode="strict").uninstall()
out["install_ms"] = best(once)
inst = install(path, mode="strict")
c = time.thread_time(); t = time.perf_counter()
if hasattr(inst, "prepare"):
    inst.prepare()
out["prepare_all_ms"] = (time.perf_counter() - t) * 1e3
out["prepare_all_cpu_ms"] = (time.thread_time() - c) * 1e3
inst.uninstall()
print("RESULT " + json.dumps(out))
"""


def side(python: str, bundle: str, repeat: int, cwd: str) -> dict:
    p = subprocess.run([python, "-c", CHILD, bundle, str(repeat)], capture_output=True, text=True, cwd=cwd, timeout=1800)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{python} failed:\n{p.stderr[-4000:]}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--new-bundle", required=True)
    ap.add_argument("--new-python", default=sys.executable)
    ap.add_argument("--old-bundle")
    ap.add_argument("--old-python")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    sides = {"new": side(args.new_python, args.new_bundle, args.repeat, here)}
    if args.old_python and args.old_bundle:
        sides["old"] = side(args.old_python, args.old_bundle, args.repeat, here)
    print(f"{'':28}" + "".join(f"{name:>22}" for name in sides))
    for what in ("open_ms", "install_ms"):
        for stat in ("best", "median", "cpu"):
            print(f"{what[:-3] + ' ' + stat + ' (ms)':28}" + "".join(f"{s[what][stat]:22.2f}" for s in sides.values()))
    for what in ("install_first_ms", "install_first_cpu_ms", "prepare_all_ms", "prepare_all_cpu_ms"):
        print(f"{what[:-3].replace('_', ' ') + ' (ms)':28}" + "".join(f"{s[what]:22.2f}" for s in sides.values()))
    print(f"{'kernels (Triton, TileLang)':28}" + "".join(f"{str(s['kernels']):>22}" for s in sides.values()))
    if "old" in sides:
        for what in ("open_ms", "install_ms"):
            print(f"{what[:-3]} new/old (best): {sides['new'][what]['best'] / sides['old'][what]['best']:.3f}")
    new = sides["new"]
    print(f"goal Bundle.open <= 5 ms: {'MET' if new['open_ms']['best'] <= 5 else 'NOT MET'} (wall) / "
          f"{'MET' if new['open_ms']['cpu'] <= 5 else 'NOT MET'} (CPU); install() <= 20 ms: "
          f"{'MET' if new['install_ms']['best'] <= 20 else 'NOT MET'} (wall) / "
          f"{'MET' if new['install_ms']['cpu'] <= 20 else 'NOT MET'} (CPU) (best of {args.repeat}, this box, load "
          f"{os.getloadavg()[0]:.1f})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(sides, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
