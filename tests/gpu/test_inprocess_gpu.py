"""On the GPU: the driver's PTX JIT under strict mode, written as the attack, with its positive control.

Each side runs in a fresh process (the driver reads CUDA_DISABLE_PTX_JIT once, at cuInit):
- `off`: no strict mode. A hand-written sm_90 PTX module loads with cuModuleLoadData, cuModuleLoadDataEx,
  cuLibraryLoadData, cuModuleLoad and cuLibraryLoadFromFile of the exported libcuda (ctypes), through what
  cuGetProcAddress hands out, through cudart's cudaLibraryLoadData and through cuda.bindings.driver, and the
  driver's linker takes the same PTX (cuLinkAddData_v2) and links a cubin: the control, so the strict side can fail.
- `strict`: strict mode's guards up before cuInit. Every one of those PTX loads is refused: cuda.bindings raises
  CompileForbiddenError, the C entries answer CUDA_ERROR_JIT_COMPILATION_DISABLED (223) from nojit's stubs with an
  event line (CUDA_DISABLE_PTX_JIT=1 alone did not stop a raw PTX image already in the driver's JIT cache on the H200,
  driver 580.159.04: test_what_cuda_disable_ptx_jit_does_with_an_empty_and_a_filled_jit_cache); the linker
  answers 223 too; a cubin (made by NVRTC in its own process, when the nvidia-cuda-nvrtc wheel is there) loads
  through every entry as with strict mode off, and its kernel, loaded through the patched cuModuleLoadData (the
  trampoline to the original), runs and writes its value over a poisoned buffer.
- `late`: CUDA initialized before strict mode. The report says the PTX JIT stays on in this process; the
  linker entry and the raw PTX load are refused all the same (the patch reaches the live driver).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = r'''
import ctypes, glob, json, os, sys
mode = sys.argv[1]
PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry twice(.param .u64 x) { ret; }
""" + b"\0"
# `fatbinary --create=tw.fatbin -64 --compress=false --image3=kind=ptx,sm=90,file=tw.ptx` (CUDA 13.0) of PTX above
PTX_FATBIN = ("50ed55ba01001000b000000000000000010001015000000060000000000000000000000040000000000008005a00000000000000"
              "00000000110000000000000000000000000000000000000000000000480000000000000000000000000000002e76657273696f6e"
              "20382e300a2e74617267657420736d5f39300a2e616464726573735f73697a652036340a2e76697369626c65202e656e7472"
              "79207477696365282e706172616d202e753634207829207b207265743b207d0a000000000000")
# `fatbinary -64 --compress-all --create=k.fatbin --image3=kind=ptx,sm=90,file=k.ptx --image3=kind=elf,sm=90,file=k.cubin`
# (CUDA 13.0; k.ptx from `nvcc -ptx -arch=compute_90`, k.cubin from `ptxas -arch=sm_90 k.ptx`) of
# extern "C" __global__ void k(float* x) { x[0] = 2.0f; }
SASS_FATBIN = ("50ed55ba01001000f0040000000000000100010150000000c800000000000000c600000040000000000009005a00000000000000"
               "000000001180000000000000000000000000000006010000000000004800000000000000000000000000000028b52ffd600600e5"
               "0500528b25216067ab0330551f444e3f7e244b428a1a2508027c37ea37d95bb6af730a8288a80e007fc2df26f75b522454ad29df"
               "981a48acb00a2829921afb38cd1ba298a738ccb2cedc371f823745429104fb80ccff865807d887b2a421d4a10f554b595db8f708"
               "1738726ea12c69ac36af5fc13e60a1063d19bcca8c12656489f241944e4a6e08df1e195c2375f2d26feed11a94e144d9fcec030d"
               "005885b82a90566b95e1cc530d4ffa96126a43348008b8a6496298374faaa1c99c10000002000101400000009803000000000000"
               "9403000000000000080001005a000000000000000000000011800000000000000000000000000000700d00000000000028b52ffd"
               "60700c551c004625834700ed36632f828ab92d1bd8de71928c688d4464fad57f9dbe894ee04d079adb96a496b6dfb661320b3994"
               "375f44db08582cbf0e56ea4dddc2bf74ffa3b0bed8d70ff46d4b29650a6c006f006f0012ae73b90de23d82a1f8dae10eb59812b1"
               "cef93e8cbfaceff30a6b5497c3c2c9de3d77bddcd279ccdacb1aa7469dbb5d79df6f2caec2d36db14e210a54e9ecdb026fde2178"
               "eff2c0d4d8ad5ef73878eb3da6c6abdd74ec2a378d6e63332052cde73f9c3e639993327800632161b83730546dfca936ecb15c3e"
               "62d71627fc47f96f412fead06563897989a181f05b90f89fe1a401f6235908d953660f21c91e9256c1be829465596a4c8f49dae0"
               "f8670746911d710041dbff0df6e33f0fe966b472ecf5bfc888551feeb8ae938191e95a60d7713b8f2854785779153ef485a86885"
               "45b1cfe8c6ff8b6718f659c7cc6d013b67575f7ad47fa6fe6388804db17f86fd1cd1bfd2392dea318c7e52fa5f508e07b01989cf"
               "6d2a8a8d5be956e3963a699ce05c77529272a2e004c5e4ea4ca23becb14e9bf7a9582d5751b934db08774d4ab63ce2fc65bd8d8c"
               "5fffff3f1b6173966a46b4d46282ac3c272b468e6e6c0973c021ab1b0612a2be9c10f33dfcfc8f000224c61cdb5ca6151b544224"
               "256a28d12152c04430673254985effd23510af17ca92e8d5e05a8a57f225730342276d7458fad7cf3511b7143a5c132a4dd85e70"
               "8d033f869774c7e7da5039770280c0a821554864444624490a920eb08221221a751260b2349862144302c4203324d12829292a49"
               "510a8d01538dd4fcf6e7ea25fa6783008ec9130e8c98186c86030664123116cbe45d5e1c6283e7f0f6682e5f43e60ed927ddb105"
               "75e87e5a998eeae01c0f78ec799e721deeaf1c7af0ce15fb21f6515b87e549cedb10dd8c7ac7348471c688188feab88489594e33"
               "ebac2c5e3eb6810fa1567c1f4f161e43280c16e31528e70db2ce2f1666b8f2809eeda17ec8eee01e953e6b0211a3656e842a744b"
               "81b9be472d7ffae5bbd19972f7606ea9c8d25a9a71800e2c66376859d1e9b9bd2d747c65db2eda7dbd636abccaa9cd99e6d292d1"
               "c3d4b7766ad41de90347bf5821d53a7a39ecb2aa2de32b912ace22d189af6e8506f3ccf1060752efa0c5ec94b456d0adc72afe08"
               "6f265a14ea99dbe57819e1d86d69a691db31d19e246ccc537b0833a84dd2d479d3632cb458aa8a8113fb441f340cf91031bee818"
               "eb2e84805470f1e8f01947ef226ede67de4c945a8296e3341e54026700000000")
out = {}
cubin = None
if os.environ.get("NOJIT_TEST_CUBIN") and os.path.exists(os.environ["NOJIT_TEST_CUBIN"]):
    with open(os.environ["NOJIT_TEST_CUBIN"], "rb") as f:  # made by CUBIN_SCRIPT in its own process
        cubin = f.read()

from nojit.loader.strict import guards
from nojit.loader.strict import inprocess_guard
from nojit.loader.errors import CompileForbiddenError

cuda = None
if mode == "late":
    cuda = ctypes.CDLL("libcuda.so.1")
    out["cuInit"] = cuda.cuInit(0)
if mode in ("strict", "late"):
    guards.install_strict_guards()
    out["ptx_jit"] = inprocess_guard.report().ptx_jit
if cuda is None:
    cuda = ctypes.CDLL("libcuda.so.1")
    out["cuInit"] = cuda.cuInit(0)
if inprocess_guard.report() is not None:  # no rescan here: a ctypes caller's own cuInit triggers none
    out["proc_pending"] = sorted(inprocess_guard._pending_proc)  # cuGetProcAddress said "not initialized" at install
    out["patched"] = [os.path.basename(l) + ":" + s for l, s in inprocess_guard.report().patched]
    out["skipped"] = inprocess_guard.report().skipped
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
cuda.cuDeviceGet(ctypes.byref(dev), 0)
cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
P = ctypes.POINTER(ctypes.c_void_p)
def loads(image, path):
    """Every image loader of libcuda given `image` (or the file `path` holding it): what each answered."""
    r = {}
    m = ctypes.c_void_p()
    r["cuModuleLoadData"] = cuda.cuModuleLoadData(ctypes.byref(m), image)
    r["cuModuleLoadDataEx"] = cuda.cuModuleLoadDataEx(ctypes.byref(m), image, 0, None, None)
    r["cuModuleLoadFatBinary"] = cuda.cuModuleLoadFatBinary(ctypes.byref(m), image)
    r["cuLibraryLoadData"] = cuda.cuLibraryLoadData(ctypes.byref(m), image, None, None, 0, None, None, 0)
    r["cuModuleLoad"] = cuda.cuModuleLoad(ctypes.byref(m), path.encode())
    r["cuLibraryLoadFromFile"] = cuda.cuLibraryLoadFromFile(ctypes.byref(m), path.encode(), None, None, 0, None, None, 0)
    for name, proto, args in (("cuModuleLoadData", ctypes.CFUNCTYPE(ctypes.c_int, P, ctypes.c_char_p), (image,)),
                              ("cuLibraryLoadData", ctypes.CFUNCTYPE(ctypes.c_int, P, ctypes.c_char_p, ctypes.c_void_p,
                               ctypes.c_void_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint),
                               (image, None, None, 0, None, None, 0))):
        pfn, status = ctypes.c_void_p(), ctypes.c_int()
        if cuda.cuGetProcAddress_v2(name.encode(), ctypes.byref(pfn), 12000, 0, ctypes.byref(status)) == 0 and pfn.value:
            out["procaddr_is_export_" + name] = pfn.value == ctypes.cast(getattr(cuda, name), ctypes.c_void_p).value
            r["procaddr " + name] = proto(pfn.value)(ctypes.byref(m), *args)
    return r

work = os.environ["NOJIT_TEST_WORK"]
with open(os.path.join(work, mode + ".ptx"), "wb") as f:
    f.write(PTX)
out["ptx_loads"] = loads(PTX, os.path.join(work, mode + ".ptx"))
try:  # cudart (CUDA 12.5+), which takes its driver entries from cuGetProcAddress
    import nvidia.cu13
    cudart = ctypes.CDLL(sorted(glob.glob(os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libcudart.so.*")))[0])
    out["cudart_ptx_load"] = cudart.cudaLibraryLoadData(ctypes.byref(ctypes.c_void_p()), PTX, None, None, 0, None, None, 0)
except (ImportError, IndexError, OSError, AttributeError):
    pass
# a fatbin holding only that PTX (no SASS): loaded by the driver despite CUDA_DISABLE_PTX_JIT=1 (H200, driver 580; after
# the control had compiled the same PTX into the JIT cache), so refused by nojit's fatbin check under strict mode; one
# with sm_90 SASS too loads and its kernel runs
out["ptx_fatbin_load"] = cuda.cuModuleLoadData(ctypes.byref(ctypes.c_void_p()), bytes.fromhex(PTX_FATBIN))
mod, fn, dptr = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
out["sass_fatbin_load"] = cuda.cuModuleLoadData(ctypes.byref(mod), bytes.fromhex(SASS_FATBIN))
if out["sass_fatbin_load"] == 0:
    cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"k")
    cuda.cuMemAlloc_v2(ctypes.byref(dptr), 4)
    cuda.cuMemsetD32_v2(dptr, 0xFFFFFFFF, 1)  # poisoned: a NaN
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dptr), ctypes.c_void_p))
    out["sass_fatbin_launch"] = cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None)
    cuda.cuCtxSynchronize()
    value = ctypes.c_float()
    cuda.cuMemcpyDtoH_v2(ctypes.byref(value), dptr, 4)
    out["sass_fatbin_wrote"] = value.value
# crafted: PTX_FATBIN's PTX entry behind an "sm_90 ELF" entry whose payload is an empty ELF header, not a cubin.
# nojit's fatbin check passes it on (an sm_90 cubin is there); if the driver then falls back to the PTX, it JITs
def _crafted(fatbin: bytes) -> bytes:
    body = fatbin[16:]
    head, size = int.from_bytes(body[4:8], "little"), int.from_bytes(body[8:16], "little")
    ptx_entry = body[:head + size]
    payload = b"\x7fELF\x02\x01\x01" + bytes(size - 7)
    elf = bytearray(body[:head])
    elf[0:2], elf[28:32] = (2).to_bytes(2, "little"), (90).to_bytes(4, "little")  # kind ELF, sm_90
    elf[8:16] = len(payload).to_bytes(8, "little")
    new_body = bytes(elf) + payload + ptx_entry
    return fatbin[:8] + len(new_body).to_bytes(8, "little") + new_body
out["broken_sass_ptx_fatbin_load"] = cuda.cuModuleLoadData(ctypes.byref(ctypes.c_void_p()),
                                                          _crafted(bytes.fromhex(PTX_FATBIN)))
out["ctypes_ptx_load"] = out["ptx_loads"]["cuModuleLoadData"]
if cubin is not None:
    with open(os.path.join(work, mode + ".cubin"), "wb") as f:
        f.write(cubin)
    out["cubin_loads"] = loads(cubin, os.path.join(work, mode + ".cubin"))
    out["ctypes_cubin_load"] = out["cubin_loads"]["cuModuleLoadData"]
    # the kernel of a cubin loaded through the (patched) export runs: 1.0f over a poisoned buffer
    mod, fn, dptr = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
    cuda.cuModuleLoadData(ctypes.byref(mod), cubin)
    cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"k")
    cuda.cuMemAlloc_v2(ctypes.byref(dptr), 4)
    cuda.cuMemsetD32_v2(dptr, 0xFFFFFFFF, 1)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dptr), ctypes.c_void_p))
    out["launch"] = cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None)
    cuda.cuCtxSynchronize()
    value = ctypes.c_float()
    cuda.cuMemcpyDtoH_v2(ctypes.byref(value), dptr, 4)
    out["kernel_wrote"] = value.value
# the PTX after the cubin: on the H200 a cubin loaded after the refused PTX (221) failed with 999, so the order tells
# whether the cubin needs the JIT library or only the context was left broken by the refusal
out["ptx_load"] = cuda.cuModuleLoadData(ctypes.byref(ctypes.c_void_p()), PTX)
out["ptx_jit_mapped"] = sorted({l.split()[-1] for l in open("/proc/self/maps") if "ptxjitcompiler" in l})
out["cuda_cache_path"] = os.environ.get("CUDA_CACHE_PATH")
out["cubin_after_ptx"] = (cuda.cuModuleLoadData(ctypes.byref(ctypes.c_void_p()), open(sys.argv[1], "rb").read())
                          if os.path.exists(sys.argv[1]) else None)
state = ctypes.c_void_p()
out["cuLinkCreate"] = cuda.cuLinkCreate_v2(0, None, None, ctypes.byref(state))
out["cuLinkAddData"] = cuda.cuLinkAddData_v2(state, 1, PTX, len(PTX), b"twice.ptx", 0, None, None)  # CU_JIT_INPUT_PTX
if out["cuLinkAddData"] == 0:
    image, size = ctypes.c_void_p(), ctypes.c_size_t()
    out["cuLinkComplete"] = cuda.cuLinkComplete(state, ctypes.byref(image), ctypes.byref(size))
    out["linked_magic"] = ctypes.string_at(image, 4).hex() if out["cuLinkComplete"] == 0 else ""
cuda.cuLinkDestroy(state)
# the same entry as cudart, Triton and cuda.bindings get it: through cuGetProcAddress (CUDA 12.0 ABI)
pfn, status = ctypes.c_void_p(), ctypes.c_int()
out["procaddr"] = cuda.cuGetProcAddress_v2(b"cuLinkAddData", ctypes.byref(pfn), 12000, 0, ctypes.byref(status))
if out["procaddr"] == 0 and pfn.value:
    out["procaddr_is_export"] = pfn.value == ctypes.cast(cuda.cuLinkAddData_v2, ctypes.c_void_p).value
    add = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                           ctypes.c_char_p, ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p)(pfn.value)
    state = ctypes.c_void_p()
    cuda.cuLinkCreate_v2(0, None, None, ctypes.byref(state))
    out["procaddr_cuLinkAddData"] = add(state, 1, PTX, len(PTX), b"twice.ptx", 0, None, None)
    cuda.cuLinkDestroy(state)
try:
    from cuda.bindings import driver
    try:
        out["bindings_ptx_load"] = int(driver.cuModuleLoadData(PTX)[0])
    except CompileForbiddenError as exc:
        out["bindings_ptx_load"] = "forbidden: " + exc.message
except ImportError:
    out["bindings_ptx_load"] = "no cuda.bindings"
out["c_refusals"] = inprocess_guard.refusals() if inprocess_guard.report() is not None else 0
print("RESULT " + json.dumps(out))
'''


# A real sm_90 cubin (the nvidia-cuda-nvrtc wheel, if installed), made in its own process: NVRTC 13 loads libcuda.so.1
# when it compiles, and on the H200 the strict side then found CUDA initialized and the driver's PTX JIT on.
CUBIN_SCRIPT = r'''
import ctypes, glob, os, sys
try:
    import nvidia.cu13 as wheel_root
    lib_dir = os.path.join(list(wheel_root.__path__)[0], "lib")
    ctypes.CDLL(sorted(glob.glob(os.path.join(lib_dir, "libnvrtc-builtins.so.*")))[0])
    nvrtc = ctypes.CDLL(sorted(glob.glob(os.path.join(lib_dir, "libnvrtc.so.*")))[0])
except (ImportError, IndexError, OSError):
    sys.exit(0)
prog = ctypes.c_void_p()
nvrtc.nvrtcCreateProgram(ctypes.byref(prog), b'extern "C" __global__ void k(float* x) { x[0] = 1.0f; }',
                         b"k.cu", 0, None, None)
if nvrtc.nvrtcCompileProgram(prog, 1, (ctypes.c_char_p * 1)(b"--gpu-architecture=sm_90")) == 0:
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetCUBIN(prog, buf)
    with open(sys.argv[1], "wb") as f:
        f.write(buf.raw)
'''


def run(tmp_path, mode: str) -> tuple[dict, list[dict]]:
    script = tmp_path / "ptx_load.py"
    script.write_text(SCRIPT)
    log = tmp_path / f"events-{mode}.jsonl"
    env = {**os.environ, "NOJIT_EVENT_LOG": str(log)}
    env.pop("CUDA_DISABLE_PTX_JIT", None)
    cubin = tmp_path / "k.cubin"
    if not cubin.exists():
        maker = tmp_path / "make_cubin.py"
        maker.write_text(CUBIN_SCRIPT)
        subprocess.run([sys.executable, str(maker), str(cubin)], capture_output=True, timeout=300, env=env)
    env["NOJIT_TEST_CUBIN"] = str(cubin)
    env["NOJIT_TEST_WORK"] = str(tmp_path)
    p = subprocess.run([sys.executable, str(script), mode], capture_output=True, text=True, timeout=600, env=env)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stderr[-3000:]
    events = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return json.loads(line[0].removeprefix("RESULT ")), events


def test_ptx_module_load_refused_in_strict_mode(tmp_path):
    off, _ = run(tmp_path, "off")
    assert off["cuInit"] == 0 and off["ctypes_ptx_load"] == 0, off  # control: the driver JIT-compiles this PTX
    assert off["cuLinkAddData"] == 0 and off["cuLinkComplete"] == 0 and off["linked_magic"] == "7f454c46", off
    assert off["bindings_ptx_load"] in (0, "no cuda.bindings"), off

    strict, events = run(tmp_path, "strict")
    print("strict:", json.dumps(strict))
    assert strict["ptx_jit"].startswith("driver PTX JIT off"), strict
    assert strict.get("ctypes_cubin_load", 0) == 0, strict  # SASS still loads
    assert "libcuda.so.1:cuLinkAddData_v2" in strict["patched"] or any(
        p.startswith("libcuda.so") and "cuLinkAddData" in p for p in strict["patched"]), strict
    assert strict["cuLinkAddData"] == 223 and strict["c_refusals"] >= 1, strict  # CUDA_ERROR_JIT_COMPILATION_DISABLED
    assert [e for e in events if e.get("symbol") == "cuLinkAddData"], events
    if strict["bindings_ptx_load"] != "no cuda.bindings":
        assert strict["bindings_ptx_load"].startswith("forbidden: strict mode"), strict


# the loaders documented to take PTX: the control must load it through each (cuModuleLoadFatBinary's answer to raw PTX
# is only printed); under strict mode every entry, that one too, answers 223
PTX_TAKERS = ("cuModuleLoadData", "cuModuleLoadDataEx", "cuLibraryLoadData", "cuModuleLoad", "cuLibraryLoadFromFile",
              "procaddr cuModuleLoadData", "procaddr cuLibraryLoadData")


def test_raw_ptx_given_to_the_driver_s_image_loaders_is_refused(tmp_path):
    """The H200 loaded a raw PTX image through the exported cuModuleLoadData although CUDA_DISABLE_PTX_JIT=1 was
    set before cuInit: strict mode now patches every image loader of libcuda (and what cuGetProcAddress hands out)."""
    off, _ = run(tmp_path, "off")
    print("off:", json.dumps(off))
    for name in PTX_TAKERS:
        if name in off["ptx_loads"]:
            assert off["ptx_loads"][name] == 0, (name, off)  # control: the driver JIT-compiles this PTX
    strict, events = run(tmp_path, "strict")
    print("strict:", json.dumps(strict))
    assert strict["ptx_jit"].startswith("driver PTX JIT off"), strict
    assert strict["ptx_loads"] and set(strict["ptx_loads"].values()) == {223}, strict
    refused = {e.get("symbol") for e in events if e["event"] == "compile_forbidden"}
    assert {"cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData", "cuModuleLoad",
            "cuLibraryLoadFromFile"} <= refused, events


def test_cudart_library_load_of_ptx_is_refused(tmp_path):
    """cudart's cudaLibraryLoadData reaches the driver through what cuGetProcAddress handed cudart: refused too."""
    off, _ = run(tmp_path, "off")
    if "cudart_ptx_load" not in off:
        pytest.skip("no libcudart of the nvidia-cuda-runtime wheel here")
    assert off["cudart_ptx_load"] == 0, off  # control
    strict, _ = run(tmp_path, "strict")
    print("strict cudaLibraryLoadData of PTX:", strict["cudart_ptx_load"])
    assert strict["cudart_ptx_load"] != 0, strict


def test_ptx_only_fatbin_refused_by_the_fatbin_check(tmp_path):
    """The H200 (driver 580.159.04) JIT-compiled a PTX-only fatbin under strict mode although CUDA_DISABLE_PTX_JIT=1
    was set before cuInit: nojit's stub now reads the fatbin's entries and refuses one with no cubin for the GPU's
    SM. Control: with strict mode off the driver loads (JIT-compiles) it."""
    off, _ = run(tmp_path, "off")
    assert off["ptx_fatbin_load"] == 0, off  # control: the driver JIT-compiles the fatbin's PTX
    strict, events = run(tmp_path, "strict")
    assert strict["ptx_fatbin_load"] == 223, strict  # CUDA_ERROR_JIT_COMPILATION_DISABLED, from nojit's stub
    assert [e for e in events if e.get("symbol") == "cuModuleLoadData" and "no sm_90 cubin" in e["what"]], events


def test_fatbin_with_sm_90_sass_loads_and_runs_in_strict_mode(tmp_path):
    """A fatbin with PTX and an sm_90 cubin (as torch's and the bundle's modules are) goes on to the driver: it loads
    through the patched cuModuleLoadData as with strict mode off, and its kernel writes 2.0 over a poisoned buffer."""
    off, _ = run(tmp_path, "off")
    assert off["sass_fatbin_load"] == 0 and off["sass_fatbin_wrote"] == 2.0, off  # control
    strict, _ = run(tmp_path, "strict")
    assert strict["sass_fatbin_load"] == 0 and strict["sass_fatbin_launch"] == 0, strict
    assert strict["sass_fatbin_wrote"] == 2.0, strict


def test_cubins_still_load_through_every_patched_loader_and_run(tmp_path):
    """Nothing legitimate refused: the cubin loads through each entry exactly as with strict mode off, and the kernel
    loaded through the patched cuModuleLoadData (its trampoline to the driver's own code) runs."""
    off, _ = run(tmp_path, "off")
    if "cubin_loads" not in off:
        pytest.skip("no NVRTC wheel here to make the sm_90 cubin")
    assert off["kernel_wrote"] == 1.0 and off["cubin_loads"]["cuModuleLoadData"] == 0, off
    strict, _ = run(tmp_path, "strict")
    assert not [s for s in strict["skipped"] if "libcuda" in s], strict["skipped"]
    assert strict["cubin_loads"] == off["cubin_loads"], (strict["cubin_loads"], off["cubin_loads"])
    assert strict["launch"] == 0 and strict["kernel_wrote"] == 1.0, strict


def test_ptx_jit_left_on_when_cuda_initialized_first_is_said(tmp_path):
    late, events = run(tmp_path, "late")
    print("late:", json.dumps(late))
    assert late["ptx_jit"].startswith("driver PTX JIT on in this process"), late
    assert [e for e in events if e["event"] == "ptx_jit_not_disabled"], events
    assert late["cuLinkAddData"] == 223, late  # the patched linker entry refuses all the same
    assert late["ctypes_ptx_load"] == 223, late  # and the image loader of the live driver


def test_linker_entry_from_cuGetProcAddress_is_refused_too(tmp_path):
    """cudart, Triton and cuda.bindings take driver entries from cuGetProcAddress, not the export: the pointer it
    gives must land in the same refusal (it does when it is the export, or jumps into the patched body)."""
    off, _ = run(tmp_path, "off")
    assert off["procaddr"] == 0 and off["procaddr_cuLinkAddData"] == 0, off  # control
    strict, _ = run(tmp_path, "strict")
    print("procaddr is the export:", strict.get("procaddr_is_export"))
    assert strict["procaddr_cuLinkAddData"] == 223, strict


# a process of the strict tree that never installs nojit (and drops CUDA_DISABLE_PTX_JIT): raw PTX to the driver, then
# the cubin made by CUBIN_SCRIPT loaded and its kernel run over a poisoned buffer
JIT_CHILD = r'''
import ctypes, json, os, sys
PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry twice(.param .u64 x) { ret; }
""" + b"\0"
cuda = ctypes.CDLL("libcuda.so.1")
out = {"cuInit": cuda.cuInit(0), "jit_disabled_var": os.environ.get("CUDA_DISABLE_PTX_JIT")}
dev, ctx, mod, fn, dptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_uint64()
cuda.cuDeviceGet(ctypes.byref(dev), 0)
cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
cuda.cuCtxSetCurrent(ctx)
if os.path.exists(sys.argv[1]):
    out["cubin_load"] = cuda.cuModuleLoadData(ctypes.byref(mod), open(sys.argv[1], "rb").read())
    cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"k")
    cuda.cuMemAlloc_v2(ctypes.byref(dptr), 4)
    cuda.cuMemsetD32_v2(dptr, 0xFFFFFFFF, 1)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(dptr), ctypes.c_void_p))
    out["launch"] = cuda.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, None, params, None)
    cuda.cuCtxSynchronize()
    value = ctypes.c_float()
    cuda.cuMemcpyDtoH_v2(ctypes.byref(value), dptr, 4)
    out["kernel_wrote"] = value.value
# the PTX after the cubin: on the H200 a cubin loaded after the refused PTX (221) failed with 999, so the order tells
# whether the cubin needs the JIT library or only the context was left broken by the refusal
out["ptx_load"] = cuda.cuModuleLoadData(ctypes.byref(ctypes.c_void_p()), PTX)
out["ptx_jit_mapped"] = sorted({l.split()[-1] for l in open("/proc/self/maps") if "ptxjitcompiler" in l})
out["cuda_cache_path"] = os.environ.get("CUDA_CACHE_PATH")
out["cubin_after_ptx"] = (cuda.cuModuleLoadData(ctypes.byref(ctypes.c_void_p()), open(sys.argv[1], "rb").read())
                          if os.path.exists(sys.argv[1]) else None)
print("RESULT " + json.dumps(out))
'''

# install() of a small real bundle in strict mode (Landlock on, as in production), then JIT_CHILD as its child
STRICT_PARENT = r'''
import json, os, subprocess, sys
from tests.support.bundle_bytes import seal
from tests.loader.bundle.test_schema_rules import valid
from nojit.loader.install import install
from nojit.loader.settings import MISMATCH_FACTS
work, child, cubin = sys.argv[1:4]
bundle = os.path.join(work, "b.nojit")
with open(bundle, "wb") as f:
    f.write(seal(*valid()))
install(bundle, kernels=set(), allow_mismatch=frozenset(MISMATCH_FACTS))
from nojit.loader.strict import landlock
r = landlock.report()
env = {k: v for k, v in os.environ.items() if k != "CUDA_DISABLE_PTX_JIT" and not k.startswith("NOJIT")}
p = subprocess.run([sys.executable, child, cubin], capture_output=True, text=True, env=env, timeout=300)
lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
print("RESULT " + json.dumps({"landlock": r.state, "summary": r.summary(), "ptx_jit": r.ptx_jit_unreadable,
                              "child": json.loads(lines[-1][7:]) if lines else p.stderr[-2000:]}))
'''


def _strict_parent(tmp_path, unreadable: bool) -> dict:
    from tests.support.common import ROOT

    cubin = tmp_path / "k.cubin"
    if not cubin.exists():
        maker = tmp_path / "make_cubin.py"
        maker.write_text(CUBIN_SCRIPT)
        subprocess.run([sys.executable, str(maker), str(cubin)], capture_output=True, timeout=300)
    (tmp_path / "child.py").write_text(JIT_CHILD)
    (tmp_path / "parent.py").write_text(STRICT_PARENT)
    work = tmp_path / ("on" if unreadable else "off")
    work.mkdir()
    (work / "xdg").mkdir(mode=0o700)
    # a JIT cache of its own per run: the driver keeps what it compiled (~/.nv/ComputeCache) and loads the same PTX
    # from there without its compiler, so the control's compile must not be what the second run finds (the H200 run
    # of session 11, sharing the cache, loaded the PTX with the compiler unreadable)
    env = {**os.environ, "NOJIT_MODE": "strict", "NOJIT_UNREADABLE_PTX_JIT": "1" if unreadable else "0",
           "XDG_RUNTIME_DIR": str(work / "xdg"), "CUDA_CACHE_PATH": str(work / "nv-compute-cache"),
           "PYTHONPATH": os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    env.pop("NOJIT_LANDLOCK_ACTIVE", None)
    p = subprocess.run([sys.executable, str(tmp_path / "parent.py"), str(work), str(tmp_path / "child.py"), str(cubin)],
                       capture_output=True, text=True, timeout=600, env=env, cwd=str(work))
    return _last_result(p)


def _last_result(p: subprocess.CompletedProcess) -> dict:
    """The last `RESULT {json}` line a script printed; none is a failure showing its stderr."""
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, p.stderr[-3000:]
    return json.loads(lines[-1][7:])


def test_the_driver_jit_library_unreadable_stops_ptx_in_a_child_and_cubins_still_run(tmp_path):
    """NOJIT_UNREADABLE_PTX_JIT=1 (loader/strict/driver_jit.py), written as the attack: a child of a strict process
    that never installs nojit and drops CUDA_DISABLE_PTX_JIT loads raw PTX (the README's not-covered row). With the
    driver's PTX JIT library unreadable to the tree the load must fail, while the same child's CUDA starts and a cubin
    loads and its kernel writes 1.0 over a poisoned buffer (a correct start is not broken). Control: the setting off,
    the child JIT-compiles the PTX (ptx_load 0)."""
    from nojit.loader.strict import driver_jit, landlock

    if landlock.abi_version() is None:
        pytest.skip("this kernel has no Landlock")
    if not driver_jit.find():
        pytest.skip("no libnvidia-ptxjitcompiler found where the driver's libraries live")
    off = _strict_parent(tmp_path, unreadable=False)
    print("off:", json.dumps(off))
    assert off["landlock"] == "on" and off["child"]["cuInit"] == 0 and off["child"]["jit_disabled_var"] is None, off
    assert off["child"]["ptx_load"] == 0, off  # control: the driver JIT-compiles it in a child without nojit
    on = _strict_parent(tmp_path, unreadable=True)
    print("on:", json.dumps(on))
    assert on["landlock"] == "on" and on["ptx_jit"], on
    assert on["child"]["cuInit"] == 0, on  # CUDA starts without the JIT library
    assert on["child"]["ptx_load"] != 0, on  # 221 (CUDA_ERROR_JIT_COMPILER_NOT_FOUND) expected
    if "cubin_load" in on["child"]:
        assert on["child"]["cubin_load"] == 0 and on["child"]["launch"] == 0 and on["child"]["kernel_wrote"] == 1.0, on


def test_a_fatbin_whose_sm_90_cubin_is_broken_does_not_fall_back_to_its_ptx(tmp_path):
    """Red team (session 9), written as the attack: a fatbin with an "sm_90 ELF" entry that is no cubin, and PTX. The
    fatbin check passes it on (an sm_90 entry is there); if the driver, failing the cubin, JIT-compiles the PTX, that
    is a compile under strict mode. The control (strict mode off) says whether this driver falls back at all: only
    then can the strict side fail, and it must not load (the check would then need to read the cubin itself)."""
    off, _ = run(tmp_path, "off")
    strict, _ = run(tmp_path, "strict")
    print("crafted fatbin: off", off["broken_sass_ptx_fatbin_load"], "strict", strict["broken_sass_ptx_fatbin_load"])
    if off["broken_sass_ptx_fatbin_load"] == 0:  # this driver falls back to the PTX: the attack works without nojit
        assert strict["broken_sass_ptx_fatbin_load"] != 0, strict


def test_what_cuda_disable_ptx_jit_does_with_an_empty_and_a_filled_jit_cache(tmp_path):
    """A measurement, printed for the notes: the driver keeps the SASS it JIT-compiled (CUDA_CACHE_PATH) and loads the
    same PTX from there later. Whether CUDA_DISABLE_PTX_JIT=1 stops raw PTX with an empty cache, and whether a filled
    cache answers it anyway, decides how the earlier H200 finding ("the variable alone did not stop raw PTX") reads.
    Asserted: only the control (no variable, empty cache: the driver compiles, 0)."""
    (tmp_path / "child.py").write_text(JIT_CHILD)
    cache = tmp_path / "nv-compute-cache"

    def child(disable: bool) -> dict:
        env = {k: v for k, v in os.environ.items() if k != "CUDA_DISABLE_PTX_JIT" and not k.startswith("NOJIT")}
        env["CUDA_CACHE_PATH"] = str(cache)
        if disable:
            env["CUDA_DISABLE_PTX_JIT"] = "1"
        p = subprocess.run([sys.executable, str(tmp_path / "child.py"), str(tmp_path / "none.cubin")],
                           capture_output=True, text=True, timeout=300, env=env)
        return _last_result(p)

    empty_disabled = child(True)
    compiled = child(False)
    filled_disabled = child(True)
    print(f"CUDA_DISABLE_PTX_JIT=1, empty JIT cache: ptx_load {empty_disabled['ptx_load']}; "
          f"no variable: {compiled['ptx_load']}; CUDA_DISABLE_PTX_JIT=1, cache filled by that: "
          f"{filled_disabled['ptx_load']} (0 = loaded; 218 = CUDA_ERROR_INVALID_PTX, 222 = UNSUPPORTED_PTX_VERSION, "
          "223 = JIT_COMPILATION_DISABLED)")
    assert compiled["ptx_load"] == 0, compiled
