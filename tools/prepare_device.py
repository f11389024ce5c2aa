"""Prepare what the GPU check carries to the device machine (which has no vLLM and no registry).

    python tools/prepare_device.py --plan .device/plan.json [--extractor ../shared/tools/extract_triton.py]

Writes, into ignored folders (third-party code is never committed):
  .device/kernels/*.py + map.json  every Triton kernel of the plan, extracted from the installed
                                   vLLM with shared/tools/extract_triton.py (vLLM's source, verbatim)
  .device/vllm_mhc/                vLLM's mHC torch reference (kernels/mhc/torch.py), for TileLang checks
  .whl/                            the nojit wheel (abi3) and the cp312 wheels it needs there
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def extract_kernels(plan_path: str, extractor: str, out_dir: str) -> int:
    import vllm

    site = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    with open(plan_path) as f:
        plan = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    mapping = {}
    for kid, k in sorted(plan["kernels"].items()):
        if k["runtime"] != "triton":
            continue
        qualname = kid.partition(":")[2]
        src = k["info"]["file"]
        name = kid.replace(":", "__").replace(".", "_")
        target = os.path.join(out_dir, f"{name}.py")
        subprocess.run([sys.executable, extractor, src, qualname, "-o", target, "--root", site], check=True)
        mapping[kid] = {"file": f"{name}.py", "qualname": qualname}
    with open(os.path.join(out_dir, "map.json"), "w") as f:
        json.dump(mapping, f, indent=1, sort_keys=True)
    return len(mapping)


def copy_mhc_reference(out_dir: str) -> None:
    import vllm

    src = os.path.join(os.path.dirname(vllm.__file__), "model_executor", "kernels", "mhc", "torch.py")
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(src, os.path.join(out_dir, "mhc_torch_reference.py"))


def build_wheels(out_dir: str) -> None:
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", ROOT, "--no-deps", "--no-build-isolation", "-q", "-w", out_dir], check=True)
    platforms = [a for p in WHEEL_PLATFORMS for a in ("--platform", p)]
    for name in ("cffi", "pycparser", "zstandard"):
        subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                        "--implementation", "cp", *platforms, "-q", "-d", out_dir, name], check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True, help="a plan written by `nojit build --emit-plan`")
    ap.add_argument("--extractor", default=os.path.join(ROOT, "..", "shared", "tools", "extract_triton.py"))
    args = ap.parse_args()
    n = extract_kernels(args.plan, args.extractor, os.path.join(ROOT, ".device", "kernels"))
    copy_mhc_reference(os.path.join(ROOT, ".device", "vllm_mhc"))
    build_wheels(os.path.join(ROOT, ".whl"))
    print(f"extracted {n} Triton kernels into .device/kernels; wheels in .whl")
    return 0


if __name__ == "__main__":
    sys.exit(main())
