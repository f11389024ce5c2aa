"""Make `.device-fi/` (ignored, never committed): what tests/gpu/checks/check_flashinfer_launch.py needs on the device.

The device has Python 3.12 and torch 2.11 (no vLLM, no FlashInfer, no apache-tvm-ffi). FlashInfer's built modules
are TVM-FFI modules that link no torch (NEEDED: libcudart.so.13, libnvrtc.so.13, libcuda.so.1, libstdc++), so
FlashInfer's own Python can run there: its entry points (flashinfer.sampling, flashinfer.gemm), its AOT lookup
(jit/env.py) and its loader (jit/core.py `JitSpec.try_load` -> tvm_ffi.load_module), with nojit's loader seeding
the modules from the bundle as a server does. This carries:
  * flashinfer_py.tar.xz: the installed flashinfer-python package's .py and .json files and its dist-info METADATA,
    verbatim, without `data/` (csrc, cutlass, cccl: only FlashInfer's compiler reads them; 520 MB);
  * wheels/: the cp312 wheel of apache-tvm-ffi at the installed version (FlashInfer's loader), downloaded with
    `pip download --only-binary=:all: --python-version 3.12 --no-deps`;
  * flashinfer.nojit: the bundle (its FlashInfer entries: the four modules and TensorRT-LLM DeepGEMM's cubins);
  * libnojit_exec_guard.so: tests/gpu/checks/exec_guard.c built here (the device step builds it there with its cc and
    falls back to this one);
  * prepare.json: versions and sha256 of what is here.
FlashInfer's other imports (torch, numpy, requests, tqdm, einops, packaging, nvidia-ml-py, cuda-bindings, ...) are
in the device image; the optional ones it probes (nvidia-cutlass-dsl, cuda-tile, cudnn frontend, nccl4py) are not,
and FlashInfer imports without them.

    python tools/prepare_flashinfer_device.py --bundle .device/flashinfer.nojit [--out .device-fi]
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile

from nojit.loader.bundle.installed import file_sha256

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

LIMIT = 45 << 20  # carried with .whl (7.5 MiB) under the 64 MiB a device call takes
PY_FILES = (".py", ".json")  # FlashInfer's Python and the JSON tables it reads at import
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_28_x86_64")



def flashinfer_files(site: str) -> list[str]:
    """Paths (relative to site-packages) of FlashInfer's Python: every .py/.json under flashinfer/ but data/ and
    caches, plus the dist-info METADATA (its version is what nojit's loader compares with the bundle's)."""
    version = importlib.metadata.version("flashinfer-python")
    found = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(site, "flashinfer")):
        rel = os.path.relpath(dirpath, site)
        if rel == os.path.join("flashinfer", "data"):
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        found += [os.path.join(rel, n) for n in sorted(filenames) if n.endswith(PY_FILES)]
    meta = os.path.join(f"flashinfer_python-{version}.dist-info", "METADATA")
    if not os.path.isfile(os.path.join(site, meta)):
        raise SystemExit(f"{site} has no {meta}: install flashinfer-python {version} with pip")
    return [*found, meta]


def pack_flashinfer(out: str) -> dict:
    """flashinfer_py.tar.xz, reproducible (sorted, no owners, fixed times)."""
    import flashinfer

    site = os.path.dirname(os.path.dirname(os.path.abspath(flashinfer.__file__)))
    files = flashinfer_files(site)
    path = os.path.join(out, "flashinfer_py.tar.xz")
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        for rel in files:
            with open(os.path.join(site, rel), "rb") as f:
                data = f.read()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, path)
    return {"version": importlib.metadata.version("flashinfer-python"), "files": len(files),
            "archive": os.path.basename(path), "bytes": os.path.getsize(path), "sha256": file_sha256(path)}


def download_tvm_ffi(dest: str, given: str | None) -> str:
    """The apache-tvm-ffi cp312 wheel at the installed version (FlashInfer requires >=0.1.11,<0.2)."""
    os.makedirs(dest, exist_ok=True)
    version = importlib.metadata.version("apache-tvm-ffi")
    keep = os.path.abspath(given) if given else None
    for old in glob.glob(os.path.join(dest, "apache_tvm_ffi-*.whl")):
        if os.path.abspath(old) != keep:
            os.remove(old)
    if given and os.path.dirname(keep) != os.path.abspath(dest):
        shutil.copy2(given, dest)
    else:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
               "--implementation", "cp", "--no-deps", "-d", dest]
        for p in PLATFORMS:
            cmd += ["--platform", p]
        subprocess.run([*cmd, f"apache-tvm-ffi=={version}"], check=True)
    wheels = glob.glob(os.path.join(dest, "apache_tvm_ffi-*.whl"))
    if len(wheels) != 1:
        raise SystemExit(f"expected one apache-tvm-ffi wheel in {dest}, found {wheels}")
    return wheels[0]


def check_bundle(path: str) -> dict:
    """The bundle's FlashInfer entries: built by the installed FlashInfer, modules and cubins named."""
    from nojit.loader.bundle.file import Bundle

    bundle = Bundle.open(path)
    m = bundle.manifest
    entries = [e for e in m.entries if m.kernels[e.kernel].runtime == "flashinfer"]
    if not entries:
        raise SystemExit(f"{path} holds no FlashInfer entries: build it with `nojit build --runtime flashinfer`")
    versions = {m.kernels[e.kernel].info.get("flashinfer_version") for e in entries}
    here = importlib.metadata.version("flashinfer-python")
    if versions != {here}:
        raise SystemExit(f"{path} was built by FlashInfer {sorted(map(str, versions))}, this box has {here}")
    return {"modules": sorted(e.launch.module for e in entries if e.launch.kind == "module"),
            "trtllm_deepgemm": sorted(e.launch.module for e in entries if e.launch.kind == "trtllm_deepgemm")}


def build_guard(out: str) -> str | None:
    """The process guard (tests/gpu/checks/exec_guard.c) as a shared object; None where this box has no C compiler."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None
    path = os.path.join(out, "libnojit_exec_guard.so")
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", path, os.path.join(ROOT, "tests", "gpu", "checks", "exec_guard.c"),
                    "-ldl"], check=True)
    return path


def prepare(bundle: str, out: str, tvm_ffi_wheel: str | None = None) -> dict:
    os.makedirs(out, exist_ok=True)
    entries = check_bundle(bundle)
    dst = os.path.join(out, "flashinfer.nojit")
    if os.path.abspath(bundle) != os.path.abspath(dst):
        shutil.copyfile(bundle, dst)
    wheel = download_tvm_ffi(os.path.join(out, "wheels"), tvm_ffi_wheel)
    facts = {
        "flashinfer": pack_flashinfer(out),
        "tvm_ffi_wheel": {"file": os.path.relpath(wheel, out), "sha256": file_sha256(wheel)},
        "bundle": {"file": "flashinfer.nojit", "sha256": file_sha256(dst), **entries},
        "guard": build_guard(out) is not None,
    }
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    facts["bytes"] = total
    with open(os.path.join(out, "prepare.json"), "w") as f:
        json.dump(facts, f, indent=1, sort_keys=True)
    if total > LIMIT:
        raise SystemExit(f"{out} is {total / 2**20:.1f} MiB, over the {LIMIT >> 20} MiB it may take on the device")
    return facts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bundle", default=".device/flashinfer.nojit")
    ap.add_argument("--out", default=".device-fi")
    ap.add_argument("--tvm-ffi-wheel", help="use this apache-tvm-ffi cp312 wheel instead of downloading it")
    opts = ap.parse_args()
    facts = prepare(opts.bundle, opts.out, opts.tvm_ffi_wheel)
    print(json.dumps(facts, indent=1, sort_keys=True))
    print(f"{opts.out}: {facts['bytes'] / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
