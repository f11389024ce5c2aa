"""Strict mode refuses the in-process compilers (loader/strict/inprocess_guard.py, csrc/nojit_inproc.c), each written
as the attack: NVRTC through cuda.bindings (its Python wrapper, and the function taken before strict mode went
up, which reaches the C entry) and through ctypes (a copy loaded before strict mode and one loaded after), and
nvJitLink through ctypes and cuda.bindings, PTX to cubin. Positive control: with strict mode off each form
really produces an sm_90 cubin (its ELF header checked), and in the strict run the same compile works again
once strict mode is lifted in the same process. Each refusal leaves an event line. No GPU needed."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.common import PROBES, ROOT

PROBE = os.path.join(PROBES, "probe_inprocess_compilers.py")

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("cuda.bindings") is None,
    reason="needs the nvidia-cuda-nvrtc / nvidia-nvjitlink wheels and cuda-bindings (vLLM's torch brings them)")

FORMS = {  # form -> what the strict-mode refusal names in the event line
    "nvrtc-bindings": "cuda.bindings.nvrtc.nvrtcCompileProgram",
    "nvrtc-bindings-captured": "nvrtcCompileProgram",
    "nvrtc-ctypes": "nvrtcCompileProgram",
    "nvrtc-ctypes-later": "nvrtcCompileProgram",
    "nvjitlink-ctypes": "nvJitLinkAddData",
    "nvjitlink-bindings": "cuda.bindings.nvjitlink.add_data",
}


def _run(form: str, mode: str, tmp_path) -> tuple[dict, list[dict]]:
    log = tmp_path / f"{form}-{mode}.jsonl"
    env = {**os.environ, "NOJIT_EVENT_LOG": str(log)}
    env.pop("CUDA_DISABLE_PTX_JIT", None)
    proc = subprocess.run([sys.executable, PROBE, form, mode], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return json.loads(proc.stdout.strip().splitlines()[-1]), events


@pytest.mark.parametrize("form", sorted(FORMS))
def test_in_process_compile_refused_in_strict_mode(form, tmp_path):
    control, events = _run(form, "off", tmp_path)
    assert control["result"]["sm"] == 90, control  # positive control: the form really compiles to sm_90 SASS
    assert not [e for e in events if e["event"] == "compile_forbidden"]

    strict, events = _run(form, "strict", tmp_path)
    result = strict["result"]
    assert result["size"] == 0 and result["sm"] is None, strict  # nothing compiled
    if "bindings" in FORMS[form]:
        assert "strict mode" in result["forbidden"] and FORMS[form] in result["forbidden"]  # CompileForbiddenError
    else:
        assert result["rc"] in (3, 6), strict  # the library's own error: NVJITLINK_ERROR_INVALID_INPUT, NVRTC_ERROR_COMPILATION
        assert strict["c_refusals"] >= 1
    refused = [e for e in events if e["event"] == "compile_forbidden"]
    assert len(refused) == 1 and FORMS[form] in refused[0]["what"] and refused[0]["via"] == "in-process", events
    assert strict["ptx_jit_env"] == "1" and strict["env_after"] is None  # forced in strict mode, restored after
    assert strict["after_uninstall"]["sm"] == 90, strict  # lifted in the same process: compiles again


def test_importable_compilers_reported_never_imported(tmp_path):
    """A compiler package that could be imported is named in the report and an event line, without importing it."""
    fake = tmp_path / "site" / "cupy"
    fake.mkdir(parents=True)
    marker = tmp_path / "imported"
    (fake / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    log = tmp_path / "events.jsonl"
    code = ("from nojit.loader.strict import guards, inprocess_guard; guards.install_strict_guards(); "
            "r = inprocess_guard.report(); print(r.summary()); print(','.join(r.importable))")
    env = {**os.environ, "NOJIT_EVENT_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary, importable = proc.stdout.strip().splitlines()[-2:]
    assert "cupy" in importable.split(",") and "importable, not refused: " in summary and "cupy" in summary
    assert "driver PTX JIT off" in summary
    assert not marker.exists()  # found with find_spec, never imported
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e for e in events if e["event"] == "inprocess_compiler_importable" and "cupy" in e["modules"]]


_STAND_IN_DRIVER = r"""
/* A stand-in for libcuda.so.1's linker entries: links nothing, answers CUDA_SUCCESS, counts calls. */
#include <stddef.h>
static volatile int calls;
int cuLinkAddData_v2(void *s, int type, void *data, size_t size, const char *name, unsigned n, void *o, void **v) {
  calls += 1 + (int)size + (name != 0);
  return calls > 0 ? 0 : 1;
}
int cuLinkAddFile_v2(void *s, int type, const char *path, unsigned n, void *o, void **v) {
  calls += 1 + (path != 0);
  return calls > 0 ? 0 : 1;
}
"""

_DRIVER_CALL = """
import ctypes, json, sys
from nojit.loader.strict import guards
from nojit.loader.strict import inprocess_guard
if sys.argv[1] == "strict":
    guards.install_strict_guards()
lib = ctypes.CDLL(sys.argv[2])  # loaded after strict mode went up: patched on arrival
ptx = b".version 8.0\\n.target sm_90\\n.address_size 64\\n"
rc_data = lib.cuLinkAddData_v2(None, 1, ptx, len(ptx), b"k.ptx", 0, None, None)  # CU_JIT_INPUT_PTX
rc_file = lib.cuLinkAddFile_v2(None, 1, b"k.ptx", 0, None, None)
print(json.dumps({"rc_data": rc_data, "rc_file": rc_file, "refusals": inprocess_guard.refusals()}))
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the stand-in driver")
def test_driver_linker_refused_through_a_stand_in_libcuda(tmp_path):
    """The patch on libcuda's linker entries, shown on a stand-in libcuda.so.1 built here (this box has no
    driver; tests/gpu/test_inprocess_gpu.py does it with the real one): with strict mode off the stand-in
    answers CUDA_SUCCESS, under strict mode both entries answer CUDA_ERROR_JIT_COMPILATION_DISABLED and log."""
    src = tmp_path / "driver.c"
    src.write_text(_STAND_IN_DRIVER)
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", "-Wl,-soname,libcuda.so.1", "-o", str(lib), str(src)], check=True)
    out = {}
    for mode in ("off", "strict"):
        log = tmp_path / f"{mode}.jsonl"
        env = {**os.environ, "NOJIT_EVENT_LOG": str(log)}
        proc = subprocess.run([sys.executable, "-c", _DRIVER_CALL, mode, str(lib)], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        out[mode]["events"] = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    assert out["off"]["rc_data"] == 0 and out["off"]["rc_file"] == 0 and out["off"]["refusals"] == 0  # control
    assert out["strict"]["rc_data"] == 223 and out["strict"]["rc_file"] == 223 and out["strict"]["refusals"] == 2
    symbols = [e.get("symbol") for e in out["strict"]["events"] if e["event"] == "compile_forbidden"]
    assert symbols == ["cuLinkAddData", "cuLinkAddFile"], out["strict"]["events"]


_BINDINGS_DRIVER_LOAD = """
import json, sys
from cuda.bindings import driver
from nojit.loader.strict import guards
from nojit.loader.errors import CompileForbiddenError
if sys.argv[1] == "strict":
    guards.install_strict_guards()
out = {}
for name, image in (("ptx", b".version 8.0\\n.target sm_90\\n.address_size 64\\n\\0"), ("cubin", b"\\x7fELF" + bytes(60))):
    try:
        out[name] = "driver answered " + str(driver.cuModuleLoadData(image)[0])
    except CompileForbiddenError as exc:
        out[name] = "forbidden: " + exc.message
    except Exception as exc:  # no driver on this box: cuda.bindings cannot find libcuda
        out[name] = "driver answered " + type(exc).__name__
print(json.dumps(out))
"""


def test_bindings_driver_refuses_ptx_images_and_passes_cubins(tmp_path):
    """cuda.bindings.driver.cuModuleLoadData with PTX text raises CompileForbiddenError in strict mode before the
    driver is reached; a cubin goes on to the driver. Control: with strict mode off the PTX reaches the driver too
    (on this GPU-less box the driver answers an error; tests/gpu/test_inprocess_gpu.py loads it for real)."""
    out = {}
    for mode in ("off", "strict"):
        env = {**os.environ, "NOJIT_EVENT_LOG": str(tmp_path / f"{mode}.jsonl")}
        proc = subprocess.run([sys.executable, "-c", _BINDINGS_DRIVER_LOAD, mode], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["off"]["ptx"].startswith("driver answered") and out["off"]["cubin"].startswith("driver answered")
    assert out["strict"]["ptx"].startswith("forbidden: strict mode: the CUDA driver"), out
    assert out["strict"]["cubin"].startswith("driver answered"), out
    events = [json.loads(x) for x in (tmp_path / "strict.jsonl").read_text().splitlines()]
    assert [e for e in events if e["event"] == "compile_forbidden" and "cuModuleLoadData" in e["what"]]


def test_cuda_initialized_before_strict_mode_is_said(tmp_path):
    """When CUDA was initialized before strict mode went up (torch says so), the report says the driver's PTX JIT
    stays on in this process, and an event line says it too."""
    log = tmp_path / "events.jsonl"
    code = ("import sys, types; m = types.ModuleType('torch.cuda'); m.is_initialized = lambda: True; "
            "sys.modules['torch.cuda'] = m\n"
            "from nojit.loader.strict import guards, inprocess_guard; guards.install_strict_guards(); "
            "print(inprocess_guard.report().ptx_jit)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NOJIT_EVENT_LOG": str(log)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "driver PTX JIT on in this process" in proc.stdout
    assert [e for e in map(json.loads, log.read_text().splitlines()) if e["event"] == "ptx_jit_not_disabled"]


_EXTENSION = r"""
/* An extension module linked against libnvrtc (DT_NEEDED), as a C++ library that compiles with NVRTC is. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <nvrtc.h>
static PyObject *compile(PyObject *self, PyObject *noargs) {
  nvrtcProgram prog;
  if (nvrtcCreateProgram(&prog, "extern \"C\" __global__ void k(float* x) { x[0] = 1.0f; }", "k.cu", 0, 0, 0))
    return PyLong_FromLong(-1);
  const char *opts[] = {"--gpu-architecture=sm_90"};
  nvrtcResult rc = nvrtcCompileProgram(prog, 1, opts);
  size_t size = 0;
  if (rc == NVRTC_SUCCESS) nvrtcGetCUBINSize(prog, &size);
  nvrtcDestroyProgram(&prog);
  return Py_BuildValue("(in)", (int)rc, (Py_ssize_t)size);
}
static PyMethodDef methods[] = {{"compile", compile, METH_NOARGS, ""}, {0, 0, 0, 0}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "nvrtc_ext", "", -1, methods};
PyMODINIT_FUNC PyInit_nvrtc_ext(void) { return PyModule_Create(&module); }
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the extension")
def test_nvrtc_loaded_by_an_extension_import_after_strict_mode_is_refused(tmp_path):
    """An extension imported after strict mode brings libnvrtc in as its dependency (no ctypes, no dlopen of ours)
    and calls nvrtcCompileProgram from C: refused. Control: the same import and call with strict mode off compiles."""
    import sysconfig

    import nvidia.cu13

    root = list(nvidia.cu13.__path__)[0]
    src = tmp_path / "nvrtc_ext.c"
    src.write_text(_EXTENSION)
    ext = tmp_path / ("nvrtc_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["cc", "-shared", "-fPIC", "-O0", f"-I{sysconfig.get_paths()['include']}", f"-I{root}/include",
                    "-o", str(ext), str(src), f"-L{root}/lib", "-l:libnvrtc.so.13", f"-Wl,-rpath,{root}/lib"], check=True)
    code = ("import json, sys\nfrom nojit.loader.strict import guards, inprocess_guard\n"
            "if sys.argv[1] == 'strict':\n    guards.install_strict_guards()\n"
            f"sys.path.insert(0, {str(tmp_path)!r})\nimport nvrtc_ext\n"
            "print(json.dumps(list(nvrtc_ext.compile())))")
    out = {}
    for mode in ("off", "strict"):
        env = {**os.environ, "NOJIT_EVENT_LOG": str(tmp_path / f"{mode}.jsonl"), "LD_LIBRARY_PATH": f"{root}/lib"}
        proc = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["off"][0] == 0 and out["off"][1] > 0, out  # control: the extension compiled a cubin
    assert out["strict"] == [6, 0], out  # NVRTC_ERROR_COMPILATION from the stub
    events = [json.loads(x) for x in (tmp_path / "strict.jsonl").read_text().splitlines()]
    assert [e for e in events if e.get("symbol") == "nvrtcCompileProgram"], events


_DRIVER_LOADS = r"""
import ctypes, json, os, sys
from nojit.loader.strict import guards, inprocess_guard
mode, lib_path, work = sys.argv[1:4]
P = ctypes.POINTER(ctypes.c_void_p)
if mode == "early":  # the driver loaded and its cuGetProcAddress pointer taken before strict mode went up
    cuda = ctypes.CDLL(lib_path)
if mode in ("strict", "early"):
    guards.install_strict_guards()
cuda = ctypes.CDLL(lib_path)  # (again) after strict mode: patched on arrival
PTX = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k() { ret; }\n\0"
CUBIN = b"\x7fELF" + bytes(60)
out = {}
for kind, image in (("ptx", PTX), ("cubin", CUBIN)):
    path = os.path.join(work, "k." + kind)
    with open(path, "wb") as f:
        f.write(image)
    def attempt(fn, *args):
        m = ctypes.c_void_p()
        return fn(ctypes.byref(m), *args)
    pfn, status = ctypes.c_void_p(), ctypes.c_int()
    cuda.cuGetProcAddress_v2(b"cuModuleLoadData", ctypes.byref(pfn), 12000, 0, ctypes.byref(status))
    out["procaddr_is_export"] = pfn.value == ctypes.cast(cuda.cuModuleLoadData, ctypes.c_void_p).value
    load = ctypes.CFUNCTYPE(ctypes.c_int, P, ctypes.c_char_p)(pfn.value)
    out[kind] = {
        "cuModuleLoadData": attempt(cuda.cuModuleLoadData, image),
        "cuModuleLoadDataEx": attempt(cuda.cuModuleLoadDataEx, image, 0, None, None),
        "cuModuleLoadFatBinary": attempt(cuda.cuModuleLoadFatBinary, image),
        "cuLibraryLoadData": attempt(cuda.cuLibraryLoadData, image, None, None, 0, None, None, 0),
        "cuModuleLoad": attempt(cuda.cuModuleLoad, path.encode()),
        "cuLibraryLoadFromFile": attempt(cuda.cuLibraryLoadFromFile, path.encode(), None, None, 0, None, None, 0),
        "procaddr": attempt(load, image),
    }
out["jit_compiles"] = cuda.fake_jit_compiles()
report = inprocess_guard.report()
out["c_refusals"] = inprocess_guard.refusals() if report is not None else 0
out["skipped"] = report.skipped if report is not None else []
if report is not None:
    guards.deactivate()
    out["after_uninstall"] = attempt(cuda.cuModuleLoadData, PTX)
print(json.dumps(out))
"""
LOADERS = ("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData", "cuModuleLoad",
           "cuLibraryLoadFromFile", "procaddr")


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the stand-in driver")
@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_driver_ptx_loads_refused_cubins_passed_through_the_stand_in_libcuda(tmp_path, opt):
    """The attack: PTX text handed to each of libcuda's image loaders through ctypes (cuModuleLoadData, ...Ex,
    ...FatBinary, cuLibraryLoadData), a .ptx file to cuModuleLoad and cuLibraryLoadFromFile, and the PTX load through
    the function cuGetProcAddress hands out (the stand-in hands out a function of its own, not the export, as a
    driver may), the driver loaded after strict mode and before it. Control: with strict mode off the stand-in
    JIT-compiles every one (it counts). Under strict mode each answers CUDA_ERROR_JIT_COMPILATION_DISABLED with an
    event line naming the entry, nothing is compiled, and a cubin still loads through every one of them (through the
    trampoline to the original: the stand-in built at -O0 and -O2 gives different first instructions)."""
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", opt, "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "csrc", "fake_libcuda.c"), "-o", str(lib)], check=True)
    out = {}
    for mode in ("off", "strict", "early"):
        log = tmp_path / f"{mode}.jsonl"
        work = tmp_path / mode
        work.mkdir()
        env = {**os.environ, "NOJIT_EVENT_LOG": str(log), "FAKE_CUDA_PARAM_SIZES": "8"}
        proc = subprocess.run([sys.executable, "-c", _DRIVER_LOADS, mode, str(lib), str(work)], capture_output=True,
                              text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        out[mode]["events"] = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    off = out["off"]
    assert off["procaddr_is_export"] is False  # the stand-in's cuGetProcAddress hands out another function
    assert off["ptx"] == dict.fromkeys(LOADERS, 0) and off["jit_compiles"] == len(LOADERS), off  # control: compiled
    assert off["cubin"] == dict.fromkeys(LOADERS, 0), off
    for mode in ("strict", "early"):
        strict = out[mode]
        assert strict["skipped"] == [], strict
        assert strict["ptx"] == dict.fromkeys(LOADERS, 223), (mode, strict)  # CUDA_ERROR_JIT_COMPILATION_DISABLED
        assert strict["jit_compiles"] == 0 and strict["c_refusals"] == len(LOADERS), (mode, strict)
        assert strict["cubin"] == dict.fromkeys(LOADERS, 0), (mode, strict)  # a cubin goes on to the driver
        refused = sorted(e["symbol"] for e in strict["events"] if e["event"] == "compile_forbidden")
        assert refused == sorted([*LOADERS[:-1], "cuModuleLoadData"]), (mode, strict["events"])
        assert all(e["via"] == "in-process" and "neither a cubin nor a fatbin" in e["what"]
                   for e in strict["events"] if e["event"] == "compile_forbidden")
        assert strict["after_uninstall"] == 0  # lifted in the same process: the stand-in compiles again


_C_DLOPEN = r"""
import ctypes, json, os, sys
from nojit.loader.strict import guards, inprocess_guard
mode, how = sys.argv[1:3]
if mode == "strict":
    guards.install_strict_guards()
PTX = b".version 8.0\n.target sm_90\n.address_size 64\n\0"
libc = ctypes.CDLL(None)
libc.dlopen.restype = libc.dlsym.restype = ctypes.c_void_p
libc.dlopen.argtypes, libc.dlsym.argtypes = (ctypes.c_char_p, ctypes.c_int), (ctypes.c_void_p, ctypes.c_char_p)
if how == "c-dlopen":  # libc's dlopen called directly, as C code's own dlopen would: no ctypes load to rescan after
    handle = libc.dlopen(b"libcuda.so.1", os.RTLD_NOW)
else:  # _ctypes.dlopen, the function under ctypes._dlopen, then a CDLL around that handle
    import _ctypes
    handle = _ctypes.dlopen("libcuda.so.1", os.RTLD_NOW)
load = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p)(libc.dlsym(handle, b"cuModuleLoadData"))
print(json.dumps({"rc": load(ctypes.byref(ctypes.c_void_p()), PTX)}))
"""


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build the stand-in driver")
@pytest.mark.parametrize("how", ["c-dlopen", "_ctypes.dlopen"])
def test_a_driver_reached_without_a_ctypes_load_is_patched_too(tmp_path, how):
    """The attack: libcuda.so.1 (the stand-in, found through LD_LIBRARY_PATH as the real one is through the loader's
    path) opened after strict mode went up by libc's own dlopen (as C code does), or by _ctypes.dlopen (which skips
    ctypes._dlopen's rescan), then PTX handed to its cuModuleLoadData. Refused: strict mode loaded libcuda.so.1 itself
    at install (patched), and a second dlopen gets that copy; _ctypes.dlopen rescans. Control: strict mode off."""
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "csrc", "fake_libcuda.c"), "-o", str(tmp_path / "libcuda.so.1")], check=True)
    out = {}
    for mode in ("off", "strict"):
        env = {**os.environ, "NOJIT_EVENT_LOG": str(tmp_path / f"{mode}.jsonl"), "LD_LIBRARY_PATH": str(tmp_path)}
        proc = subprocess.run([sys.executable, "-c", _C_DLOPEN, mode, how], capture_output=True, text=True, env=env,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])["rc"]
    assert out == {"off": 0, "strict": 223}, out  # control: the stand-in JIT-compiles; strict: the stub refuses
    events = [json.loads(x) for x in (tmp_path / "strict.jsonl").read_text().splitlines()]
    assert [e for e in events if e.get("symbol") == "cuModuleLoadData"], events


_NVVM = r"""
import ctypes, glob, json, os, sys
import nvidia.cu13
from nojit.loader.strict import guards, inprocess_guard
if sys.argv[1] == "strict":
    guards.install_strict_guards()
lib = ctypes.CDLL(sorted(glob.glob(os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libnvvm.so.*")))[0])
IR = b'''target datalayout = "e-i64:64-i128:128-v16:16-v32:32-n16:32:64"
target triple = "nvptx64-nvidia-cuda"
define void @k(float* %x) {
  store float 1.0, float* %x
  ret void
}
!nvvm.annotations = !{!1}
!1 = !{void (float*)* @k, !"kernel", i32 1}
!nvvmir.version = !{!0}
!0 = !{i32 2, i32 0, i32 3, i32 2}
'''
prog = ctypes.c_void_p()
lib.nvvmCreateProgram(ctypes.byref(prog))
lib.nvvmAddModuleToProgram(prog, IR, len(IR), b"k")
rc = lib.nvvmCompileProgram(prog, 1, (ctypes.c_char_p * 1)(b"-arch=compute_90"))
ptx = b""
if rc == 0:
    size = ctypes.c_size_t()
    lib.nvvmGetCompiledResultSize(prog, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvvmGetCompiledResult(prog, buf)
    ptx = buf.value
print(json.dumps({"rc": rc, "entry": b".entry k" in ptx, "target": b".target sm_90" in ptx}))
"""


def test_nvvm_through_ctypes_is_refused(tmp_path):
    """The attack: NVVM IR compiled to PTX with a ctypes-loaded libnvvm (loaded after strict mode went up). Control:
    strict mode off, the same call writes PTX with the kernel's entry for sm_90. Strict: NVVM_ERROR_COMPILATION
    from the stub, nothing written, an event line."""
    import glob

    nvidia_cu13 = pytest.importorskip("nvidia.cu13")
    if not glob.glob(os.path.join(list(nvidia_cu13.__path__)[0], "lib", "libnvvm.so.*")):
        pytest.skip("no libnvvm in nvidia.cu13 here (the H200's image has none)")
    out = {}
    for mode in ("off", "strict"):
        env = {**os.environ, "NOJIT_EVENT_LOG": str(tmp_path / f"{mode}.jsonl")}
        proc = subprocess.run([sys.executable, "-c", _NVVM, mode], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["off"] == {"rc": 0, "entry": True, "target": True}, out  # control: NVVM compiles
    assert out["strict"] == {"rc": 9, "entry": False, "target": False}, out  # NVVM_ERROR_COMPILATION
    events = [json.loads(x) for x in (tmp_path / "strict.jsonl").read_text().splitlines()]
    assert [e for e in events if e.get("symbol") == "nvvmCompileProgram"], events


_TORCH_QUEUE = r"""
import json, sys, threading, traceback, types
from nojit.loader.strict import inprocess_guard
case = sys.argv[1]
m = types.ModuleType("torch.cuda")
m._queued_calls, m._initialization_lock = [], threading.Lock()
m.is_initialized = lambda: case == "initialized"
used = []
m._lazy_call = lambda call: used.append("_lazy_call")
if case == "other-torch":
    del m._queued_calls
def no_stack(*args, **kwargs):
    raise AssertionError("format_stack called")
traceback.format_stack = no_stack
calls = []
inprocess_guard._after_torch_cuda_init(m, lambda: calls.append(1))
queued = getattr(m, "_queued_calls", [])
for call, stack in queued:  # as torch's _lazy_init runs them, and formats the stack only if one fails
    assert callable(call) and "".join(stack)
    call()
print(json.dumps({"calls": len(calls), "queued": len(queued), "lazy_call": used}))
"""


@pytest.mark.parametrize("case,expected", [("not-initialized", {"calls": 1, "queued": 1, "lazy_call": []}),
                                           ("initialized", {"calls": 1, "queued": 0, "lazy_call": []}),
                                           ("other-torch", {"calls": 0, "queued": 0, "lazy_call": ["_lazy_call"]})])
def test_the_rescan_after_torchs_cuda_init_is_queued_as_lazy_call_would_without_reading_the_stack(case, expected):
    """strict mode's rescan after torch's CUDA initialization (which loads libcuda from C) is queued on torch's own
    queue, as `torch.cuda._lazy_call` queues it, or run at once when CUDA is up; the caller's stack, which
    _lazy_call formats (every calling frame's source file read), is not read. A torch whose queue is not the
    expected one gets `_lazy_call` itself."""
    proc = subprocess.run([sys.executable, "-c", _TORCH_QUEUE, case], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == expected


def test_the_rescan_queued_on_the_installed_torch_has_the_shape_torch_queues():
    """On the installed torch: the entry strict mode queues has the shape of those torch queues itself
    (_check_capability at import): (callable, list of str)."""
    torch_cuda = pytest.importorskip("torch.cuda")
    if torch_cuda.is_initialized() or not torch_cuda._queued_calls:
        pytest.skip("torch's CUDA is initialized (nothing queued)")
    from nojit.loader.strict import inprocess_guard

    ran = []
    before = list(torch_cuda._queued_calls)
    inprocess_guard._after_torch_cuda_init(torch_cuda, lambda: ran.append(1))
    try:
        (call, stack), = torch_cuda._queued_calls[len(before):]
        theirs = before[0]
        assert type(stack) is type(theirs[1]) is list and all(type(x) is str for x in (*stack, *theirs[1]))
        assert callable(call) and ran == []
    finally:
        torch_cuda._queued_calls[:] = before
