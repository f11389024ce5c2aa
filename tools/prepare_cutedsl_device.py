"""Make `.device-cu/` (ignored, never committed): what tests/gpu/checks/check_cutedsl_launch.py needs on the device machine.

The device has Python 3.12, torch 2.11, triton 3.6 and g++, but no CuTeDSL and no vLLM. A CuTeDSL entry of the bundle
is the object file CuTeDSL's `export_to_c` wrote with `--enable-tvm-ffi`: host code that exports
`__tvm_ffi_<symbol>` plus the embedded sm_90a cubin. CuTeDSL documents two ways to run it: its own
`cute.runtime.load_module` (in-memory JITLink from its ~190 MB MLIR library, which cannot be carried), or linking the
object into a shared library against CuTeDSL's C runtime and TVM-FFI (`g++ -shared -o kernel.so kernel.o
$(python -m cutlass.cute.export.aot_config --ldflags) $(... --libs)`, nvidia-cutlass-dsl
cutlass/cute/export/aot_config.py; docs.nvidia.com/cutlass "Ahead-of-Time (AOT) Compilation" and "Compile with TVM FFI:
Exporting Compiled Module") and loading it with `tvm_ffi.load_module` (TVM-FFI "Export Functions and Classes: C
Symbols": a `__tvm_ffi_<name>` symbol in a shared library, looked up as module["<name>"]). The device check takes the
second way. This carries, verbatim:
  * wheels/: the apache-tvm-ffi wheel of the version the bundle names (cp312-abi3 manylinux), from `pip download`;
  * runtime/libcute_dsl_runtime.so.xz: CuTeDSL's C runtime of the installed nvidia-cutlass-dsl (cu13/lib, the
    directory `aot_config --ldflags` names), xz-compressed (43.6 MB -> ~14 MB);
  * cutedsl.nojit: the bundle whose CuTeDSL entries are launched (the check reads each object through nojit's
    reader, which checks its sha256 against the manifest);
  * vllm_src/vllm/...: the vLLM files of the non-CuTeDSL (Triton) paths of the same ops, the references of the
    check (asked of the check itself with --list-sources), with their sha256 in SOURCES.json;
  * manifest.json: versions, sizes and sha256 of all of the above, and the link flags CuTeDSL's aot_config gives.

    python tools/prepare_cutedsl_device.py [--bundle .device/cutedsl.nojit] [--out .device-cu]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import lzma
import os
import shutil
import subprocess
import sys

from nojit.loader.bundle.installed import file_sha256

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECK = os.path.join(ROOT, "tests", "gpu", "checks", "check_cutedsl_launch.py")
RUNTIME_LIB = "libcute_dsl_runtime.so"
PLATFORM = "manylinux_2_28_x86_64"



def cutedsl_libdir() -> str:
    """The directory CuTeDSL's own aot_config names for linking (`--ldflags` is `-L<dir>`)."""
    from cutlass.cute.export import aot_config

    libdir = aot_config.get_libdir()
    if not libdir or not os.path.isfile(os.path.join(libdir, RUNTIME_LIB)):
        raise SystemExit(f"CuTeDSL's aot_config names no {RUNTIME_LIB} (got {libdir!r}); install nvidia-cutlass-dsl")
    return libdir


def pack_runtime(dest: str) -> dict:
    """libcute_dsl_runtime.so as .xz, with the digests of both forms."""
    src = os.path.join(cutedsl_libdir(), RUNTIME_LIB)
    os.makedirs(dest, exist_ok=True)
    out = os.path.join(dest, RUNTIME_LIB + ".xz")
    with open(src, "rb") as f:
        raw = f.read()
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        f.write(lzma.compress(raw, preset=6))
    os.replace(tmp, out)
    return {"file": os.path.relpath(out, os.path.dirname(dest)), "sha256": hashlib.sha256(raw).hexdigest(),
            "size": len(raw), "xz_sha256": file_sha256(out), "xz_size": os.path.getsize(out), "source": src}


def download_tvm_ffi(dest: str, version: str) -> dict:
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", "--platform", PLATFORM,
                    "-d", dest, f"apache-tvm-ffi=={version}"], check=True)
    wheels = [w for w in os.listdir(dest) if w.endswith(".whl")]
    if len(wheels) != 1:
        raise SystemExit(f"pip download gave {wheels} for apache-tvm-ffi=={version}")
    path = os.path.join(dest, wheels[0])
    return {"file": os.path.join("wheels", wheels[0]), "sha256": file_sha256(path), "size": os.path.getsize(path),
            "version": version}


def copy_reference_sources(out_dir: str) -> dict[str, str]:
    """The vLLM files the check's references import (asked of the check, which mounts them), copied verbatim."""
    import importlib.util

    pkg = os.path.dirname(importlib.util.find_spec("vllm").origin)  # not imported: the mount needs a fresh process
    p = subprocess.run([sys.executable, CHECK, "--list-sources", "--vllm-src", os.path.dirname(pkg)],
                       check=False, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{CHECK} --list-sources failed:\n{p.stderr[-3000:]}")
    files = json.loads(p.stdout.strip().splitlines()[-1])["files"]
    shutil.rmtree(out_dir, ignore_errors=True)
    digests = {}
    for rel in sorted(set(files)):
        target = os.path.join(out_dir, "vllm", rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(os.path.join(pkg, rel), target)
        digests[rel] = file_sha256(target)
    sys.path.insert(0, os.path.join(ROOT, "tests", "gpu", "checks"))
    import vllm_mount

    for name in vllm_mount.EMPTY_PACKAGES | vllm_mount.STUB_PACKAGES:  # made empty or stand-ins by the mount, which
        if os.path.isdir(os.path.join(pkg, *name.split(".")[1:])):  # looks for their directories
            os.makedirs(os.path.join(out_dir, "vllm", *name.split(".")[1:]), exist_ok=True)
    with open(os.path.join(out_dir, "SOURCES.json"), "w") as f:
        json.dump({"vllm": importlib.metadata.version("vllm"), "files": digests}, f, indent=1, sort_keys=True)
    return digests


def bundle_entries(bundle_path: str, runtime: str = "cutedsl") -> tuple[list[dict], dict[str, str]]:
    """The entries of `runtime` (kernel, symbol, blob digest, key) and the tool versions their kernels were built with."""
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(bundle_path)
    rows, tools = [], {}
    for e in b.manifest.entries:
        record = b.manifest.kernels[e.kernel]
        if record.runtime != runtime:
            continue
        b.read_blob(e.blob)  # sha256-checked here too: a damaged bundle is not carried
        rows.append({"kernel": e.kernel, "symbol": e.launch.symbol, "blob": e.blob, "key": e.key,
                     "options": e.launch.options})
        for tool in ("nvidia-cutlass-dsl", "apache-tvm-ffi"):
            tools.setdefault(tool, record.info.get(tool))
    if not rows:
        raise SystemExit(f"{bundle_path} holds no CuTeDSL entries (build it with `nojit build --runtime cutedsl`)")
    return rows, tools


def carry_objects(bundle: str, out: str, runtime: str, name: str, wheel: bool) -> dict:
    """What every device check of CuTeDSL objects carries, written into `out`: the bundle (as `name`), the tvm-ffi
    wheel (unless wheel=False: the CPU tests, no network) and CuTeDSL's C runtime; returns the manifest's common part.
    Refuses a box whose CuTeDSL tools differ from the ones `runtime`'s objects were exported with."""
    entries, tools = bundle_entries(bundle, runtime)
    installed = {t: importlib.metadata.version(t) for t in tools}
    if installed != tools:
        raise SystemExit(f"the bundle's objects were exported with {tools}, this box has {installed}: the carried "
                         "runtime and TVM-FFI would not be the ones the objects were written for")
    os.makedirs(out, exist_ok=True)
    manifest = {
        "bundle": {"file": name, "sha256": file_sha256(bundle), "entries": entries},
        "tools": tools,
        "tvm_ffi_wheel": download_tvm_ffi(os.path.join(out, "wheels"), tools["apache-tvm-ffi"]) if wheel else None,
        "runtime": pack_runtime(os.path.join(out, "runtime")),
    }
    shutil.copyfile(bundle, os.path.join(out, name))
    return manifest


def prepare(bundle: str, out: str, wheel: bool = True) -> dict:
    """Write `out` (see the module docstring); wheel=False leaves the tvm-ffi wheel out (the CPU test: no network)."""
    manifest = carry_objects(bundle, out, "cutedsl", "cutedsl.nojit", wheel)
    manifest["link"] = {"libs": ["cute_dsl_runtime", "tvm_ffi"],
                        "aot_config": "python -m cutlass.cute.export.aot_config --ldflags / --libs (cutlass/cute/"
                                      "export/aot_config.py) plus -ltvm_ffi (TVM-FFI C ABI the objects call)"}
    manifest["vllm_sources"] = copy_reference_sources(os.path.join(out, "vllm_src"))
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def folder_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=os.path.join(ROOT, ".device", "cutedsl.nojit"))
    ap.add_argument("--out", default=os.path.join(ROOT, ".device-cu"))
    args = ap.parse_args()
    if not os.path.isfile(args.bundle):
        print(f"no bundle {args.bundle}: build it with `nojit build --runtime cutedsl -o {args.bundle}`",
              file=sys.stderr)
        return 2
    m = prepare(args.bundle, args.out)
    size = folder_size(args.out)
    print(f"{args.out}: {len(m['bundle']['entries'])} CuTeDSL entries, tvm-ffi {m['tools']['apache-tvm-ffi']} wheel "
          f"{m['tvm_ffi_wheel']['size'] / 1e6:.1f} MB, {RUNTIME_LIB} {m['runtime']['size'] / 1e6:.1f} MB "
          f"({m['runtime']['xz_size'] / 1e6:.1f} MB xz), {len(m['vllm_sources'])} vLLM reference files; "
          f"{size / 2**20:.1f} MiB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
