"""Make the two payloads of device step `gdn-fi` (ignored, never committed): FlashInfer's own Python launching the
bundle's GDN prefill through nojit's loader (tests/gpu/checks/check_gdn_flashinfer.py).

FlashInfer's kernel modules import nvidia-cutlass-dsl, whose MLIR library (`_cutlass_ir.cu13...so`, 193 MB;
`cute.runtime.load_module`, the loader nojit answers FlashInfer's cache with, JIT-links the bundled objects with
it) does not fit in one device call (64 MiB) with the rest. So the step takes two calls on one warm machine:

  .device-gdnfi-ir/  (call 1) the MLIR library of the cp312 cu13 wheel, xz -9e, and manifest.json; call 1 only
                     unpacks it there and checks its sha256 (`check_gdn_flashinfer.py --stage`)
  .device-gdnfi/     (call 2) everything else, verbatim: gdn.nojit (the bundle), wheels/ (apache-tvm-ffi cp312),
                     runtime/libcute_dsl_runtime.so.xz (CuTeDSL's C runtime, which load_module loads for the
                     objects' CUDA calls), cutlass_site.tar.xz (the rest of the four nvidia-cutlass-dsl cp312 wheels:
                     its Python, dist-info, small libraries), flashinfer_py.tar.xz (FlashInfer's Python without data/,
                     tools/prepare_flashinfer_device.py), vllm_src/ (the vLLM files the mount loads to import
                     qwen_gdn_linear_attn, whose fi_chunk_gated_delta_rule the check calls) and manifest.json
                     (versions, sha256, and the MLIR library's digest, so call 2 refuses a stage of another payload)

The cp312 wheels are read from --cutlass-wheels (downloaded there with `pip download` if absent); the bundle's
objects must have been exported with the same nvidia-cutlass-dsl version (prepare_cutedsl_device.carry_objects).

    nojit build --deployment aot/data/qwen3.5-35b-a3b-fp8-h200.toml --runtime flashinfer_cute -o .device/gdn.nojit
    python tools/prepare_gdnfi_device.py [--bundle .device/gdn.nojit] [--cutlass-wheels DIR] [--ir-xz FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_cutedsl_device import RUNTIME_LIB, carry_objects, folder_size  # noqa: E402
from prepare_device import copy_vllm_sources  # noqa: E402

from nojit.loader.bundle.installed import file_sha256  # noqa: E402  (as the sibling prepare tools)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "tests", "gpu", "checks", "check_gdn_flashinfer.py")
RUNTIME = "flashinfer_cute"
IR = "_cutlass_ir.cu13.cpython-312-x86_64-linux-gnu.so"
IR_PATH = f"nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/{IR}"
RUNTIME_PATH = f"nvidia_cutlass_dsl/cu13/lib/{RUNTIME_LIB}"
WHEELS = ("nvidia_cutlass_dsl", "nvidia_cutlass_dsl_libs_base", "nvidia_cutlass_dsl_libs_core",
          "nvidia_cutlass_dsl_libs_cu13")
CALL_LIMIT = 60 << 20  # each payload with the tracked files (about 3 MiB) and, in call 2, .whl, under the 64 MiB


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def find_wheels(directory: str, version: str, download: bool = True) -> dict[str, str]:
    """The four nvidia-cutlass-dsl wheels of `version` for CPython 3.12 (cp312 or py3), by distribution."""
    def scan() -> dict[str, str]:
        found = {}
        for name in sorted(os.listdir(directory)) if os.path.isdir(directory) else []:
            dist, _, rest = name.partition(f"-{version}-")
            if dist in WHEELS and name.endswith(".whl") and ("cp312" in rest or "py3-none" in rest):
                found[dist] = os.path.join(directory, name)
        return found

    found = scan()
    missing = [w for w in WHEELS if w not in found]
    if missing and download:
        os.makedirs(directory, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--implementation", "cp", "--platform", "manylinux_2_28_x86_64",
                        "-d", directory, *(f"{w.replace('_', '-')}=={version}" for w in missing)], check=True)
        found = scan()
        missing = [w for w in WHEELS if w not in found]
    if missing:
        raise SystemExit(f"no cp312 wheel of {', '.join(missing)} {version} in {directory}")
    return found


def pack_ir(cu13_wheel: str, out: str, ir_xz: str | None = None) -> dict:
    """Payload A: the MLIR library as .xz (`xz -9e`; or the given .xz, checked to unpack to the wheel's bytes)."""
    with zipfile.ZipFile(cu13_wheel) as z:
        raw = z.read(IR_PATH)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, IR + ".xz")
    if ir_xz:
        with open(ir_xz, "rb") as f:
            packed = f.read()
        if sha256_bytes(lzma.decompress(packed)) != sha256_bytes(raw):
            raise SystemExit(f"{ir_xz} does not unpack to {IR} of {cu13_wheel}")
    else:
        packed = lzma.compress(raw, preset=9 | lzma.PRESET_EXTREME)
    with open(path + ".part", "wb") as f:
        f.write(packed)
    os.replace(path + ".part", path)
    ir = {"name": IR, "file": os.path.basename(path), "sha256": sha256_bytes(raw), "size": len(raw),
          "xz_sha256": sha256_bytes(packed), "xz_size": len(packed), "wheel": os.path.basename(cu13_wheel)}
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump({"ir": ir}, f, indent=1, sort_keys=True)
    return ir


def pack_cutlass_site(wheels: dict[str, str], out: str) -> dict:
    """The four wheels' files, as pip would lay them out in a target folder, less the MLIR library (payload A) and
    the C runtime (runtime/, carried as carry_objects packs it); reproducible (sorted, no owners, fixed times)."""
    path = os.path.join(out, "cutlass_site.tar.xz")
    names, runtime_sha = [], None
    with tarfile.open(path + ".part", "w:xz", preset=9) as tar:
        for dist in WHEELS:
            with zipfile.ZipFile(wheels[dist]) as z:
                for info in sorted(z.infolist(), key=lambda i: i.filename):
                    if info.is_dir() or info.filename == IR_PATH:
                        continue
                    data = z.read(info)
                    if info.filename == RUNTIME_PATH:
                        runtime_sha = sha256_bytes(data)
                        continue
                    t = tarfile.TarInfo(info.filename)
                    t.size, t.mtime = len(data), 0
                    t.mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
                    tar.addfile(t, io.BytesIO(data))
                    names.append(info.filename)
    os.replace(path + ".part", path)
    return {"archive": os.path.basename(path), "sha256": file_sha256(path), "bytes": os.path.getsize(path),
            "files": len(names), "wheels": sorted(os.path.basename(w) for w in wheels.values()),
            "runtime_sha256_in_wheel": runtime_sha}


def vllm_files() -> list[str]:
    """The vLLM files the check's mount loads to import the GDN layer module (asked of the check itself)."""
    import importlib.util

    site = os.path.dirname(os.path.dirname(importlib.util.find_spec("vllm").origin))
    p = subprocess.run([sys.executable, CHECK, "--list-sources", "--vllm-src", site], capture_output=True, text=True,
                       check=False, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    if p.returncode != 0:
        raise SystemExit(f"{CHECK} --list-sources failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])["files"]


def prepare(bundle: str, out_ir: str, out: str, wheel_dir: str, ir_xz: str | None = None, tvm_wheel: bool = True,
            download: bool = True, vllm: bool = True) -> dict:
    """Write both payloads; returns call 2's manifest. tvm_wheel/download/vllm=False: the CPU tests (no network)."""
    from prepare_flashinfer_device import pack_flashinfer

    shutil.rmtree(out, ignore_errors=True)
    manifest = carry_objects(bundle, out, RUNTIME, "gdn.nojit", tvm_wheel)
    version = manifest["tools"]["nvidia-cutlass-dsl"]
    wheels = find_wheels(wheel_dir, version, download)
    shutil.rmtree(out_ir, ignore_errors=True)
    manifest["ir"] = pack_ir(wheels["nvidia_cutlass_dsl_libs_cu13"], out_ir, ir_xz)
    manifest["cutlass_site"] = pack_cutlass_site(wheels, out)
    if manifest["cutlass_site"]["runtime_sha256_in_wheel"] != manifest["runtime"]["sha256"]:
        raise SystemExit(f"{RUNTIME_LIB} of this box's nvidia-cutlass-dsl differs from the cp312 wheel's")
    manifest["flashinfer"] = pack_flashinfer(out)
    manifest["vllm_sources"] = copy_vllm_sources(vllm_files(), os.path.join(out, "vllm_src")) if vllm else 0
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def tracked_bytes() -> int:
    """What travels with every call besides the carried folders (git's tracked files)."""
    p = subprocess.run(["git", "-C", ROOT, "ls-files", "-z"], capture_output=True, check=False)
    names = [n for n in p.stdout.decode().split("\0") if n]
    return sum(os.path.getsize(os.path.join(ROOT, n)) for n in names if os.path.isfile(os.path.join(ROOT, n)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=os.path.join(ROOT, ".device", "gdn.nojit"))
    ap.add_argument("--out", default=os.path.join(ROOT, ".device-gdnfi"))
    ap.add_argument("--out-ir", default=os.path.join(ROOT, ".device-gdnfi-ir"))
    ap.add_argument("--cutlass-wheels", default=os.path.join(ROOT, ".device-gdnfi-wheels"),
                    help="the cp312 nvidia-cutlass-dsl wheels (downloaded here if absent)")
    ap.add_argument("--ir-xz", help=f"an xz of {IR} made earlier (checked against the wheel), instead of xz -9e here")
    ap.add_argument("--whl", default=os.path.join(ROOT, ".whl"), help="the nojit wheels call 2 also carries")
    args = ap.parse_args()
    if not os.path.isfile(args.bundle):
        print(f"no bundle {args.bundle}: build it with `nojit build --deployment aot/data/qwen3.5-35b-a3b-fp8-h200.toml "
              f"--runtime flashinfer_cute -o {args.bundle}`", file=sys.stderr)
        return 2
    m = prepare(args.bundle, args.out_ir, args.out, args.cutlass_wheels, args.ir_xz)
    tracked = tracked_bytes()
    one = folder_size(args.out_ir) + tracked
    two = folder_size(args.out) + folder_size(args.whl) + tracked
    mib = 1 / 2**20
    print(f"{args.out_ir}: {IR} {m['ir']['size'] * mib:.1f} MiB -> {m['ir']['xz_size'] * mib:.1f} MiB xz")
    print(f"{args.out}: {len(m['bundle']['entries'])} {RUNTIME} entries, cutlass site "
          f"{m['cutlass_site']['bytes'] * mib:.1f} MiB, {RUNTIME_LIB} {m['runtime']['xz_size'] * mib:.1f} MiB xz, "
          f"FlashInfer {m['flashinfer']['bytes'] * mib:.1f} MiB, {m['vllm_sources']} vLLM files; "
          f"{folder_size(args.out) * mib:.1f} MiB")
    print(f"call 1 carries {one * mib:.1f} MiB (.device-gdnfi-ir + {tracked * mib:.1f} MiB tracked); call 2 carries "
          f"{two * mib:.1f} MiB (.device-gdnfi + .whl + tracked); limit 64 MiB")
    if not os.path.isdir(args.whl):
        print(f"no {args.whl} here: call 2 also carries the session checkout's .whl (its size adds to call 2)")
    over = [n for n, s in (("call 1", one), ("call 2", two)) if s > CALL_LIMIT]
    if over:
        print(f"{', '.join(over)} over {CALL_LIMIT >> 20} MiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
