"""CuTeDSL entries on the H200, where CuTeDSL itself cannot be carried (nvidia-cutlass-dsl is ~490 MB and built
for the build box's CPython, the device runs 3.12 with no cutlass).

What is checked instead, per bundled CuTeDSL entry: the object file CuTeDSL's export_to_c wrote (read from the
bundle, sha256-checked) embeds sm_90a cubins; each is loaded by the H200's driver through nojit's C launcher with
CUDA_DISABLE_PTX_JIT=1 (so SASS, never PTX compiled by the driver), and every kernel entry it declares is found
(cuModuleGetFunction) with its register count. Not checked here: a launch against a torch reference (the
arguments are CuTe tensor descriptors packed by CuTeDSL's host code, which needs its runtime and TVM-FFI).

    python tests/gpu/checks/check_cutedsl.py --bundle BUNDLE [--json OUT] [--list-only]

--list-only needs no GPU (CPU test: the cubins and kernel names are found in the objects).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys


def embedded_cubins(obj: bytes) -> list[bytes]:
    """The ELF images inside a relocatable object (after its own header), each cut at its section table's end."""
    out = []
    at = obj.find(b"\x7fELF", 4)
    while at != -1:
        if obj[at + 4] == 2 and obj[at + 5] == 1:  # ELFCLASS64, little-endian
            e_shoff, = struct.unpack_from("<Q", obj, at + 0x28)
            e_shentsize, e_shnum = struct.unpack_from("<HH", obj, at + 0x3A)
            end = at + e_shoff + e_shentsize * e_shnum
            e_machine, = struct.unpack_from("<H", obj, at + 0x12)
            if e_machine == 190 and end <= len(obj):  # EM_CUDA
                out.append(obj[at:end])
                at = obj.find(b"\x7fELF", end)
                continue
        at = obj.find(b"\x7fELF", at + 4)
    return out


def kernel_names(cubin: bytes) -> list[str]:
    """Names of the kernels a cubin defines: its `.text.<name>` sections."""
    e_shoff, = struct.unpack_from("<Q", cubin, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", cubin, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    strtab_off, strtab_size = sections[e_shstrndx][4], sections[e_shstrndx][5]
    strtab = cubin[strtab_off:strtab_off + strtab_size]
    names = []
    for s in sections:
        name = strtab[s[0]:strtab.index(b"\0", s[0])].decode()
        if name.startswith(".text."):
            names.append(name[len(".text."):])
    return names


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--json")
    ap.add_argument("--list-only", action="store_true")
    args = ap.parse_args()
    os.environ["CUDA_DISABLE_PTX_JIT"] = "1"
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(args.bundle)
    rows = []
    failed = 0
    launcher = None
    if not args.list_only:
        from nojit.loader.launch.cuda_launch import launcher as get_launcher

        launcher = get_launcher()
    for e in b.manifest.entries:
        if b.manifest.kernels[e.kernel].runtime != "cutedsl":
            continue
        obj = b.read_blob(e.blob)
        cubins = embedded_cubins(obj)
        row = {"kernel": e.kernel.rpartition(":")[2], "symbol": e.launch.symbol, "cubins": len(cubins), "kernels": [],
               "sm_90a": b"sm_90a" in obj}
        for cubin in cubins:
            for name in kernel_names(cubin):
                item = {"name": name[:120]}
                if launcher is not None:
                    try:
                        f = launcher._load(0, cubin, name, 0)
                        item.update(loaded=True, num_regs=f.num_regs, max_threads=f.max_threads)
                    except Exception as exc:  # noqa: BLE001 - reported per kernel
                        item.update(loaded=False, error=str(exc)[:300])
                        failed += 1
                row["kernels"].append(item)
        if not row["kernels"] or not row["sm_90a"]:
            failed += 1
        rows.append(row)
        print(f"{row['kernel']:55} {row['symbol']}: {len(cubins)} cubin(s), kernels "
              + ", ".join(f"{k['name'][:40]}{'' if launcher is None else (' regs=' + str(k.get('num_regs')) if k.get('loaded') else ' FAILED')}"
                          for k in row["kernels"]))
    if not rows:
        print("no CuTeDSL entries in the bundle: nothing was checked", file=sys.stderr)
        failed += 1
    kernels = sum(len(r["kernels"]) for r in rows)
    print(f"{len(rows)} CuTeDSL entries, {kernels} kernels, {'listed' if launcher is None else 'loaded'}; "
          f"{failed} failed; driver PTX JIT disabled")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"entries": rows, "failed": failed, "loads": getattr(launcher, "loads", 0)}, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
