"""TensorRT-LLM DeepGEMM inside fp8_blockscale_gemm_90: its kernels built on the build box by its own JIT.

For M < 32, FlashInfer's block-FP8 GEMM asks TensorRT-LLM DeepGEMM (FlashInfer's copy, compiled into the
module) for a kernel per (N, K, tile config): `Compiler::build` looks for
`$TRTLLM_DG_CACHE_DIR/cache/<name>/nvcc_kernel.cubin` (the RuntimeCache lookup, runtime.cuh:136-160) and
otherwise writes kernel.cu and runs nvcc through libc popen (compiler.cuh:255-262, 339-370). The name
holds N, K and the tile config only, no compiler version or path, so a cubin made here is found there.

The build compiles trtllm_deepgemm/driver.cu against FlashInfer's installed headers (and the four
TensorRT-LLM common sources FlashInfer compiles into that module) and runs it: `configs` asks FlashInfer's
own heuristic which config each M in 1..31 gets (at plan time), `build` runs FlashInfer's own Compiler::build for
one with the real nvcc. One request per (N, K, tile config) of vLLM's block-FP8 linears that take FlashInfer's path
(vLLM's own rule, utils/flashinfer.py:1205), its key naming the M it serves; the bundle stores each cubin under its
cache name.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import subprocess
import tempfile
from typing import Any

from nojit.aot.errors import BuildError
from nojit.loader.strict.toolchain import find_tool

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trtllm_deepgemm")
COMMON_SOURCES = ("envUtils.cpp", "logger.cpp", "stringUtils.cpp", "tllmException.cpp")  # fp8_blockscale.py:28-31
KERNEL_ID = "flashinfer.gemm.gemm_base:fp8_blockscale_gemm_sm90"  # what vLLM calls (utils/flashinfer.py:1181)


def shapes(linears: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (N, K) of the model's block-FP8 linears that vLLM sends to FlashInfer for M < 32 (vLLM's own rule)."""
    import torch
    from vllm.utils.flashinfer import should_use_flashinfer_for_blockscale_fp8_gemm

    return sorted({(n, k) for n, k in linears if should_use_flashinfer_for_blockscale_fp8_gemm(
        True, torch.bfloat16, torch.bfloat16, torch.float8_e4m3fn, (n, k))})


def _data_dir() -> str:
    from flashinfer.jit import env as jit_env

    return str(jit_env.FLASHINFER_DATA)


def jit_include_dir() -> str:
    """What FlashInfer hands the JIT (gemm/gemm_base.py:11933-11936); passed to nvcc as -I, not in the name."""
    return os.path.join(_data_dir(), "csrc", "nv_internal", "tensorrt_llm")


def headers_digest(version: str) -> str:
    """FlashInfer's version, the DeepGEMM headers the generated kernel includes and the driver's source."""
    h = hashlib.sha256(version.encode())
    for path in sorted(glob.glob(os.path.join(jit_include_dir(), "deep_gemm", "*"))) + [
            os.path.join(HERE, "driver.cu"), os.path.join(HERE, "device.c")]:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if done.returncode != 0:
        output = (done.stderr or done.stdout)[-2000:]
        raise BuildError(f"{os.path.basename(cmd[0])} failed ({done.returncode}): {output}",
                         fix="see the message; the build box needs nvcc and a C compiler")
    return done


def driver(root: str, pip_cuda: str | None, digest: str) -> str:
    """The driver executable, built once per digest under the FlashInfer work directory (file-locked)."""
    folder = os.path.join(root, f"trtllm-driver-{digest[:16]}")
    exe = os.path.join(folder, "driver")
    if os.path.exists(exe):
        return exe
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"cannot make {folder} for TensorRT-LLM DeepGEMM's build driver: {exc}",
                         fix="give `nojit build --cache-dir` a writable folder (or set NOJIT_FLASHINFER_BUILD_DIR)") from None
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(exe):
            return exe
        nvcc, cc = find_tool("nvcc"), find_tool("cc") or find_tool("gcc")
        if nvcc is None or cc is None:
            raise BuildError("TensorRT-LLM DeepGEMM's kernels need nvcc and cc on the build box (planning asks "
                             "FlashInfer's tile-config heuristic through a driver built with them)",
                             fix="install the CUDA toolkit and gcc, or build without FlashInfer (leave flashinfer out of "
                                 "--runtime) and serve with VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER=0")
        data = _data_dir()
        nv = os.path.join(data, "csrc", "nv_internal")
        inc = ["-I" + nv, "-I" + os.path.join(nv, "include"), "-I" + os.path.join(data, "include"),
               "-I" + os.path.join(data, "csrc"), "-isystem", os.path.join(data, "spdlog", "include")]
        if pip_cuda:
            inc += ["-isystem", os.path.join(pip_cuda, "include")]
        obj = os.path.join(folder, "driver.o")
        _run([nvcc, "-std=c++17", "-c", *inc, os.path.join(HERE, "driver.cu"), "-o", obj])
        # libcuda.so for the link: the driver entry points the headers reference (never called here)
        syms = sorted({line.split()[-1] for line in _run(["nm", "-u", obj]).stdout.splitlines()
                       if line.split()[-1][:2] == "cu" and line.split()[-1][2:3].isupper()})
        stub_c = os.path.join(folder, "libcuda_stub.c")
        with open(stub_c, "w") as f:
            f.write("".join(f"int {s}(void) {{ return 999; }}\n" for s in syms))
        lib = os.path.join(folder, "lib")
        os.makedirs(lib, exist_ok=True)
        _run([cc, "-shared", "-o", os.path.join(lib, "libcuda.so"), stub_c, "-Wl,-soname,libcuda.so.1"])
        if not os.path.lexists(os.path.join(lib, "libcuda.so.1")):
            os.symlink("libcuda.so", os.path.join(lib, "libcuda.so.1"))  # what the driver loads (never calls)
        link = [f"-L{lib}"]
        if pip_cuda:
            nvrtc = sorted(glob.glob(os.path.join(pip_cuda, "lib", "libnvrtc.so.*")))
            if nvrtc and not os.path.lexists(os.path.join(lib, "libnvrtc.so")):
                os.symlink(nvrtc[0], os.path.join(lib, "libnvrtc.so"))
        tmp = exe + f".{os.getpid()}"
        _run([nvcc, "-std=c++17", "-cudart", "shared", *inc, obj, os.path.join(HERE, "device.c"),
              *(os.path.join(nv, "cpp", "common", s) for s in COMMON_SOURCES), "-o", tmp, *link, "-lnvrtc", "-lcuda"])
        os.replace(tmp, exe)
    return exe


def driver_env(exe: str, pip_cuda: str | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ, **extra)
    libs = [os.path.join(os.path.dirname(exe), "lib"), *([os.path.join(pip_cuda, "lib")] if pip_cuda else [])]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
    return env


def configs(exe: str, pip_cuda: str | None, n: int, k: int, sm_count: int) -> list[dict[str, Any]]:
    """The tile configs FlashInfer's own heuristic gives (N, K) over M in 1..31 (get_best_gemm_config, run by the
    driver), each with the range of M it serves: one kernel each. Qwen3.5's in_proj_qkvz and qkv_proj get three
    (block_n 16 / 24 / 32 for M 1-16 / 17-24 / 25-31); DeepSeek-V4's linears one."""
    lines = _run([exe, "configs", jit_include_dir(), str(sm_count), str(n), str(k)], env=driver_env(exe, pip_cuda))
    by: dict[tuple[int, ...], list[int]] = {}
    for line in lines.stdout.split("\n"):
        if line.strip():
            m, *config = map(int, line.split())
            by.setdefault(tuple(config), []).append(m)
    out = []
    for (bm, bn, stages, multicast), ms in sorted(by.items(), key=lambda item: item[1][0]):
        if ms != list(range(ms[0], ms[-1] + 1)):
            raise BuildError(f"TensorRT-LLM DeepGEMM gives N={n} K={k} tile config {bm}x{bn} for M {ms}, not one "
                             "run of M", fix="report this shape to nojit (the key names one range of M per config)")
        out.append({"n": n, "k": k, "block_m": bm, "block_n": bn, "stages": stages, "multicast": multicast,
                    "m": [ms[0], ms[-1]]})
    return out


def compile_config(exe: str, pip_cuda: str | None, key: dict[str, Any]) -> tuple[str, bytes]:
    """One tile config of (N, K) (a key of `configs`) built by FlashInfer's Compiler: its cache name and cubin."""
    if not all(f in key for f in ("block_m", "block_n", "stages", "multicast")):
        raise BuildError(f"TensorRT-LLM DeepGEMM key {key} names no tile config: the plan predates nojit's per-config "
                         "keys", fix="plan again with this nojit (`nojit build --emit-plan`), then --from-plan")
    nvcc = find_tool("nvcc") or "nvcc"
    n, k = key["n"], key["k"]
    with tempfile.TemporaryDirectory(prefix="nojit-trtllm-") as cache:
        _run([exe, "build", jit_include_dir(), str(n), str(k), str(key["block_m"]), str(key["block_n"]),
              str(key["stages"]), str(key["multicast"])],
             env=driver_env(exe, pip_cuda, TRTLLM_DG_CACHE_DIR=cache, TRTLLM_DG_NVCC_COMPILER=nvcc, HOME=cache))
        found = glob.glob(os.path.join(cache, "cache", "*", "nvcc_kernel.cubin"))
        if len(found) != 1:
            raise BuildError(f"TensorRT-LLM DeepGEMM's build for N={n} K={k} left {len(found)} cubins",
                             fix="run the driver by hand with TRTLLM_DG_JIT_DEBUG=1 to see nvcc's output")
        with open(found[0], "rb") as f:
            cubin = f.read()
        return os.path.basename(os.path.dirname(found[0])), cubin
