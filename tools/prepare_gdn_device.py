"""Make `.device-gdn/` (ignored, never committed): what tests/gpu/checks/check_gdn_prefill.py needs on the device machine.

The bundle's flashinfer_cute entries are CuTeDSL `export_to_c` objects like the cutedsl room's, so the device runs them
the same way (tools/prepare_cutedsl_device.py says why: CuTeDSL, FlashInfer and vLLM are not on the device, and
CuTeDSL's MLIR cannot be carried): linked with g++ against CuTeDSL's C runtime and TVM-FFI, loaded with tvm_ffi. This
carries, verbatim: wheels/ (the apache-tvm-ffi wheel the bundle names), runtime/libcute_dsl_runtime.so.xz, gdn.nojit
(the bundle) and manifest.json (versions, sizes, sha256). Nothing of vLLM or FlashInfer is carried: the check's
reference is its own float64 recurrence.

    nojit build --deployment aot/data/qwen3.5-35b-a3b-fp8-h200.toml --runtime flashinfer_cute -o .device/gdn.nojit
    python tools/prepare_gdn_device.py [--bundle .device/gdn.nojit] [--out .device-gdn]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from prepare_cutedsl_device import (  # noqa: E402
    RUNTIME_LIB, carry_objects, folder_size)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNTIME = "flashinfer_cute"


def prepare(bundle: str, out: str, wheel: bool = True) -> dict:
    """Write `out`; wheel=False leaves the tvm-ffi wheel out (the CPU test: no network)."""
    manifest = carry_objects(bundle, out, RUNTIME, "gdn.nojit", wheel)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
    return manifest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", default=os.path.join(ROOT, ".device", "gdn.nojit"))
    ap.add_argument("--out", default=os.path.join(ROOT, ".device-gdn"))
    args = ap.parse_args()
    if not os.path.isfile(args.bundle):
        print(f"no bundle {args.bundle}: build it with `nojit build --deployment aot/data/qwen3.5-35b-a3b-fp8-h200.toml "
              f"--runtime flashinfer_cute -o {args.bundle}`", file=sys.stderr)
        return 2
    m = prepare(args.bundle, args.out)
    print(f"{args.out}: {len(m['bundle']['entries'])} {RUNTIME} entries, {RUNTIME_LIB} "
          f"{m['runtime']['xz_size'] / 1e6:.1f} MB xz; {folder_size(args.out) / 2**20:.1f} MiB in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
