"""Every CuTeDSL entry of the bundle launched on the H200, called as vLLM calls it, against an independent reference.

CuTeDSL itself cannot be on the device (its MLIR library is ~190 MB and built for another CPython), so the objects
are run the second way CuTeDSL documents for `export_to_c` output: linked into a shared library against CuTeDSL's C
runtime (libcute_dsl_runtime.so) and TVM-FFI, `g++ -shared -o k.so k.o -lcute_dsl_runtime -ltvm_ffi`
(nvidia-cutlass-dsl cutlass/cute/export/aot_config.py; docs.nvidia.com/cutlass "Ahead-of-Time (AOT) Compilation",
"Compile with TVM FFI: Exporting Compiled Module"), then `tvm_ffi.load_module(so)["<symbol>"]` (TVM-FFI "Export
Functions and Classes: C Symbols": `__tvm_ffi_<name>` in a shared library). The function is the one vLLM's
`_compiled_cache[key]` would hold (TVM-FFI safe call: DLPack tensors, scalars, the stream; vLLM's own executor is
this function behind CuTeDSL's Python wrapper), and it is called with torch tensors exactly as vLLM's call site calls
the compiled function for that key (argument order, dtypes, shapes from the key, stream):

  * router GEMM (model_executor/kernels/linear/cute_dsl/ll_bf16.py `LLBf16Gemm.__call__`): dot-product keys
    `kernel(x[M,K] bf16, w[N,K] bf16, out[M,N] f32, N, stream)` at the key's M and K, split-K keys
    `kernel(x, w, out, stream, 1.0)` (shape-dynamic: M 5, 8, 16); N = 256 (DeepSeek-V4-Flash's router). The stream
    is the current torch stream's handle (vLLM passes `CUstream(handle)`; TVM-FFI takes both as the same pointer).
    Reference: float64 x @ w.T; tolerance rtol = atol = 1e-2, what vLLM-family tests apply to bf16 GEMM outputs
    against an fp32 reference (the HC tests `test_hc_down_silu_*`, the fused one against `ll_bf16_gemm` itself);
    no numeric test of ll_bf16 alone was found, so the worst error is reported too (fp32 accumulation: ~1e-5).
  * DSv4 ops (models/deepseek_v4/nvidia/ops/*_cutedsl.py, `VllmCuTeDSLJitKernel.launch`: `executor(*launch_args)`,
    the stream is TVM-FFI's environment stream, which TVM-FFI sets from torch's current stream): the launch_args
    tuple each `__call__` builds. References: vLLM's own non-CuTeDSL paths of the same ops (its Triton kernels,
    run with this machine's Triton from the carried vLLM files; on a machine without cutlass, vLLM's wrappers
    `dequantize_and_gather_k_cache` and `fused_indexer_q_rope_quant` take them by themselves):
      - dequant-gather-K: `dequantize_and_gather_k_cache` (Triton) and a torch gather + dequantization (bit-exact
        with vLLM's Triton under the CPU interpreter); bit-exact against both (a dequantization is exact);
      - indexer-q FP8: `fused_indexer_q_rope_quant(use_fp4=False)` (Triton); compared on what the logits kernel
        consumes, weights_out * q_fp8 per (token, head): mean |diff| <= 1e-2 x mean |ref| per row (vLLM's
        indexer rule, tests/kernels/attention/dsv4_compress_utils.py `compare_to_triton`, dmean < 1e-2); also
        against a torch RoPE + power-of-two-scale FP8 quantization (within 5e-2: one e4m3 step where a scale
        lands on the other side of a power of two), the reference where Triton cannot run;
      - compressor C4 and C128 (head 512, fp8_ds_mla): `compress_norm_rope_store_triton`, the "Triton FP32
        oracle" of vLLM's DSv4 compressor tests; compared as those tests do (dsv4_compress_utils.py
        `compare_to_triton`, head 512): each compressed row dequantized, NoPE mean |diff| < 5e-2, RoPE max
        |diff| < 5e-2. The C128 path is two entries (compress, then norm-rope-store) chained as vLLM chains them;
        the compress entry's rows are also checked against a float64 softmax-pool of the state cache, and every
        row is compared with a float64 pool + RMSNorm + RoPE (reported; the reference where Triton cannot run:
        vLLM's Triton is within 0.025 / 0.016 of it under the CPU interpreter).
Outputs are poisoned first (NaN, or 0xFF bytes); an element the reference writes must be written and match, and a
case where the kernel wrote nothing fails. Every bundled entry is launched at least once. Control: after each
comparison one wrong value is put into the kernel's output (a GEMM output + 1, a gathered value x 2, a folded weight
x 2, a UE8M0 scale one step up) and the same comparison must reject it.

Phases: (1) preparation: the runtime unpacked and checked, each object read through nojit's reader (sha256 against
the bundle's digest) and linked with g++ (processes: here, before the hook), loaded with tvm_ffi; inputs built and
every reference computed (Triton compiles its reference kernels here). (2) the CuTeDSL calls, with an audit hook
counting every process start (subprocess, os.exec*, os.posix_spawn, os.system, fork): must be 0; device_run.sh also
runs the check under `strace -f -e execve` where strace exists and counts execve calls between the phase's markers
(process starts from native code, which no Python hook sees). Compiles: none can
happen (no CuTeDSL on this machine: `cutlass` is not importable and never imported; the driver's PTX JIT is off with
CUDA_DISABLE_PTX_JIT=1, so only the embedded SASS can load).

    python tests/gpu/checks/check_cutedsl_launch.py --dir .device-cu [--json OUT]      (GPU; tvm_ffi importable)
    python tests/gpu/checks/check_cutedsl_launch.py --dir DIR --link-only              (no GPU: unpack, verify, link, load)
    python tests/gpu/checks/check_cutedsl_launch.py --list-sources --vllm-src DIR      (the vLLM files the references import)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
RUNTIME_LIB = "libcute_dsl_runtime.so"
REFERENCE_MODULES = (  # vLLM's non-CuTeDSL paths of the bundled ops
    "vllm.models.deepseek_v4.common.ops.cache_utils",
    "vllm.models.deepseek_v4.common.ops.fused_indexer_q",
    "vllm.models.deepseek_v4.common.ops.fused_compress_quant_cache",
)
ROUTER_N = 256  # DeepSeek-V4-Flash router: (K, N) = (4096, 256) in ll_bf16.py's tuned tables
SPLITK_M = (5, 8, 16)
# The device the cases run on; "cpu" only for --references-only under TRITON_INTERPRET=1 (the CPU validation of
# the references' calls: the CuTeDSL functions are never called there).
DEV = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty")


# ---------------------------------------------------------------- preparation: runtime, objects, link, load
def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def load_manifest(d: str) -> dict:
    with open(os.path.join(d, "manifest.json")) as f:
        return json.load(f)


def unpack_runtime(d: str, manifest: dict, work: str) -> str:
    """libcute_dsl_runtime.so from its .xz, both digests checked; returns its directory."""
    rt = manifest["runtime"]
    with open(os.path.join(d, rt["file"]), "rb") as f:
        packed = f.read()
    if sha256(packed) != rt["xz_sha256"]:
        raise SystemExit(f"{rt['file']}: sha256 differs from manifest.json (re-run tools/prepare_cutedsl_device.py)")
    try:
        import lzma

        raw = lzma.decompress(packed)
    except ImportError:  # a Python built without _lzma: the xz tool (preparation phase, before the hook)
        raw = subprocess.run(["xz", "-dc"], input=packed, capture_output=True, check=True).stdout
    if sha256(raw) != rt["sha256"]:
        raise SystemExit(f"{RUNTIME_LIB}: unpacked sha256 differs from manifest.json")
    libdir = os.path.join(work, "runtime")
    os.makedirs(libdir, exist_ok=True)
    with open(os.path.join(libdir, RUNTIME_LIB), "wb") as f:
        f.write(raw)
    return libdir


def link_and_load(d: str, manifest: dict, work: str, runtime: str = "cutedsl") -> tuple[list[dict], dict[str, Any]]:
    """Each entry of `runtime` (CuTeDSL objects: cutedsl, flashinfer_cute): object read through nojit's reader (it
    checks the sha256), linked, loaded."""
    import tvm_ffi
    from nojit.loader.bundle.file import Bundle

    bundle_path = os.path.join(d, manifest["bundle"]["file"])
    with open(bundle_path, "rb") as f:
        if sha256(f.read()) != manifest["bundle"]["sha256"]:
            raise SystemExit(f"{bundle_path}: sha256 differs from manifest.json")
    ffi_dir = os.path.dirname(tvm_ffi.libinfo.find_libtvm_ffi())
    rt_dir = unpack_runtime(d, manifest, work)
    b = Bundle.open(bundle_path)
    entries, fns = [], {}
    for e in b.manifest.entries:
        if b.manifest.kernels[e.kernel].runtime != runtime:
            continue
        obj = b.read_blob(e.blob)  # nojit's reader: sha256-checked against the manifest's digest
        if obj[:4] != b"\x7fELF" or obj[16:18] != b"\x01\x00":  # what g++ links below: an ELF relocatable object
            raise SystemExit(f"{e.kernel}: bundled object {e.blob[:12]} is not an ELF relocatable object")
        o = os.path.join(work, e.launch.symbol + ".o")
        so = os.path.join(work, e.launch.symbol + ".so")
        with open(o, "wb") as f:
            f.write(obj)
        cmd = ["g++", "-shared", "-o", so, o, f"-L{rt_dir}", "-lcute_dsl_runtime", f"-L{ffi_dir}", "-ltvm_ffi",
               f"-Wl,-rpath,{rt_dir}:{ffi_dir}"]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, check=False, capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"linking {e.kernel} ({e.launch.symbol}) failed:\n{p.stderr[-2000:]}")
        module = tvm_ffi.load_module(so)
        fn = module[e.launch.symbol]
        fns[e.launch.symbol] = (module, fn)
        entries.append({"kernel": e.kernel, "owner": e.kernel.rpartition(":")[2], "symbol": e.launch.symbol,
                        "key": e.key, "blob": e.blob, "object_bytes": len(obj),
                        "link_ms": round((time.perf_counter() - t0) * 1e3, 1)})
    if not entries:
        raise SystemExit(f"{bundle_path} holds no {runtime} entries")
    return entries, fns


def key_fields(key_json: list) -> dict[str, Any]:
    """The bundle's tagged key as {field: plain value} (cutlass/torch types as their names)."""
    def plain(v: list) -> Any:
        tag, value = v[0], v[1]
        if tag == "tuple":
            return tuple(plain(x) for x in value)
        return value

    return {name: plain(v) for name, v in key_json[2]}


# ---------------------------------------------------------------- the vLLM references (mounted sources)
def mount_vllm(vllm_src: str) -> Any:
    sys.path.insert(0, HERE)
    import vllm_mount

    return vllm_mount.mount(vllm_src)


def list_sources(vllm_src: str) -> list[str]:
    finder = mount_vllm(vllm_src)
    for name in REFERENCE_MODULES:
        importlib.import_module(name)
    return finder.loaded


# ---------------------------------------------------------------- cases
class Case:
    """One call of one entry: inputs, the call as vLLM makes it, the reference, the comparison, and a control:
    `spoil` puts one wrong value into the kernel's output, which the comparison must then reject."""

    def __init__(self, name: str, symbols: list[str], run: Callable[[], None], check: Callable[[], dict],
                 spoil: Callable[[], None] | None = None) -> None:
        self.name, self.symbols, self.run, self.check, self.spoil = name, symbols, run, check, spoil


def _stream_handle() -> int:
    import torch

    return torch.cuda.current_stream().cuda_stream


def router_cases(entries: list[dict], fns: dict) -> list[Case]:
    import torch

    cases = []
    for e in entries:
        if e["owner"] not in ("ll_bf16_gemm_kernel", "ll_bf16_gemm_c1_pdl_kernel"):
            continue
        k = key_fields(e["key"])
        fn = fns[e["symbol"]][1]
        if k["backend"] == "dotprod":
            shapes = [(k["M"], k["K"])]
        else:
            shapes = [(m, 4096) for m in SPLITK_M]
        for m, kk in shapes:
            g = torch.Generator(device=DEV).manual_seed(1000 + m)
            x = torch.randn(m, kk, generator=g, device=DEV).to(torch.bfloat16)
            w = (torch.randn(ROUTER_N, kk, generator=g, device=DEV) * 0.02).to(torch.bfloat16)
            ref = x.double() @ w.double().T
            out = torch.full((m, ROUTER_N), float("nan"), dtype=torch.float32, device=DEV)

            def run(fn=fn, x=x, w=w, out=out, backend=k["backend"]) -> None:
                out.fill_(float("nan"))  # poisoned before each call
                if backend == "splitk":
                    fn(x, w, out, _stream_handle(), 1.0)  # ll_bf16.py: kernel(hidden, weight, output, stream, 1.0)
                else:
                    fn(x, w, out, ROUTER_N, _stream_handle())  # kernel(hidden, weight, output, N, stream)

            def check(out=out, ref=ref) -> dict:
                written = bool(torch.isfinite(out).all())
                err = (out.double() - ref).abs()
                tol = 1e-2 + 1e-2 * ref.abs()
                return {"written": written, "max_abs_err": float(err.max()), "ok": written and bool((err <= tol).all())}

            cases.append(Case(f"{e['owner']} {k['backend']} M={m} K={kk} N={ROUTER_N}"
                              + (f" bs={k['bs']}" if k["backend"] == "dotprod" else f" sk={k['split_k']} ns={k['num_stages']}"),
                              [e["symbol"]], run, check, lambda out=out: out[0, 0].add_(1.0)))
    return cases


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _fp8_bytes(shape: tuple, g: Any, scale: float = 1.0) -> Any:
    import torch

    v = torch.randn(*shape, generator=g, device=DEV) * scale
    return v.clamp(-440, 440).to(torch.float8_e4m3fn).view(torch.uint8)


def dequant_gather_cases(entries: list[dict], fns: dict, ref_ops: Any) -> list[Case]:
    """DequantGatherKCacheKernel.__call__: (out, k_cache, seq_lens, gather_lens, block_table, offset)."""
    import torch

    cases = []
    for e in entries:
        if e["owner"] != "_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL":
            continue
        k = key_fields(e["key"])
        bs, fp8_dim, group = k["block_size"], k["fp8_dim"], k["group_size"]
        head_dim = 512
        data_dim = fp8_dim + (head_dim - fp8_dim) * 2
        head_bytes = data_dim + head_dim // group
        g = torch.Generator(device=DEV).manual_seed(2000 + bs)
        seq_lens_l = [3 * bs + 5, 1, 2 * bs] if bs > 2 else [37, 1, 20]
        num_reqs = len(seq_lens_l)
        max_blocks = max(math.ceil(s / bs) for s in seq_lens_l) + 1
        num_blocks = num_reqs * max_blocks + 3
        stride0 = _round_up(_round_up(bs * head_bytes, 576), 32)  # the fake tensor's stride: divisible by 32
        buf = torch.empty(num_blocks * stride0, dtype=torch.uint8, device=DEV)
        blocks = buf.view(num_blocks, stride0)
        blocks.copy_(torch.randint(0, 120, (num_blocks, stride0), generator=g, device=DEV, dtype=torch.uint8))
        data = blocks[:, :bs * data_dim].view(num_blocks, bs, data_dim)  # V4: a block's data rows, then its scales
        data[..., :fp8_dim] = _fp8_bytes((num_blocks, bs, fp8_dim), g)
        data[..., fp8_dim:] = torch.randn(num_blocks, bs, head_dim - fp8_dim, generator=g, device=DEV).to(
            torch.bfloat16).view(torch.uint8)
        scales = blocks[:, bs * data_dim: bs * data_dim + bs * (head_dim // group)].view(num_blocks, bs, head_dim // group)
        scales.copy_(torch.randint(118, 132, scales.shape, generator=g, device=DEV, dtype=torch.uint8))
        k_cache = torch.as_strided(buf, (num_blocks, bs, head_bytes), (stride0, head_bytes, 1))
        perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(bs))[:num_reqs * max_blocks]
        block_table = perm.view(num_reqs, max_blocks).to(torch.int32).to(DEV)
        seq_lens = torch.tensor(seq_lens_l, dtype=torch.int32, device=DEV)
        gather_lens = (torch.tensor([min(s, 2 * bs + 3) for s in seq_lens_l], dtype=torch.int32, device=DEV)
                       if k["has_gather_lens"] else None)
        offset = 4 if k["has_gather_lens"] else 0
        rows = offset + max(seq_lens_l) + 3
        f64 = _dequant_gather_torch(k_cache, seq_lens_l, gather_lens, block_table, bs, offset, rows, fp8_dim, group)
        ref = torch.full((num_reqs, rows, head_dim), float("nan"), dtype=torch.bfloat16, device=DEV)
        try:
            assert not ref_ops.has_cutedsl(), "vLLM would take its CuTeDSL path here: the reference must be Triton"
            ref_ops.dequantize_and_gather_k_cache(ref, k_cache, seq_lens, gather_lens, block_table, bs, offset)
            which = "vLLM Triton"
        except Exception as exc:  # noqa: BLE001 - this machine's Triton may not compile vLLM's kernel
            ref, which = f64, f"torch (Triton failed: {type(exc).__name__}: {str(exc)[:200]})"
        out = torch.empty_like(ref)
        fn = fns[e["symbol"]][1]

        def run(fn=fn, out=out, k_cache=k_cache, seq_lens=seq_lens, gather_lens=gather_lens, block_table=block_table,
                offset=offset) -> None:
            out.fill_(float("nan"))
            fn(out, k_cache, seq_lens, gather_lens, block_table, offset)

        def check(out=out, ref=ref, f64=f64, which=which) -> dict:
            r = compare_written(out.float(), ref.float(), exact=True)
            r2 = compare_written(out.float(), f64.float(), exact=True)
            r.update(reference=which, torch_reference_ok=r2["ok"])
            r["ok"] = r["ok"] and r2["ok"]
            return r

        def spoil(out=out, ref=ref) -> None:
            i = int(torch.nonzero(torch.isfinite(ref.float()).flatten())[0])
            x = out.view(-1)[i]
            out.view(-1)[i] = 1.0 if float(x) == 0.0 else float(x) * 2

        cases.append(Case(f"dequant_gather_k block={bs} gather_lens={k['has_gather_lens']} offset={offset}",
                          [e["symbol"]], run, check, spoil))
    return cases


def _dequant_gather_torch(k_cache: Any, seq_lens: list[int], gather_lens: Any, block_table: Any, bs: int, offset: int,
                          rows: int, fp8_dim: int, group: int) -> Any:
    """The gathered K rows in torch: request i's tokens (the last gather_lens[i] of its seq_lens[i] where given,
    else all of them) at out[i, offset + j]; each row is fp8_dim FP8 values x 2^(ue8m0 - 127) per `group`, then
    the bf16 tail; a block holds its data rows, then its scale rows (DeepSeek V4's layout,
    dequant_gather_k_cutedsl.py). Unwritten rows stay NaN."""
    import torch

    head_dim = 512
    data_dim = fp8_dim + (head_dim - fp8_dim) * 2
    stride0 = k_cache.stride(0)
    flat = torch.as_strided(k_cache, (k_cache.shape[0], stride0), (stride0, 1))
    out = torch.full((len(seq_lens), rows, head_dim), float("nan"), dtype=torch.float64, device=k_cache.device)
    for i, n in enumerate(seq_lens):
        g = int(gather_lens[i]) if gather_lens is not None else n
        toks = torch.arange(n - g, n, device=k_cache.device)
        pages = block_table[i, toks // bs].long()
        off = toks % bs
        data = flat[pages[:, None], (off * data_dim)[:, None] + torch.arange(data_dim, device=k_cache.device)]
        sc = flat[pages[:, None], (bs * data_dim + off * (head_dim // group))[:, None]
                  + torch.arange(fp8_dim // group, device=k_cache.device)].double()
        nope = data[:, :fp8_dim].contiguous().view(torch.float8_e4m3fn).double() * torch.pow(
            2.0, sc - 127).repeat_interleave(group, dim=1)
        tail = data[:, fp8_dim:].contiguous().view(torch.bfloat16).double()
        out[i, offset:offset + g] = torch.cat([nope, tail], dim=1)
    return out.to(torch.bfloat16)


def compare_written(out: Any, ref: Any, exact: bool = False, atol: float = 0.0, rtol: float = 0.0) -> dict:
    """Elements the reference wrote (finite) must be written and match; others are only counted."""
    import torch

    mask = torch.isfinite(ref)
    n_ref = int(mask.sum())
    got = out[mask]
    written = bool(torch.isfinite(got).all()) and n_ref > 0
    err = (got - ref[mask]).abs()
    max_err = float(err.max()) if n_ref else float("nan")
    ok = written and (bool((got == ref[mask]).all()) if exact else bool((err <= atol + rtol * ref[mask].abs()).all()))
    return {"written": written, "reference_elements": n_ref, "max_abs_err": max_err, "ok": ok,
            "extra_written": int((torch.isfinite(out) & ~mask).sum())}


def indexer_q_cases(entries: list[dict], fns: dict, ref_ops: Any) -> list[Case]:
    """IndexerQFp8Kernel.__call__: (positions, q, cos_sin_cache, weights, q_fp8 u8, weights_out, s*h)."""
    import torch

    cases = []
    for e in entries:
        if e["owner"] != "_INDEXER_Q_FP8_KERNEL":
            continue
        k = key_fields(e["key"])
        assert k["cos_sin_dtype"] == "Float32", k
        heads, head_dim, rope = k["num_heads"], k["head_dim"], k["rope_dim"]
        tokens = 37 if k["coarsen"] == 1 else 600  # vLLM: coarsen = 1 if num_tokens < 512 else 4
        g = torch.Generator(device=DEV).manual_seed(3000 + tokens)
        max_pos = 4096
        positions = torch.randint(0, max_pos, (tokens,), generator=g, device=DEV, dtype=torch.int64)
        q = (torch.randn(tokens, heads, head_dim, generator=g, device=DEV) * 0.5).to(torch.bfloat16)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, rope, 2, dtype=torch.float32, device=DEV) / rope))
        freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32, device=DEV), inv_freq)
        cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous()
        weights = torch.randn(tokens, heads, generator=g, device=DEV).to(torch.bfloat16)
        softmax_scale, head_scale = head_dim ** -0.5, heads ** -0.5
        t_q, t_w = _indexer_q_torch(positions, q, cos_sin, weights, softmax_scale * head_scale, rope)
        try:
            assert not ref_ops.has_cutedsl(), "vLLM would take its CuTeDSL path here: the reference must be Triton"
            ref_q, ref_w = ref_ops.fused_indexer_q_rope_quant(positions, q, cos_sin, weights, softmax_scale,
                                                              head_scale, use_fp4=False)
            which = "vLLM Triton"
        except Exception as exc:  # noqa: BLE001 - this machine's Triton may not compile vLLM's kernel
            ref_q, ref_w, which = t_q, t_w, f"torch (Triton failed: {type(exc).__name__}: {str(exc)[:200]})"
        ref_eff = ref_w.double()[..., None] * ref_q.float().double()
        torch_eff = t_w.double()[..., None] * t_q.float().double()
        q_fp8 = torch.empty(tokens, heads, head_dim, dtype=torch.uint8, device=DEV)
        w_out = torch.empty(tokens, heads, dtype=torch.float32, device=DEV)
        fn = fns[e["symbol"]][1]

        def run(fn=fn, positions=positions, q=q, cos_sin=cos_sin, weights=weights, q_fp8=q_fp8, w_out=w_out,
                scale=float(softmax_scale * head_scale)) -> None:
            q_fp8.fill_(0xFF)  # 0xFF is NaN in e4m3fn
            w_out.fill_(float("nan"))
            fn(positions, q, cos_sin, weights, q_fp8, w_out, scale)

        def check(q_fp8=q_fp8, w_out=w_out, ref_eff=ref_eff, ref_q=ref_q, torch_eff=torch_eff, which=which) -> dict:
            eff = w_out.double()[..., None] * q_fp8.view(torch.float8_e4m3fn).float().double()
            written = bool(torch.isfinite(eff).all())
            worst = _worst_row_rel(eff, ref_eff) if written else float("nan")
            worst_torch = _worst_row_rel(eff, torch_eff) if written else float("nan")
            return {"written": written, "reference": which, "worst_row_rel_mean_err": worst,
                    "torch_worst_row_rel_mean_err": worst_torch, "ok": written and worst <= 1e-2 and worst_torch <= 5e-2,
                    "q_bytes_equal_pct": round(100 * float((q_fp8 == ref_q.view(torch.uint8)).float().mean()), 3)}

        cases.append(Case(f"indexer_q_fp8 tokens={tokens} coarsen={k['coarsen']} heads={heads}", [e["symbol"]],
                          run, check, lambda w_out=w_out: w_out[0, 0].mul_(2.0)))
    return cases


def _worst_row_rel(eff: Any, ref: Any) -> float:
    return float(((eff - ref).abs().mean(-1) / ref.abs().mean(-1).clamp_min(1e-30)).max())


def _indexer_q_torch(positions: Any, q: Any, cos_sin: Any, weights: Any, scale: float, rope: int) -> tuple[Any, Any]:
    """Indexer Q in torch (what fused_indexer_q_rope_quant's FP8 path is defined to do, its docstring and Triton
    kernel): GPT-J RoPE on the last `rope` dims (pairs (2i, 2i+1), cos_sin_cache = [cos | sin]) rounded to bf16,
    a per-(token, head) scale 2^ceil(log2(max(amax, 1e-4) / 448)), q / scale as e4m3fn, and
    weights_out = weights * scale * softmax_scale * head_scale."""
    import torch

    x = q.float()
    nope = x.shape[-1] - rope
    cs = cos_sin[positions].float()
    cos, sin = cs[:, None, :rope // 2], cs[:, None, rope // 2:]
    even, odd = x[..., nope::2], x[..., nope + 1::2]
    roped = torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)
    y = torch.cat([x[..., :nope], roped.to(torch.bfloat16).float()], dim=-1)
    # exp2 on the CPU: torch JIT-compiles CUDA exp2 with NVRTC (its jiterator), refused by strict mode in the one
    # process (H200, session 7); 2^integer is exact on either side
    s = torch.exp2(torch.ceil(torch.log2(y.abs().amax(-1).clamp_min(1e-4) / 448.0)).cpu()).to(y.device)
    return (y / s[..., None]).to(torch.float8_e4m3fn), weights.float() * s * scale


class _Meta(types.SimpleNamespace):
    """k_cache_metadata as the compressor passes it (only .slot_mapping is read)."""


def _compressor_scenario(ratio: int, state_block: int, lengths: list[int], seed: int) -> dict:
    """Requests with positions 0..L-1 whose partial states are in a paged state cache; boundary tokens
    ((p + 1) % ratio == 0) get consecutive KV slots, the others -1 (as vLLM's metadata gives them)."""
    import torch

    g = torch.Generator(device=DEV).manual_seed(seed)
    head = 512
    state_width = head * (2 if ratio == 4 else 1)
    blocks_per_req = max(math.ceil(L / state_block) for L in lengths) + 1
    num_state_blocks = len(lengths) * blocks_per_req + 2
    perm = torch.randperm(num_state_blocks, generator=torch.Generator().manual_seed(seed))
    block_table = perm[:len(lengths) * blocks_per_req].view(len(lengths), blocks_per_req).to(torch.int32)
    pos, req, slot, kv_slot = [], [], [], []
    n = 0
    for r, L in enumerate(lengths):
        for p in range(L):
            pos.append(p)
            req.append(r)
            slot.append(int(block_table[r, p // state_block]) * state_block + p % state_block)
            if (p + 1) % ratio == 0:
                kv_slot.append(n)
                n += 1
            else:
                kv_slot.append(-1)
    state_cache = torch.randn(num_state_blocks, state_block, 2 * state_width, generator=g, device=DEV) * 0.5
    max_pos = max(lengths) + 1
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 64, 2, dtype=torch.float32, device=DEV) / 64))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32, device=DEV), inv_freq)
    return {
        "state_cache": state_cache.contiguous(),
        "state_width": state_width,
        "state_block": state_block,
        "positions": torch.tensor(pos, dtype=torch.int64, device=DEV),
        "token_to_req": torch.tensor(req, dtype=torch.int32, device=DEV),
        "slot_mapping": torch.tensor(slot, dtype=torch.int64, device=DEV),
        "kv_slot_mapping": torch.tensor(kv_slot, dtype=torch.int64, device=DEV),
        "block_table": block_table.to(DEV),
        "num_compress": n,
        "rms_w": (torch.rand(head, generator=g, device=DEV) * 0.5 + 0.5).to(torch.bfloat16),
        "cos_sin": torch.cat([freqs.cos(), freqs.sin()], dim=-1).contiguous(),
        "eps": 1e-6,
    }


def _kv_cache(num_compress: int, kv_block: int, block_stride: int) -> Any:
    """A fp8_ds_mla K cache view [blocks, kv_block, 584] over pages of `block_stride` bytes, poisoned (0xFF)."""
    import torch

    blocks = num_compress // kv_block + 2
    buf = torch.full((blocks * block_stride,), 0xFF, dtype=torch.uint8, device=DEV)
    return torch.as_strided(buf, (blocks, kv_block, 584), (block_stride, 584, 1)), buf


def _dequant_rows(kv: Any, n: int) -> Any:
    """Compressed rows 0..n-1 of a fp8_ds_mla cache: 448 FP8 NoPE x 2^(ue8m0-127) per 64, then 64 bf16 RoPE
    (a block's 576-byte data rows, then its 8-byte scale rows)."""
    import torch

    kv_block, stride0 = kv.shape[1], kv.stride(0)
    flat = torch.as_strided(kv, (kv.shape[0], stride0), (stride0, 1))
    out = torch.empty(n, 512, dtype=torch.float64, device=kv.device)
    for ci in range(n):
        blk, p = divmod(ci, kv_block)
        row = flat[blk, p * 576:(p + 1) * 576]
        sc = flat[blk, kv_block * 576 + p * 8: kv_block * 576 + p * 8 + 7].double()
        nope = row[:448].view(torch.float8_e4m3fn).double() * torch.pow(2.0, sc - 127).repeat_interleave(64)
        out[ci, :448] = nope
        out[ci, 448:] = row[448:].contiguous().view(torch.bfloat16).double()
    return out


def _compare_rows(kv: Any, ref_rows: Any, n: int) -> dict:
    """vLLM's head-512 rule (dsv4_compress_utils.py compare_to_triton): NoPE mean |diff| and RoPE max |diff| per
    row, both < 5e-2 at the worst row; a row left poisoned is NaN, which fails."""
    import torch

    got = _dequant_rows(kv, n)
    written = bool(torch.isfinite(got).all()) and n > 0
    ref_ok = bool(torch.isfinite(ref_rows).all())
    d = (got - ref_rows).abs()
    nope_mean = float(d[:, :448].mean(-1).max()) if n else float("nan")
    rope_max = float(d[:, 448:].max()) if n else float("nan")
    return {"written": written, "rows": n, "reference_written": ref_ok, "nope_mean": nope_mean, "rope_max": rope_max,
            "ok": written and ref_ok and nope_mean < 5e-2 and rope_max < 5e-2}


def _spoil_scale(kv: Any) -> None:
    """Row 0's first UE8M0 scale one step up (its first 64 NoPE values doubled)."""
    import torch

    flat = torch.as_strided(kv, (kv.shape[0], kv.stride(0)), (kv.stride(0), 1))
    flat[0, kv.shape[1] * 576].add_(1)


def _row_references(ref_ops: Any, s: dict, ratio: int, kv_block: int, stride0: int) -> tuple[Any, Any, str]:
    """(reference rows, float64 rows, which reference): vLLM's Triton rows dequantized; where Triton cannot run
    here, the float64 rows (softmax pool, RMSNorm, RoPE: the same rule; Triton itself is within 0.025 / 0.016 of
    them on the CPU box's interpreter) are the reference."""
    f64 = _pool_norm_rope(s, ratio)
    try:
        ref_kv, _ = _kv_cache(s["num_compress"], kv_block, stride0)
        _triton_compress(ref_ops, s, ref_kv, ratio)
        return _dequant_rows(ref_kv, s["num_compress"]), f64, "vLLM Triton"
    except Exception as exc:  # noqa: BLE001 - this machine's Triton may not compile vLLM's kernel
        return f64, f64, f"float64 (Triton failed: {type(exc).__name__}: {str(exc)[:200]})"


def _compare_both(kv: Any, ref_rows: Any, f64: Any, n: int, which: str) -> dict:
    r = _compare_rows(kv, ref_rows, n)
    got = _dequant_rows(kv, n)
    d = (got - f64).abs()
    r.update(reference=which, f64_nope_mean=float(d[:, :448].mean(-1).max()), f64_rope_max=float(d[:, 448:].max()))
    return r


def _triton_compress(ref_ops: Any, s: dict, kv: Any, ratio: int) -> None:
    ref_ops.compress_norm_rope_store_triton(
        state_cache=s["state_cache"], num_actual=s["positions"].shape[0], token_to_req_indices=s["token_to_req"],
        positions=s["positions"], slot_mapping=s["slot_mapping"], block_table=s["block_table"],
        block_size=s["state_block"], state_width=s["state_width"], cos_sin_cache=s["cos_sin"], kv_cache=kv,
        k_cache_metadata=_Meta(slot_mapping=s["kv_slot_mapping"]), pdl_kwargs={}, head_dim=512, rope_head_dim=64,
        compress_ratio=ratio, overlap=ratio == 4, use_fp4_cache=False, rms_norm_weight=s["rms_w"],
        rms_norm_eps=s["eps"], quant_block=64, token_stride=576, scale_dim=8)


def compressor_cases(entries: list[dict], fns: dict, ref_ops: Any) -> list[Case]:
    import torch

    by_owner = {e["owner"]: e for e in entries}
    cases = []
    c4 = by_owner.get("_SPARSE_ATTN_COMPRESS_NORM_ROPE_STORE_C4_KERNEL")
    if c4 is not None:
        k = key_fields(c4["key"])
        s = _compressor_scenario(4, 4, [40, 13, 64], seed=41)
        kv_block = 64  # 256-token pages / ratio 4
        stride0 = _round_up(kv_block * (k["token_stride"] + k["scale_dim"]), 576)
        ref_rows, f64, which = _row_references(ref_ops, s, 4, kv_block, stride0)
        kv, kv_buf = _kv_cache(s["num_compress"], kv_block, stride0)
        fn = fns[c4["symbol"]][1]

        def run_c4(fn=fn, s=s, kv=kv, kv_buf=kv_buf) -> None:
            kv_buf.fill_(0xFF)
            # SparseAttnCompressNormRopeStoreC4Kernel.__call__ launch_args
            fn(s["state_cache"], s["token_to_req"], s["positions"], s["slot_mapping"], s["block_table"],
               s["state_block"], s["rms_w"], s["eps"], s["cos_sin"], kv, s["kv_slot_mapping"], kv.shape[1])

        cases.append(Case(f"compress_c4 tokens={s['positions'].shape[0]} rows={s['num_compress']}", [c4["symbol"]],
                          run_c4, lambda kv=kv, ref_rows=ref_rows, f64=f64, n=s["num_compress"], which=which:
                          _compare_both(kv, ref_rows, f64, n, which), lambda kv=kv: _spoil_scale(kv)))
    comp = by_owner.get("_SPARSE_ATTN_COMPRESS_C128_BLOCK8_KERNEL")
    store = by_owner.get("_SPARSE_ATTN_NORM_ROPE_STORE_KERNEL")
    if comp is not None and store is not None:
        ks = key_fields(store["key"])
        s = _compressor_scenario(128, 8, [256, 130, 384], seed=128)
        kv_block, stride0 = ks["kv_cache_block_size"], ks["kv_block_stride"]  # both compiled into the store key
        ref_rows, f64, which = _row_references(ref_ops, s, 128, kv_block, stride0)
        pooled = _softmax_pool(s, 128)  # float64, boundary rows only
        kv, kv_buf = _kv_cache(s["num_compress"], kv_block, stride0)
        compressed = torch.empty(s["positions"].shape[0], 512, dtype=torch.float32, device=DEV)
        f_comp, f_store = fns[comp["symbol"]][1], fns[store["symbol"]][1]

        def run_c128(s=s, kv=kv, kv_buf=kv_buf, compressed=compressed, f_comp=f_comp, f_store=f_store) -> None:
            kv_buf.fill_(0xFF)
            compressed.fill_(float("nan"))
            # SparseAttnCompressC128Block8Kernel.__call__ then SparseAttnNormRopeStoreKernel.__call__ launch_args
            f_comp(s["state_cache"], s["token_to_req"], s["positions"], s["slot_mapping"], s["block_table"], compressed)
            f_store(compressed, s["positions"], s["slot_mapping"], s["rms_w"], s["eps"], s["cos_sin"], kv,
                    s["kv_slot_mapping"])

        def check_c128(kv=kv, ref_rows=ref_rows, f64=f64, which=which, s=s, compressed=compressed,
                       pooled=pooled) -> dict:
            r = _compare_both(kv, ref_rows, f64, s["num_compress"], which)
            rows = s["kv_slot_mapping"] >= 0
            got = compressed[rows].double()
            pool_err = float((got - pooled).abs().max()) if bool(torch.isfinite(got).all()) else float("nan")
            r.update(pool_max_abs_err=pool_err, pool_ok=pool_err <= 1e-4)
            r["ok"] = r["ok"] and r["pool_ok"]
            return r

        cases.append(Case(f"compress_c128 + norm_rope_store tokens={s['positions'].shape[0]} rows={s['num_compress']} "
                          f"kv_block={kv_block} stride={stride0}", [comp["symbol"], store["symbol"]], run_c128,
                          check_c128, lambda kv=kv: _spoil_scale(kv)))
    return cases


def _softmax_pool(s: dict, ratio: int) -> Any:
    """The compression each boundary row holds, float64: per dimension, softmax over the window's scores (the
    state row's second half) of its kv (first half). The window is positions P-ratio+1..P, and with overlap (C4)
    P-2*ratio+1..P whose older `ratio` positions read the first 512 of each half and the newer ones the second
    512; positions before 0 take no part (the rule of vLLM's DSv4 compressor test oracle,
    tests/kernels/attention/dsv4_compress_utils.py `_torch_indexer_row`)."""
    import torch

    sc, sb, w = s["state_cache"].double(), s["state_block"], s["state_width"]
    overlap = ratio == 4
    window = 2 * ratio if overlap else ratio
    rows = []
    for i in torch.nonzero(s["kv_slot_mapping"] >= 0).flatten().tolist():
        p, r = int(s["positions"][i]), int(s["token_to_req"][i])
        kvs, scores = [], []
        for k in range(window):
            q = p - window + 1 + k
            if q < 0:
                continue
            ho = 512 if overlap and k >= ratio else 0
            row = sc[int(s["block_table"][r, q // sb]), q % sb]
            kvs.append(row[ho:ho + 512])
            scores.append(row[w + ho:w + ho + 512])
        rows.append((torch.softmax(torch.stack(scores), dim=0) * torch.stack(kvs)).sum(0))
    return torch.stack(rows)


def _pool_norm_rope(s: dict, ratio: int) -> Any:
    """What a compressed cache row holds before quantization, float64: the pooled row, RMSNorm (eps, weight), then
    GPT-J RoPE on the last 64 dims at position (P // ratio) * ratio with cos_sin_cache = [cos | sin]
    (models/deepseek_v4/compressor.py `_compress_norm_rope_store`)."""
    import torch

    pooled = _softmax_pool(s, ratio)
    normed = pooled * torch.rsqrt((pooled ** 2).mean(-1, keepdim=True) + s["eps"]) * s["rms_w"].double()
    out = normed.clone()
    for j, i in enumerate(torch.nonzero(s["kv_slot_mapping"] >= 0).flatten().tolist()):
        p = int(s["positions"][i])
        cs = s["cos_sin"][(p // ratio) * ratio].double()
        cos, sin = cs[:32], cs[32:]
        even, odd = normed[j, 448::2], normed[j, 449::2]
        out[j, 448::2] = even * cos - odd * sin
        out[j, 449::2] = odd * cos + even * sin
    return out


FAMILIES = (  # the owners each case builder covers
    (router_cases, ("ll_bf16_gemm_kernel", "ll_bf16_gemm_c1_pdl_kernel")),
    (dequant_gather_cases, ("_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL",)),
    (indexer_q_cases, ("_INDEXER_Q_FP8_KERNEL",)),
    (compressor_cases, ("_SPARSE_ATTN_COMPRESS_NORM_ROPE_STORE_C4_KERNEL", "_SPARSE_ATTN_COMPRESS_C128_BLOCK8_KERNEL",
                        "_SPARSE_ATTN_NORM_ROPE_STORE_KERNEL")),
)


def build_cases(entries: list[dict], fns: dict, ref_ops: Any, only: str | None = None) -> list[Case]:
    """Every family's cases; a family whose inputs or reference fail becomes one failing case naming the error
    (its entries then count as not launched). `only` (--references-only): a comma list of builder names."""
    cases = []
    for build, owners in FAMILIES:
        if only and build.__name__ not in only.split(","):
            continue
        try:
            cases += build(entries, fns) if build is router_cases else build(entries, fns, ref_ops)
        except Exception as exc:  # noqa: BLE001 - reported as a failed case
            message = f"building the inputs or the reference failed: {type(exc).__name__}: {str(exc)[:600]}"

            def fail(message: str = message) -> None:
                raise RuntimeError(message)

            cases.append(Case(f"{build.__name__} ({', '.join(owners)})", [], fail, dict))
    return cases


# ---------------------------------------------------------------- phase 2: the calls, hooked
class ProcessCounter:
    def __init__(self) -> None:
        self.armed = False
        self.events: list[str] = []

    def __call__(self, event: str, args: tuple) -> None:
        if self.armed and event.startswith(PROCESS_EVENTS):
            self.events.append(f"{event} {str(args)[:160]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=os.path.join(ROOT, ".device-cu"))
    ap.add_argument("--json")
    ap.add_argument("--link-only", action="store_true", help="no GPU: unpack, verify, link and load every object")
    ap.add_argument("--list-sources", action="store_true")
    ap.add_argument("--references-only", action="store_true",
                    help="build every case and compute its reference, call nothing (CPU: TRITON_INTERPRET=1)")
    ap.add_argument("--families", help="with --references-only: only these case builders (comma list)")
    ap.add_argument("--vllm-src")
    args = ap.parse_args()
    if args.list_sources:
        print(json.dumps({"files": list_sources(args.vllm_src)}))
        return 0
    manifest = load_manifest(args.dir)
    work = tempfile.mkdtemp(prefix="nojit-cute-link-")
    t0 = time.perf_counter()
    entries, fns = link_and_load(args.dir, manifest, work)
    print(f"linked and loaded {len(entries)} CuTeDSL objects with g++ against {RUNTIME_LIB} and libtvm_ffi "
          f"({time.perf_counter() - t0:.1f}s); each is a {type(next(iter(fns.values()))[1]).__name__}", flush=True)
    if args.link_only:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"entries": entries}, f, indent=1)
        return 0

    import torch

    cutlass_here = importlib.util.find_spec("cutlass") is not None
    finder = mount_vllm(os.path.join(args.dir, "vllm_src"))
    ref_ops = types.SimpleNamespace()
    for name in REFERENCE_MODULES:
        m = importlib.import_module(name)
        for attr in ("dequantize_and_gather_k_cache", "fused_indexer_q_rope_quant", "compress_norm_rope_store_triton"):
            if hasattr(m, attr):
                setattr(ref_ops, attr, getattr(m, attr))
    ref_ops.has_cutedsl = importlib.import_module("vllm.utils.import_utils").has_cutedsl  # what vLLM's wrappers ask
    if args.references_only and cutlass_here:  # the build box (CPU validation): make vLLM's wrappers take Triton
        for name in REFERENCE_MODULES:
            if hasattr(sys.modules[name], "has_cutedsl"):
                sys.modules[name].has_cutedsl = lambda: False
        ref_ops.has_cutedsl = lambda: False
    if args.references_only:
        t1 = time.perf_counter()
        cases = build_cases(entries, fns, ref_ops, args.families)
        print(f"{len(cases)} cases built, references computed on {DEV} ({time.perf_counter() - t1:.1f}s; "
              f"{len(finder.loaded)} vLLM files mounted); nothing called")
        for case in cases:
            print(f"  {case.name}: {' '.join(s[:22] for s in case.symbols) or 'NO ENTRY (reference failed)'}")
            if not case.symbols:
                try:
                    case.run()
                except RuntimeError as exc:
                    print(f"    {exc}")
        return 0 if all(case.symbols for case in cases) else 1
    torch.cuda.init()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # inputs and references on the stream the calls run on
        t1 = time.perf_counter()
        cases = build_cases(entries, fns, ref_ops)
        torch.cuda.synchronize()
        print(f"{len(cases)} cases built, references computed ({time.perf_counter() - t1:.1f}s; "
              f"{len(finder.loaded)} vLLM files mounted)", flush=True)

        counter = ProcessCounter()
        sys.addaudithook(counter)
        counter.armed = True  # from here on: the CuTeDSL calls only
        os.access("/nojit-cutedsl-calls-begin", os.F_OK)  # markers for device_run.sh's exec trace (C-level starts)
        results = []
        for case in cases:
            try:
                case.run()
                torch.cuda.synchronize()
                r = case.check()
                if case.spoil is not None:  # the control: one wrong value must be rejected
                    case.spoil()
                    r["control_rejected"] = not case.check()["ok"]
            except Exception as exc:  # noqa: BLE001 - reported per case
                r = {"ok": False, "written": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            r.update(case=case.name, symbols=case.symbols)
            results.append(r)
        os.access("/nojit-cutedsl-calls-end", os.F_OK)
        counter.armed = False

    launched = {s for r in results if "error" not in r for s in r["symbols"]}
    not_launched = [e for e in entries if e["symbol"] not in launched]
    cutlass_imported = any(m == "cutlass" or m.startswith("cutlass.") for m in sys.modules)
    for r in results:
        detail = {k: v for k, v in r.items() if k not in ("case", "symbols", "ok")}
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['case']}: " + ", ".join(
            f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in detail.items()))
    passed = sum(r["ok"] for r in results)
    controls = [r.get("control_rejected") for r in results if "control_rejected" in r]
    print(f"entries launched: {len(launched)}/{len(entries)}"
          + (f" (not launched: {', '.join(e['owner'] + ' ' + e['symbol'] for e in not_launched)})" if not_launched else ""))
    print(f"controls (one wrong value put into each case's output): {sum(controls)}/{len(controls)} rejected")
    print(f"processes started during the calls: {len(counter.events)}; compiles: 0 possible (cutlass importable: "
          f"{cutlass_here}, imported: {cutlass_imported}; CUDA_DISABLE_PTX_JIT={os.environ.get('CUDA_DISABLE_PTX_JIT')})")
    ok = (passed == len(results) and all(controls) and len(controls) == len(results) and not not_launched and not counter.events and not cutlass_here
          and not cutlass_imported and os.environ.get("CUDA_DISABLE_PTX_JIT") == "1")
    print(f"CUTEDSL-LAUNCH: {'PASS' if ok else 'FAIL'} ({passed}/{len(results)} cases)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"entries": entries, "results": results, "processes": counter.events,
                       "cutlass_importable": cutlass_here, "pass": ok}, f, indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
