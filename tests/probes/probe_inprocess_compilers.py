"""Runs one in-process compiler form in a fresh process and prints what it produced, as one JSON line.

    python tests/probes/probe_inprocess_compilers.py FORM strict|off

FORM: nvrtc-bindings (cuda.bindings.nvrtc, the module attribute), nvrtc-bindings-captured (the same function
taken before strict mode went up: reaches the C entry), nvrtc-ctypes (libnvrtc loaded with ctypes before
strict mode), nvrtc-ctypes-later (loaded after), nvjitlink-ctypes (PTX made by NVRTC first, then nvJitLink to
an sm_90 cubin), nvjitlink-bindings (cuda.bindings.nvjitlink). With `strict`, strict mode's guards go up
(guards.install_strict_guards) before the compile and come down after it, and the same compile is then
run again (`after_uninstall`), so reversibility is shown in the same process. None of it needs a GPU.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import sys

SOURCE = b'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }'
ARCH = b"--gpu-architecture=sm_90"


def nvidia_lib(pattern: str) -> str:
    import nvidia.cu13  # the nvidia-cuda-nvrtc / nvidia-nvjitlink wheels vLLM's torch depends on

    found = sorted(glob.glob(os.path.join(list(nvidia.cu13.__path__)[0], "lib", pattern)))
    if not found:
        raise SystemExit(f"no {pattern} in the nvidia wheels")
    if "nvrtc" in pattern:  # NVRTC dlopens its builtins by soname, which the wheel's folder is not searched for
        ctypes.CDLL(sorted(glob.glob(os.path.join(os.path.dirname(found[0]), "libnvrtc-builtins.so.*")))[0])
    return found[0]


def ctypes_nvrtc(lib: ctypes.CDLL, ptx: bool = False) -> dict:
    prog = ctypes.c_void_p()
    assert lib.nvrtcCreateProgram(ctypes.byref(prog), SOURCE, b"twice.cu", 0, None, None) == 0
    opts = (ctypes.c_char_p * 1)(b"--gpu-architecture=compute_90" if ptx else ARCH)
    rc = lib.nvrtcCompileProgram(prog, 1, opts)
    out = b""
    if rc == 0:
        size = ctypes.c_size_t()
        get_size, get = (lib.nvrtcGetPTXSize, lib.nvrtcGetPTX) if ptx else (lib.nvrtcGetCUBINSize, lib.nvrtcGetCUBIN)
        assert get_size(prog, ctypes.byref(size)) == 0
        buf = ctypes.create_string_buffer(size.value)
        assert get(prog, buf) == 0
        out = buf.raw
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return {"rc": rc, "output": out}


def bindings_nvrtc(compile_fn) -> dict:
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(SOURCE, b"twice.cu", 0, [], [])
    rc, = compile_fn(prog, 1, [ARCH])
    out = b""
    if int(rc) == 0:
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetCUBIN(prog, buf)
        out = buf
    return {"rc": int(rc), "output": out}


def ctypes_nvjitlink(lib: ctypes.CDLL, ptx: bytes) -> dict:
    handle = ctypes.c_void_p()
    opts = (ctypes.c_char_p * 1)(b"-arch=sm_90")
    assert lib.nvJitLinkCreate(ctypes.byref(handle), 1, opts) == 0
    rc_add = lib.nvJitLinkAddData(handle, 2, ptx, len(ptx), b"twice.ptx")  # NVJITLINK_INPUT_PTX
    rc = lib.nvJitLinkComplete(handle) if rc_add == 0 else rc_add
    out = b""
    if rc == 0:
        size = ctypes.c_size_t()
        assert lib.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size)) == 0
        buf = ctypes.create_string_buffer(size.value)
        assert lib.nvJitLinkGetLinkedCubin(handle, buf) == 0
        out = buf.raw
    lib.nvJitLinkDestroy(ctypes.byref(handle))
    return {"rc": rc, "rc_add": rc_add, "output": out}


def bindings_nvjitlink(ptx: bytes) -> dict:
    from cuda.bindings import nvjitlink

    handle = nvjitlink.create(1, ["-arch=sm_90"])
    nvjitlink.add_data(handle, nvjitlink.InputType.PTX, ptx, len(ptx), "twice.ptx")
    nvjitlink.complete(handle)
    size = nvjitlink.get_linked_cubin_size(handle)
    buf = bytearray(size)
    nvjitlink.get_linked_cubin(handle, buf)
    nvjitlink.destroy(handle)
    return {"rc": 0, "output": bytes(buf)}


def cubin_sm(image: bytes) -> int | None:
    """The SM a CUDA ELF (cubin) is for: e_flags bits 8-15 under CUDA's ELF ABI v2 (OSABI 0x41), else bits 0-7."""
    if len(image) < 64 or image[:4] != b"\x7fELF":
        return None
    flags = int.from_bytes(image[48:52], "little")
    return (flags >> 8) & 0xFF if image[7] == 0x41 else flags & 0xFF


def run(form: str, strict: bool) -> dict:
    from nojit.loader.strict import guards
    from nojit.loader.strict import inprocess_guard
    from nojit.loader.errors import CompileForbiddenError

    prepared: dict = {}
    if form in ("nvrtc-ctypes", "nvjitlink-ctypes", "nvjitlink-bindings"):
        prepared["nvrtc"] = ctypes.CDLL(nvidia_lib("libnvrtc.so.*"))
    if form.startswith("nvjitlink"):
        prepared["ptx"] = ctypes_nvrtc(prepared["nvrtc"], ptx=True)["output"].rstrip(b"\0")
        if form == "nvjitlink-ctypes":
            prepared["jitlink"] = ctypes.CDLL(nvidia_lib("libnvJitLink.so.*"))
    if form == "nvrtc-bindings-captured":
        from cuda.bindings import nvrtc

        prepared["fn"] = nvrtc.nvrtcCompileProgram

    def attempt() -> dict:
        try:
            if form == "nvrtc-ctypes":
                return ctypes_nvrtc(prepared["nvrtc"])
            if form == "nvrtc-ctypes-later":
                return ctypes_nvrtc(ctypes.CDLL(nvidia_lib("libnvrtc.so.*")))
            if form == "nvrtc-bindings":
                from cuda.bindings import nvrtc

                return bindings_nvrtc(lambda *a: nvrtc.nvrtcCompileProgram(*a))
            if form == "nvrtc-bindings-captured":
                return bindings_nvrtc(prepared["fn"])
            if form == "nvjitlink-ctypes":
                return ctypes_nvjitlink(prepared["jitlink"], prepared["ptx"])
            if form == "nvjitlink-bindings":
                return bindings_nvjitlink(prepared["ptx"])
        except CompileForbiddenError as exc:
            return {"forbidden": exc.message, "output": b""}
        except Exception as exc:  # cuda.bindings raises its own error for a failed status
            return {"error": f"{type(exc).__name__}: {exc}", "output": b""}
        raise SystemExit(f"unknown form {form}")

    def describe(result: dict) -> dict:
        out = result.pop("output")
        return {**result, "magic": out[:4].hex(), "size": len(out), "sm": cubin_sm(out)}

    if not strict:
        return {"form": form, "strict": False, "result": describe(attempt())}
    guards.install_strict_guards()
    patched = [os.path.basename(lib) + ":" + sym for lib, sym in inprocess_guard.report().patched]
    env = os.environ.get("CUDA_DISABLE_PTX_JIT")
    result = describe(attempt())
    refused_in_c = inprocess_guard.refusals()
    guards.deactivate()
    after = describe(attempt())
    return {"form": form, "strict": True, "result": result, "patched": patched, "c_refusals": refused_in_c,
            "ptx_jit_env": env, "env_after": os.environ.get("CUDA_DISABLE_PTX_JIT"), "after_uninstall": after}


if __name__ == "__main__":
    print(json.dumps(run(sys.argv[1], sys.argv[2] == "strict")))
