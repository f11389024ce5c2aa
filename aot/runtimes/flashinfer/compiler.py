"""Compile one FlashInfer module with FlashInfer's own AOT builder, in a build worker.

`flashinfer.aot.compile_and_package_modules` builds every module FlashInfer knows; nojit runs the same
two steps on the deployment's modules only: `build_jit_specs` (jit/core.py:826: writes FlashInfer's
build.ninja and runs ninja, which runs nvcc and c++) into a work directory that replaces FlashInfer's
JIT directory, then `copy_built_kernels` (aot.py:1215), which lays the result out as a jit-cache
provider does: <name>/<name>.so. The .so is what the bundle stores.

The work directory persists (NOJIT_FLASHINFER_BUILD_DIR, else <cache dir>/flashinfer/<version>-<arch>-<toolchain>,
the last a digest of nvcc's release and the host compiler: ninja sees changed sources and command lines, not a
compiler replaced in place), so ninja rebuilds nothing that is up to date; one module's ninja runs under a file
lock, so parallel builds sharing the folder never run ninja in one module's directory at once. ninja runs
one job (MAX_JOBS, default 1 here): the build already runs one module per worker. The build's compile cache
(planner.cache_inputs) finds a module built before without reaching this folder at all.

A toolkit without curand.h (a pip-only CUDA) or without lib64/stubs/libcuda.so (no driver on a build box)
gets what FlashInfer's own build needs through FlashInfer's own variables: FLASHINFER_EXTRA_CUDAFLAGS and
FLASHINFER_EXTRA_CFLAGS add the pip CUDA headers after the toolkit's, FLASHINFER_EXTRA_LDFLAGS a directory with a link-time
libcuda.so (SONAME libcuda.so.1, no code: the driver's own library answers at run time) and libnvrtc.so
(the pip NVRTC); --no-as-needed keeps libcuda.so.1 in each module's DT_NEEDED, as linking against the
toolkit's stub does. What was added is recorded with the module.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import pathlib
import subprocess
import tempfile
import time
from importlib.metadata import version as package_version
from typing import Any

from nojit.aot.errors import BuildError
from nojit.aot.runtimes.flashinfer.specs import cuda_architecture, flashinfer_target, make_spec, spec_digest
from nojit.loader.strict.toolchain import find_tool


def build_root(cache_dir: str, arch: str) -> str:
    digest = hashlib.sha256(json.dumps(toolchain(), sort_keys=True).encode()).hexdigest()[:12]
    return os.environ.get("NOJIT_FLASHINFER_BUILD_DIR") or os.path.join(
        cache_dir, "flashinfer", f"{package_version('flashinfer-python')}-{arch}-{digest}")


@functools.cache
def toolchain() -> dict[str, Any] | None:
    """What compiles a module besides its sources and flags: nvcc's release, the host compiler FlashInfer runs
    ($CXX, else c++: jit/cpp_ext.py), the TVM-FFI headers, torch and the pip CUDA it pins. None without nvcc."""
    nvcc = find_tool("nvcc")
    if nvcc is None:
        return None
    try:
        cxx = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        cxx = ""
    return {"nvcc": nvcc_release(nvcc), "cxx": cxx.strip().splitlines()[:1],
            "apache-tvm-ffi": package_version("apache-tvm-ffi"), "torch": package_version("torch"),
            "pip_cuda": os.path.basename(pip_cuda_dir() or "")}


def pip_cuda_dir() -> str | None:
    try:
        import nvidia

        for base in nvidia.__path__:
            for sub in ("cu13", "cu12"):
                if os.path.isdir(os.path.join(base, sub, "include")):
                    return os.path.join(base, sub)
    except ImportError:
        pass
    return None


def _link_stub_dir(root: str, pip_cuda: str | None) -> str:
    """libcuda.so (SONAME libcuda.so.1, empty) and libnvrtc.so for the link step; made once, never touched again
    (ninja does not track them, so a rebuild of the stub relinks nothing)."""
    link = os.path.join(root, "link")
    os.makedirs(link, exist_ok=True)
    stub = os.path.join(link, "libcuda.so")
    if not os.path.exists(stub):
        cc = find_tool("cc") or find_tool("gcc")
        if cc is None:
            raise BuildError("no C compiler to make the link-time libcuda.so", fix="install gcc on the build box")
        tmp = stub + f".{os.getpid()}.tmp"
        subprocess.run([cc, "-shared", "-x", "c", "-", "-Wl,-soname,libcuda.so.1", "-o", tmp], input=b"",
                       check=True, capture_output=True)
        os.replace(tmp, stub)
    nvrtc = os.path.join(link, "libnvrtc.so")
    if not os.path.lexists(nvrtc) and pip_cuda:
        for name in sorted(os.listdir(os.path.join(pip_cuda, "lib"))):
            if name.startswith("libnvrtc.so."):
                os.symlink(os.path.join(pip_cuda, "lib", name), nvrtc)
                break
    return link


def toolkit_gaps(cuda_home: str, root: str) -> dict[str, str]:
    """FLASHINFER_EXTRA_CUDAFLAGS / FLASHINFER_EXTRA_LDFLAGS for what this toolkit lacks (module docstring)."""
    extra: dict[str, str] = {}
    pip_cuda = pip_cuda_dir()
    if not os.path.exists(os.path.join(cuda_home, "include", "curand.h")) and pip_cuda:
        # both the nvcc and the c++ sources include CUDA library headers (curand.h, cublasLt.h)
        extra["FLASHINFER_EXTRA_CUDAFLAGS"] = f"-isystem {os.path.join(pip_cuda, 'include')}"
        extra["FLASHINFER_EXTRA_CFLAGS"] = f"-isystem {os.path.join(pip_cuda, 'include')}"
    if not os.path.exists(os.path.join(cuda_home, "lib64", "stubs", "libcuda.so")):
        extra["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{_link_stub_dir(root, pip_cuda)} -Wl,--no-as-needed"
    return extra


def toolkit_root(nvcc: str) -> str:
    """CUDA_HOME, else the toolkit nvcc itself says it runs from (`nvcc --dryrun` prints _HERE_=<toolkit>/bin):
    the nvcc on PATH may be a wrapper script outside the toolkit (here /usr/local/bin/nvcc execs the real one),
    and FlashInfer takes the toolkit's include/ and lib64/ from CUDA_HOME (jit/cpp_ext.py:47-63, 274-279)."""
    if os.environ.get("CUDA_HOME"):
        return os.environ["CUDA_HOME"]
    out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], capture_output=True,
                         text=True).stderr
    for line in out.splitlines():
        if line.startswith("#$ _HERE_="):
            return os.path.dirname(line.split("=", 1)[1].strip())
    return os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))


def nvcc_gpu_archs(nvcc: str) -> list[str]:
    """`nvcc --list-gpu-arch`, which FlashInfer's gen functions ask (compilation_context.py:55-68)."""
    out = subprocess.run([nvcc, "--list-gpu-arch"], capture_output=True, text=True).stdout
    return sorted(out.split())


def nvcc_release(nvcc: str) -> str:
    """The line of `nvcc --version` FlashInfer reads its CUDA version from (jit/cpp_ext.py:68-79)."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return next((line.strip() for line in out.splitlines() if "release" in line), out.strip().splitlines()[-1])


def compile_module(gen: str, name: str, capability: tuple[int, int], cache_dir: str) -> tuple[bytes, dict[str, Any]]:
    """Build `name` with FlashInfer's builder; returns the .so and what the bundle records of the build."""
    nvcc = find_tool("nvcc")
    if nvcc is None:
        raise BuildError("FlashInfer modules need nvcc on the build box", fix="install the CUDA toolkit (nvcc 13.0) "
                         "and set CUDA_HOME, or build without them (--runtime triton,tilelang)")
    cuda_home = toolkit_root(nvcc)
    arch = cuda_architecture(capability)
    root = build_root(cache_dir, arch)
    os.environ.setdefault("CUDA_HOME", cuda_home)
    os.environ.setdefault("MAX_JOBS", "1")
    gaps = toolkit_gaps(os.environ["CUDA_HOME"], root)
    os.environ.update(gaps)
    from flashinfer.aot import copy_built_kernels
    from flashinfer.jit import build_jit_specs
    from flashinfer.jit import env as jit_env

    work = os.path.join(root, "w")
    jit_env.FLASHINFER_WORKSPACE_DIR = pathlib.Path(work)
    jit_env.FLASHINFER_JIT_DIR = jit_env.FLASHINFER_WORKSPACE_DIR / "cached_ops"
    jit_env.FLASHINFER_GEN_SRC_DIR = jit_env.FLASHINFER_WORKSPACE_DIR / "generated"
    jit_env.FLASHINFER_JIT_DIR.mkdir(parents=True, exist_ok=True)
    jit_env.FLASHINFER_GEN_SRC_DIR.mkdir(parents=True, exist_ok=True)
    version = package_version("flashinfer-python")
    with flashinfer_target(capability):
        spec = make_spec(gen, name)
        t0 = time.perf_counter()
        with open(os.path.join(work, f".{name}.lock"), "w") as lock:  # one ninja per module directory at a time
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                build_jit_specs([spec], verbose=False, skip_prebuilt=False)
            except RuntimeError as exc:
                raise BuildError(f"FlashInfer module {name} did not build: {str(exc)[-2000:]}",
                                 fix="see ninja's output; the toolchain must be a CUDA FlashInfer supports") from None
            seconds = time.perf_counter() - t0
            digest = spec_digest(spec, version)
            with tempfile.TemporaryDirectory(prefix="nojit-flashinfer-") as out:
                package = os.path.join(out, "aot")
                copy_built_kernels([spec], pathlib.Path(package))
                with open(os.path.join(package, name, f"{name}.so"), "rb") as f:
                    data = f.read()
    info = {
        "flashinfer_version": version, "module": name, "gen": gen, "cuda_arch": arch, "spec_sha256": digest,
        "nvcc": nvcc_release(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")),
        "nvcc_gpu_archs": nvcc_gpu_archs(os.path.join(os.environ["CUDA_HOME"], "bin", "nvcc")),
        "toolkit_gaps": {k: v.replace(root, "<build>").replace(cuda_home, "<cuda>") for k, v in sorted(gaps.items())},
    }
    print(f"nojit: FlashInfer module {name} built in {seconds:.1f} s ({len(data)} bytes)", flush=True)
    return data, info
