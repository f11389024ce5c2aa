"""Humming entries of a bundle on the H200, where Humming itself is not installed (no vLLM, no humming-kernels).

Launched against a torch reference: every input-processing kernel (`ProcessInputKernel`: block-FP8 quantization
of the w13 input, clamped SiLU * up + quantization of the w2 input). Its parameters are a plain C ABI
(humming/include/humming/kernel/process_input.cuh `process_input_kernel(...)`: 8 pointers, 3 sizes, 3 flags),
launched through nojit's C launcher with the grid and block Humming's launcher would use (csrc/launcher/
process_input.h: block = the cubin's NUM_THREADS, grid = rows * ceil(hidden / COLUMNS_PER_TASK) with tile
partition), both read from the cubin's own __constant__ symbols. Outputs and scales are poisoned (NaN) first.
Reference: float32 torch, the op's definition (group absmax / 448, FP8 E4M3 round to nearest) with Humming's
own test tolerance (testing/process_input.py: values within one FP8 step, group scales rtol 1e-5, atol 1e-7).

Loaded, not launched: every GEMM kernel (`HummingKernel`): its cubin is loaded by the driver with PTX JIT off and
its entry found. Its parameters are a struct Humming's launcher builds from the layer, tuning and tensors
(TMA descriptors encoded with cuTensorMapEncodeTiled, stream-K locks, expert routing tables: launcher.cpp),
which cannot be packed faithfully without Humming's launcher; Humming's own GEMM test needs its runtime.

    python tests/gpu/checks/check_humming.py --bundle .device/humming.nojit [--json OUT] [--list-only]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys


def cubin_constants(cubin: bytes, names: tuple[str, ...]) -> dict[str, int]:
    """Initial values of 32-bit __constant__ symbols of a cubin (ELF64: symbol -> section data)."""
    e_shoff, = struct.unpack_from("<Q", cubin, 0x28)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = []
    for i in range(e_shnum):
        off = e_shoff + i * e_shentsize
        name, stype, _flags, _addr, offset, size, link, _info, _align, entsize = struct.unpack_from(
            "<IIQQQQIIQQ", cubin, off)
        sections.append((name, stype, offset, size, link, entsize))
    out: dict[str, int] = {}
    for _name, stype, offset, size, link, entsize in sections:
        if stype != 2:  # SHT_SYMTAB
            continue
        str_off = sections[link][2]
        for j in range(size // entsize):
            st_name, _st_info, _st_other, st_shndx, st_value, st_size = struct.unpack_from(
                "<IBBHQQ", cubin, offset + j * entsize)
            end = cubin.index(b"\0", str_off + st_name)
            sym = cubin[str_off + st_name:end].decode()
            if sym in names and st_size == 4 and 0 < st_shndx < len(sections):
                sec = sections[st_shndx]
                if sec[1] == 8:  # SHT_NOBITS: zero-initialized
                    out[sym] = 0
                else:
                    out[sym], = struct.unpack_from("<I", cubin, sec[2] + st_value)
    return out


def humming_entries(bundle):
    for kid in bundle.kernel_ids():
        if bundle.index.kernels[kid].runtime == "humming":
            for e in bundle.entries(kid):
                yield kid, e


def reference(x, args):
    """float32 reference of one process-input call (the op's definition, written here)."""
    import torch

    v = x.float()
    if args["activation_type"] == "binary_split":
        half = v.size(1) // 2
        a, b = v[:, :half], v[:, half:]
        limit = 10.0  # DeepSeek-V4's swiglu_limit, as the kernel's activation_impl was rendered with it
        if "fminf(a, (" in (args.get("activation_impl") or ""):
            limit = float(args["activation_impl"].split("fminf(a, (")[1].split("f")[0])
        gate = torch.clamp(a, max=limit)
        up = torch.clamp(b, min=-limit, max=limit)
        v = gate / (1 + torch.exp(-gate)) * up
    elif args["activation_type"] != "none":
        raise ValueError(f"no reference for activation {args['activation_type']}")
    g = args["quant_group_size"]
    groups = v.reshape(v.size(0), -1, g)
    scale = (groups.abs().amax(dim=2) / 448.0).clamp_min(1e-30)
    q = (groups * scale.reciprocal().unsqueeze(-1)).reshape(v.shape).to(torch.float8_e4m3fn)  # x * (1 / scale)
    return q, scale


def fp8_steps(actual, expected):
    """|actual - expected| in units of one FP8 E4M3 step at the expected value (Humming's own test measure)."""
    import torch

    a, e = actual.float(), expected.float()
    _, exponent = torch.frexp(e.abs())
    step = torch.ldexp(torch.ones_like(e), exponent.clamp_min(2 - 7) - 1 - 3)
    return ((a - e) / step).abs()


def launch_process_input(launcher, fn, consts, args, x, out, scales, stream):
    rows = x.size(0)
    hidden = args["hidden_size"]
    if args["use_tile_partition"]:
        grid = rows * -(-hidden // consts["COLUMNS_PER_TASK"])
    else:
        grid = -(-rows // args["tokens_per_block"])
    values = [x.data_ptr(), out.data_ptr(), 0, scales.data_ptr(), 0, 0, 0, 0, rows, rows, 1, rows, 0, 0, 0]
    launcher.launch(fn.function, (grid, 1, 1), (consts["NUM_THREADS"], 1, 1), 0, stream, b"ppppppppLLuLccc",
                    values, (1, 1, 1), False, False)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--json")
    ap.add_argument("--list-only", action="store_true", help="no GPU: read the cubins' constants only")
    opts = ap.parse_args()
    from nojit.loader.bundle.file import Bundle

    bundle = Bundle.open(opts.bundle)
    entries = list(humming_entries(bundle))
    report = {"entries": len(entries), "launched": [], "loaded": [], "failures": []}
    if opts.list_only:
        for kid, e in entries:
            consts = cubin_constants(bundle.read_blob(e.blob), ("NUM_THREADS", "COLUMNS_PER_TASK", "INPUT_ROW_SIZE"))
            report["loaded"].append({"kernel": kid.rpartition(":")[2], "origin": e.origin, **consts})
        print(json.dumps(report)[:2000])
        if opts.json:
            with open(opts.json, "w") as f:
                json.dump(report, f, indent=1)
        return 0 if entries else 1

    os.environ.setdefault("CUDA_DISABLE_PTX_JIT", "1")  # SASS only: the driver compiles nothing
    processes: list[str] = []
    sys.addaudithook(lambda ev, a: processes.append(f"{ev} {str(a)[:200]}")
                     if ev in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.system") else None)
    import torch

    from nojit.loader.launch.cuda_launch import launcher

    dev = torch.cuda.current_device()
    torch.manual_seed(0)
    L = launcher()
    stream = torch.cuda.current_stream().cuda_stream
    for kid, e in entries:
        cubin = bundle.read_blob(e.blob)
        name = e.launch.kernel_name
        try:
            fn = L.function(dev, e.blob, lambda c=cubin: c, name, 0)
        except Exception as exc:
            report["failures"].append(f"{kid} {e.origin}: load failed: {exc}")
            continue
        if not kid.endswith(":ProcessInputKernel"):
            report["loaded"].append({"kernel": kid.rpartition(":")[2], "origin": e.origin, "regs": fn.num_regs})
            continue
        args = e.key["args"]
        if args["quant_mode"] != "dynamic_group" or args["layout"] != "normal" or args["quantization_phase"] != "fused":
            report["failures"].append(f"{kid} {e.origin}: no reference for {args['quant_mode']}/{args['layout']}")
            continue
        consts = cubin_constants(cubin, ("NUM_THREADS", "COLUMNS_PER_TASK", "INPUT_ROW_SIZE"))
        width = consts["INPUT_ROW_SIZE"]
        for rows in (1, 37, 512):
            x = (torch.randn(rows, width, device="cuda") * torch.rand(rows, 1, device="cuda") * 8).to(torch.bfloat16)
            x[:, ::97] *= 20  # outliers: each group's absmax differs
            out = torch.full((rows, args["hidden_size"]), 0x7F, dtype=torch.uint8, device="cuda")  # E4M3 NaN
            scales = torch.full((rows, args["hidden_size"] // args["quant_group_size"]), float("nan"), device="cuda")
            launch_process_input(L, fn, consts, args, x, out, scales, stream)
            torch.cuda.synchronize()
            q_ref, s_ref = reference(x, args)
            q = out.view(torch.float8_e4m3fn)
            steps = fp8_steps(q, q_ref)
            scale_ok = torch.allclose(scales, s_ref, rtol=1e-5, atol=1e-7)
            worst = float(steps.max()) if steps.numel() else 0.0
            row = {"kernel": "ProcessInputKernel", "origin": e.origin, "rows": rows, "width": width,
                   "threads": consts["NUM_THREADS"], "max_fp8_steps": worst,
                   "max_scale_rel": float(((scales - s_ref).abs() / s_ref).max()), "nan_left": int(torch.isnan(
                       q.float()).sum() + torch.isnan(scales).sum())}
            report["launched"].append(row)
            if not (worst <= 1.001 and scale_ok and row["nan_left"] == 0):
                report["failures"].append(f"{kid} {e.origin} rows {rows}: {row}")
    report["processes"] = processes
    if processes:
        report["failures"].append(f"processes started: {processes}")
    print(f"humming: {len(report['launched'])} launches of "
          f"{len({(r['origin'], r['threads']) for r in report['launched']})} process-input kernels vs float32 "
          f"reference, {len(report['loaded'])} GEMM cubins loaded (PTX JIT off), {len(processes)} processes, "
          f"{len(report['failures'])} failures")
    for f in report["failures"][:20]:
        print("  FAIL", f)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if report["failures"] or not report["launched"] else 0


if __name__ == "__main__":
    sys.exit(main())
