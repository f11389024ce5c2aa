"""Prepare what the GPU check carries to the device machine (which has no vLLM and no registry).

    python tools/prepare_device.py [--plan .device/plan.json] [--extractor ../shared/tools/extract_triton.py]
                                   [--tilelang-bundle out/tl.nojit]

Writes, into ignored folders (third-party code is never committed):
  .device/kernels/*.py + map.json  every Triton kernel of the plan, extracted from the installed
                                   vLLM with shared/tools/extract_triton.py (vLLM's source, verbatim)
  .device/vllm_mhc/                vLLM's mHC torch reference (kernels/mhc/torch.py), for TileLang checks
  .device/vllm_src/vllm/...        the few vLLM files tests/gpu/checks/check_tilelang.py imports there, verbatim,
                                   at their package paths (VLLM_TILELANG_FILES), plus SOURCES.json
  .device/vllm_src/vllm/...        also the vLLM files tests/gpu/checks/check_call_sites.py imports (its call sites and
                                   their import closure, listed by `check_call_sites.py --list-sources`), verbatim,
                                   and those tests/gpu/checks/check_autotune.py imports (FLA's autotuned ops), likewise
  .device/tilelang.nojit           with --tilelang-bundle: the TileLang bundle to check (built here,
                                   where TileLang is installed)
  .whl/                            the nojit wheel (abi3) and the cp312 wheels it needs there
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WHEEL_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def extract_kernels(plan_path: str, extractor: str, out_dir: str) -> tuple[int, list[str]]:
    """Extract every Triton kernel of the plan; write map.json and device.plan.json (the plan
    restricted to the kernels that extracted). Returns (extracted count, kernels skipped with why)."""
    import vllm

    site = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    with open(plan_path) as f:
        plan = json.load(f)
    os.makedirs(out_dir, exist_ok=True)
    mapping, skipped = {}, []
    for kid, k in sorted(plan["kernels"].items()):
        if k["runtime"] != "triton":
            continue
        qualname = kid.partition(":")[2]
        src = os.path.join(site, k["info"]["file"])  # relative to the directory holding vllm/
        name = kid.replace(":", "__").replace(".", "_")
        target = os.path.join(out_dir, f"{name}.py")
        p = subprocess.run([sys.executable, extractor, src, qualname, "-o", target, "--root", site],
                           capture_output=True, text=True)
        if p.returncode != 0 and "HAS_TRITON" in p.stderr:
            # A helper module picks constants by `HAS_TRITON` (computed with importlib.util.find_spec,
            # which the extractor cannot follow): extract from a copy of vLLM's sources where it is the
            # literal True, as it is on the device. The kernel sources themselves are unchanged.
            resolved = _sources_with_triton_resolved(site)
            p = subprocess.run([sys.executable, extractor, os.path.join(resolved, k["info"]["file"]), qualname,
                                "-o", target, "--root", resolved], capture_output=True, text=True)
        if p.returncode != 0:
            skipped.append(f"{kid}: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else 'failed'}")
            continue
        mapping[kid] = {"file": f"{name}.py", "qualname": qualname}
    with open(os.path.join(out_dir, "map.json"), "w") as f:
        json.dump(mapping, f, indent=1, sort_keys=True)
    device_plan = dict(plan)
    device_plan["kernels"] = {k: v for k, v in plan["kernels"].items() if k in mapping}
    device_plan["requests"] = [r for r in plan["requests"] if r["kernel"] in mapping]
    with open(os.path.join(os.path.dirname(out_dir), "device.plan.json"), "w") as f:
        json.dump(device_plan, f, sort_keys=True)
    return len(mapping), skipped


_resolved_root: str | None = None


def _sources_with_triton_resolved(site: str) -> str:
    """A temporary copy of vLLM's .py files with vllm/triton_utils/importing.py reduced to HAS_TRITON = True."""
    global _resolved_root
    if _resolved_root is None:
        import atexit
        import tempfile

        _resolved_root = tempfile.mkdtemp(prefix="nojit-vllm-src-")
        atexit.register(shutil.rmtree, _resolved_root, True)
        shutil.copytree(os.path.join(site, "vllm"), os.path.join(_resolved_root, "vllm"),
                        ignore=_all_but_python_sources)
        with open(os.path.join(_resolved_root, "vllm", "triton_utils", "importing.py"), "w") as f:
            f.write("HAS_TRITON = True\n")
    return _resolved_root


def _all_but_python_sources(directory: str, names: list[str]) -> list[str]:
    """copytree's ignore: every file but .py ones, and __pycache__ (folders are walked)."""
    return [n for n in names
            if n == "__pycache__" or (not n.endswith(".py") and not os.path.isdir(os.path.join(directory, n)))]


def copy_mhc_reference(out_dir: str) -> None:
    import vllm

    src = os.path.join(os.path.dirname(vllm.__file__), "model_executor", "kernels", "mhc", "torch.py")
    os.makedirs(out_dir, exist_ok=True)
    shutil.copy(src, os.path.join(out_dir, "mhc_torch_reference.py"))


# What tests/gpu/checks/check_tilelang.py imports from vLLM on a device without vLLM. The kernel module must
# be byte-identical (nojit compares its kernels' source digest with the bundle's); the rest is its
# import closure with only torch installed: jit_warmup.py imports the standard library only, the
# TileLang helper torch + jit_warmup, math_utils the standard library. vllm.platforms (the one heavy
# import) and vllm.tilelang_utils (nojit's own) are provided in-process by the check, and no package
# __init__.py is copied: those would pull in the rest of vLLM.
VLLM_TILELANG_FILES = (
    "model_executor/kernels/mhc/tilelang_kernels.py",
    "model_executor/kernels/mhc/torch.py",
    "model_executor/warmup/jit_warmup.py",
    "model_executor/warmup/jit_warmup_tilelang_helper.py",
    "utils/math_utils.py",
)


def copy_vllm_sources(files: list[str], out_dir: str) -> int:
    """Copy `files` (relative to vllm/) from the installed vLLM to out_dir/vllm/..., with their digests in
    out_dir/SOURCES.json (verbatim copies for the device, in an ignored folder)."""
    import vllm

    pkg = os.path.dirname(os.path.abspath(vllm.__file__))
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    digests = {}
    for rel in sorted(set(files)):
        target = os.path.join(out_dir, "vllm", rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(pkg, rel), target)
        with open(target, "rb") as f:
            digests[rel] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out_dir, "SOURCES.json"), "w") as f:
        json.dump({"vllm": vllm.__version__, "files": digests}, f, indent=1, sort_keys=True)
    return len(digests)


def copy_vllm_tilelang_sources(out_dir: str) -> int:
    """Copy VLLM_TILELANG_FILES from the installed vLLM to out_dir/vllm/..., with their digests."""
    return copy_vllm_sources(list(VLLM_TILELANG_FILES), out_dir)


def copy_vllm_call_site_sources(out_dir: str, check: str = "check_call_sites.py") -> int:
    """Copy the vLLM files a GPU check imports (asked of the check itself: check_call_sites.py, check_autotune.py)
    into out_dir/vllm/..., adding their digests to SOURCES.json."""
    import vllm

    pkg = os.path.dirname(os.path.abspath(vllm.__file__))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "gpu", "checks", check), "--list-sources",
                        "--vllm-src", os.path.dirname(pkg)], capture_output=True, text=True, check=True)
    files = json.loads(p.stdout.strip().splitlines()[-1])["files"]
    with open(os.path.join(out_dir, "SOURCES.json")) as f:
        sources = json.load(f)
    for rel in files:
        target = os.path.join(out_dir, "vllm", rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(pkg, rel), target)
        with open(target, "rb") as f:
            sources["files"][rel] = hashlib.sha256(f.read()).hexdigest()
    with open(os.path.join(out_dir, "SOURCES.json"), "w") as f:
        json.dump(sources, f, indent=1, sort_keys=True)
    return len(files)


def build_wheels(out_dir: str) -> None:
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(out_dir)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", ROOT, "--no-deps", "--no-build-isolation", "-q", "-w", out_dir], check=True)
    platforms = [a for p in WHEEL_PLATFORMS for a in ("--platform", p)]
    # cffi + zstandard: nojit's own needs; pytest and its needs: the GPU tests of the suite;
    # regex + psutil (+ packaging): what vLLM's call-site modules import (check_call_sites.py)
    for name in ("cffi", "pycparser", "zstandard", "pytest", "pluggy", "iniconfig", "packaging", "regex", "psutil"):
        subprocess.run([*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
                        "--implementation", "cp", *platforms, "-q", "-d", out_dir, name], check=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", help="a plan written by `nojit build --emit-plan` (without it: no Triton kernels)")
    ap.add_argument("--extractor", default=os.path.join(ROOT, "..", "shared", "tools", "extract_triton.py"))
    ap.add_argument("--tilelang-bundle", help="a TileLang bundle to carry as .device/tilelang.nojit")
    args = ap.parse_args()
    device = os.path.join(ROOT, ".device")
    n, skipped = extract_kernels(args.plan, args.extractor, os.path.join(device, "kernels")) if args.plan else (0, [])
    copy_mhc_reference(os.path.join(device, "vllm_mhc"))
    m = copy_vllm_tilelang_sources(os.path.join(device, "vllm_src"))
    m += copy_vllm_call_site_sources(os.path.join(device, "vllm_src"))
    m += copy_vllm_call_site_sources(os.path.join(device, "vllm_src"), "check_autotune.py")  # FLA's autotuned ops
    target = os.path.join(device, "tilelang.nojit")
    if args.tilelang_bundle and not (os.path.exists(target) and os.path.samefile(args.tilelang_bundle, target)):
        shutil.copyfile(args.tilelang_bundle, target)
    build_wheels(os.path.join(ROOT, ".whl"))
    print(f"extracted {n} Triton kernels into .device/kernels (plan for them: .device/device.plan.json); "
          f"{m} vLLM files in .device/vllm_src; wheels in .whl")
    for line in skipped:
        print(f"  not extractable, left out of the device plan: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
