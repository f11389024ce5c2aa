"""What of a FlashInfer bundle the device can check without FlashInfer's Python: the cubins loaded, the modules as
files. (The modules link no torch: NEEDED libcudart.so.13, libnvrtc.so.13, libcuda.so.1, libstdc++; FlashInfer's
own Python launches them on the device in tests/gpu/checks/check_flashinfer_launch.py, step flashinfer-launch.)

- TensorRT-LLM DeepGEMM cubins (kind trtllm_deepgemm): each is loaded on the GPU the way TensorRT-LLM's
  Runtime::getKernel does (runtime.cuh:89-110: cuLibraryLoadData, enumerate the kernels, take the one whose name
  holds "fp8_gemm_kernel"); the driver must accept it for sm_90 and the kernel must be there. Not launched:
  its launch needs TensorRT-LLM's TMA descriptors and argument block, built inside the FlashInfer module.
- FlashInfer modules (.so): read from the bundle (read_blob checks each sha256 against the manifest) and checked
  to be what dlopen takes: x86-64 ELF shared objects (ET_DYN); nothing more is possible here.

usage: python3 tests/gpu/checks/check_flashinfer.py BUNDLE [--json OUT]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys


def _cuda() -> ctypes.CDLL:
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context is current from here on
    return ctypes.CDLL("libcuda.so.1")


def load_kernel(cuda: ctypes.CDLL, cubin: bytes) -> tuple[int, str | None]:
    """(error code, name of the fp8_gemm_kernel found) for one cubin, as TensorRT-LLM loads it."""
    lib = ctypes.c_void_p()
    rc = cuda.cuLibraryLoadData(ctypes.byref(lib), ctypes.c_char_p(cubin), None, None, 0, None, None, 0)
    if rc != 0:
        return rc, None
    count = ctypes.c_uint()
    cuda.cuLibraryGetKernelCount(ctypes.byref(count), lib)
    kernels = (ctypes.c_void_p * count.value)()
    cuda.cuLibraryEnumerateKernels(kernels, count, lib)
    found = None
    for k in kernels:
        name = ctypes.c_char_p()
        cuda.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(k))
        if name.value and b"fp8_gemm_kernel" in name.value:
            found = name.value.decode()
            break
    cuda.cuLibraryUnload(lib)
    return 0, found


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--json")
    args = ap.parse_args()
    from nojit.loader.bundle.file import Bundle

    bundle = Bundle.open(args.bundle)
    m = bundle.manifest
    cuda = None
    rows, ok = [], True
    for e in sorted(m.entries, key=lambda e: e.launch.module):
        if m.kernels[e.kernel].runtime != "flashinfer":
            continue
        data = bundle.read_blob(e.blob)  # sha256-checked against the manifest by read_blob itself
        row = {"name": e.launch.module, "kind": e.launch.kind, "bytes": len(data)}
        if e.launch.kind == "trtllm_deepgemm":
            cuda = cuda or _cuda()
            rc, kernel = load_kernel(cuda, data)
            row.update(load_rc=rc, kernel=kernel, ok=rc == 0 and kernel is not None)
        else:  # what dlopen needs: an ELF64 shared object (ET_DYN) for x86-64
            row.update(elf=data[:4] == b"\x7fELF" and data[4] == 2 and data[16:18] == b"\x03\x00" and data[18] == 62)
            row["ok"] = row["elf"]
        ok &= row["ok"]
        rows.append(row)
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {row['kind']:16s} {row['name']:60s} {row['bytes']:>9d} B "
              f"{row.get('kernel') or ''}")
    if not rows:
        print("FAIL: the bundle holds no FlashInfer entries")
        ok = False
    print(f"flashinfer: {sum(r['ok'] for r in rows)}/{len(rows)} entries ok "
          f"({sum(r['kind'] == 'trtllm_deepgemm' for r in rows)} TensorRT-LLM DeepGEMM cubins loaded on the GPU)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
