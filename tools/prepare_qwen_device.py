"""Prepare what the Qwen3.5 call-site check carries to the device machine (issue 24, must-show 2).

    python tools/prepare_qwen_device.py [--deployment builtin:qwen3.5-35b-a3b-fp8-h200.toml]
        [--no-wheels]

Run on the build box (vLLM 0.33.0 installed). Writes, into ignored folders (third-party code is never committed):
  .device-qwen/plan.json          `nojit build --deployment D --runtime triton --emit-plan --plan-only` (the CPU plan)
  .device-qwen/kernels/           map.json (`--kernel-sources`) and one shim per kernel module: it mounts the carried
                                  copy as the check does (qwen_call_site_steps.mount_qwen) and re-exports the module,
                                  so the device compiles vLLM's own kernel objects (FLA's kernels under
                                  @triton.heuristics lambdas do not extract with shared/tools/extract_triton.py)
  .device-qwen/device.plan.json   the plan restricted to the kernels the steps reach (every planned key of each),
                                  checked first on the box (`check_call_sites.py --dry-keys`: every key the steps
                                  reach is planned): the device builds the Triton bundle from it with its own Triton
                                  (`nojit build --from-plan --no-generic`)
  .device-qwen/facts.json         the deployment's shapes for the steps (qwen_call_site_steps.deployment_facts: the
                                  model room's own functions)
  .device-qwen/vllm_src/vllm/...  the vLLM files the Qwen steps (check_call_sites.py --steps-module
                                  qwen_call_site_steps) and check_autotune.py import, verbatim, the MoE tile-config
                                  JSON vLLM's lookup reads for this deployment, and SOURCES.json (digests)
  .whl/                           the nojit wheel and what it needs there (tools/prepare_device.py's build_wheels)
and prints the size of what travels (the device tool's limit: 64 MiB with the tree).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKS = os.path.join(ROOT, "tests", "gpu", "checks")
DEFAULT = "builtin:qwen3.5-35b-a3b-fp8-h200.toml"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import prepare_device  # noqa: E402 - tools/prepare_device.py: the wheels, shared


def plan(deployment: str, out: str) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # the build log goes next to the (unwritten) bundle: not carried
        subprocess.run([sys.executable, "-m", "nojit.aot.cli", "build", "--deployment", deployment, "--runtime",
                        "triton", "--emit-plan", out, "--plan-only", "--quiet", "-o", os.path.join(tmp, "x.nojit")],
                       check=True, cwd=ROOT)


def facts(deployment: str) -> dict:
    """In a process of its own: the deployment rules install the deployment's platform for the process."""
    code = (f"import json, sys; sys.path.insert(0, {CHECKS!r}); import qwen_call_site_steps as q; "
            f"print(json.dumps(q.deployment_facts({deployment!r})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(p.stdout.strip().splitlines()[-1])


def kernel_modules(site: str, kernels: list[str]) -> dict:
    """qwen_call_site_steps.kernel_modules in a fresh process (the mount needs one without vLLM imported)."""
    code = (f"import json, sys; sys.path.insert(0, {CHECKS!r}); import qwen_call_site_steps as q; "
            f"print(json.dumps(q.kernel_modules({site!r}, {kernels!r})))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"importing the kernel modules from the mounted copy failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


SHIM = """# Made by tools/prepare_qwen_device.py: vLLM's own module {module}, from the carried copy (.device-qwen/vllm_src)
import importlib, os, sys
_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(_root, "tests", "gpu", "checks"))
import qwen_call_site_steps
qwen_call_site_steps.mount_qwen(os.path.join(_root, ".device-qwen", "vllm_src"))
globals().update({{k: v for k, v in vars(importlib.import_module({module!r})).items() if not k.startswith("__")}})
"""


def write_shims(full: dict, kernels: list[str], out_dir: str, device_plan: str,
                keep_only: list[str] | None = None) -> None:
    """One shim per kernel module, map.json, and the plan restricted to those kernels (and to keep_only)."""
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    mapping = {}
    for kid in kernels:
        module, _, qualname = kid.partition(":")
        name = module.replace(".", "_") + ".py"
        with open(os.path.join(out_dir, name), "w") as fh:
            fh.write(SHIM.format(module=module))
        mapping[kid] = {"file": name, "qualname": qualname}
    with open(os.path.join(out_dir, "map.json"), "w") as fh:
        json.dump(mapping, fh, indent=1, sort_keys=True)
    keep = set(kernels) & set(keep_only if keep_only is not None else kernels)
    restricted = dict(full, kernels={k: v for k, v in full["kernels"].items() if k in keep},
                      requests=[r for r in full["requests"] if r["kernel"] in keep])
    with open(device_plan, "w") as fh:
        json.dump(restricted, fh, sort_keys=True)


def listed(args: list[str], site: str) -> list[str]:
    """The vLLM files (relative to vllm/) a check imports, asked of the check itself (--list-sources)."""
    p = subprocess.run([sys.executable, *args, "--list-sources", "--vllm-src", site], capture_output=True, text=True,
                       cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"{' '.join(args)} --list-sources failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["files"]


def size(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deployment", default=DEFAULT)
    ap.add_argument("--no-wheels", action="store_true", help="keep .whl as it is")
    args = ap.parse_args()
    import vllm

    pkg = os.path.dirname(os.path.abspath(vllm.__file__))
    site = os.path.dirname(pkg)
    out = os.path.join(ROOT, ".device-qwen")
    os.makedirs(out, exist_ok=True)
    plan(args.deployment, os.path.join(out, "plan.json"))
    with open(os.path.join(out, "plan.json")) as fh:
        full = json.load(fh)
    triton = sorted(k for k, v in full["kernels"].items() if v["runtime"] == "triton")
    found = kernel_modules(site, triton)
    write_shims(full, found["ok"], os.path.join(out, "kernels"), os.path.join(out, "device.plan.json"))
    n, skipped = len(found["ok"]), [f"{k}: {why}" for k, why in found["failed"].items()]
    f = facts(args.deployment)
    with open(os.path.join(out, "facts.json"), "w") as fh:
        json.dump(f, fh, indent=1, sort_keys=True)
    files = found["files"]
    files += listed([os.path.join(CHECKS, "check_call_sites.py"), "--steps-module", "qwen_call_site_steps"], site)
    files += listed([os.path.join(CHECKS, "check_autotune.py")], site)
    if f["moe"]:
        config = os.path.join("model_executor", "layers", "fused_moe", "configs", f["moe"]["config_file"])
        if not os.path.isfile(os.path.join(pkg, config)):
            raise SystemExit(f"vLLM {vllm.__version__} has no tile config {config}: the steps would take the default")
        files.append(config)
    m = prepare_device.copy_vllm_sources(files, os.path.join(out, "vllm_src"))
    # the box's pre-check: every key the steps reach is in the device plan (else the GPU run would fail on it)
    reached_json = os.path.join(out, "dry_keys.json")
    dry = subprocess.run([sys.executable, os.path.join(CHECKS, "check_call_sites.py"), "--dry-keys", "--steps-module",
                          "qwen_call_site_steps", "--vllm-src", os.path.join(out, "vllm_src"),
                          "--plan", os.path.join(out, "device.plan.json"), "--json", reached_json],
                         capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "NOJIT_QWEN_FACTS": os.path.join(out, "facts.json")})
    print("\n".join(line for line in dry.stdout.splitlines() if line.startswith(("  ", "DRY"))) or dry.stderr[-3000:])
    if dry.returncode:
        raise SystemExit("the steps reach keys the plan lacks (above): fix the model room's rows first")
    with open(reached_json) as fh:
        reached = sorted(json.load(fh))
    # the device compiles the kernels the steps reach, every planned key of each (one device command: 10 minutes)
    write_shims(full, found["ok"], os.path.join(out, "kernels"), os.path.join(out, "device.plan.json"), reached)
    print(f"device plan: the {len(reached)} kernels the steps reach, with all their planned keys")
    if not args.no_wheels:
        prepare_device.build_wheels(os.path.join(ROOT, ".whl"))
    print(f"{n} Triton kernels shimmed in .device-qwen/kernels (device.plan.json); {m} vLLM files in "
          f".device-qwen/vllm_src; facts for {f['deployment']}")
    for line in skipped:
        print(f"  not importable from the copy, left out of the device plan: {line}")
    sizes = {p: size(os.path.join(ROOT, p)) for p in (".device-qwen", ".whl")}
    tracked = int(subprocess.run(["git", "ls-files", "-z"], capture_output=True, cwd=ROOT, check=True).stdout.count(b"\0"))
    for p, b in sizes.items():
        print(f"  {p}: {b / 2**20:.1f} MiB")
    print(f"carried: {sum(sizes.values()) / 2**20:.1f} MiB (+ the tree's {tracked} tracked files; limit 64 MiB in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
