"""Strict mode reads a fatbin's entries before the driver does (csrc/nojit_inproc.c, inprocess_guard.py): the H200
(driver 580.159.04) JIT-compiled a PTX-only fatbin with CUDA_DISABLE_PTX_JIT=1 set before cuInit, so a fatbin goes
on only when it holds a cubin (ELF entry) for the GPU's SM, or nothing the driver could compile.

Written as the attack, with real fatbins the toolkit here makes (ptxas, fatbinary) handed to each of the stand-in
libcuda's image loaders through ctypes and through the function its cuGetProcAddress hands out: PTX only, PTX with
an sm_80 cubin, a fatbin wrapper around a PTX-only fatbin, a fatbin whose last entry is cut off, a file shorter than
its fatbin header says. Control: with strict mode off the stand-in takes every one, JIT-compiling (counted) those
with no sm_90 cubin, as the H200's driver did. Under strict mode each is refused with
CUDA_ERROR_JIT_COMPILATION_DISABLED and an event line, nothing is compiled, and the fatbins with an sm_90 (or sm_90a)
cubin, compressed or not, and an sm_80 cubin alone (nothing to compile) still load. The layout the C check reads is
checked here against fatbinary's output, independently of it."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from tests.support.common import ROOT  # noqa: E402
PTX = """.version 8.0
.target sm_80
.address_size 64
.visible .entry k(.param .u64 k_param_0)
{
    ret;
}
"""

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or shutil.which("ptxas") is None or shutil.which("fatbinary") is None,
    reason="needs a C compiler (the stand-in driver) and the CUDA toolkit's ptxas and fatbinary")


def _entries(fatbin: bytes) -> list[tuple[int, int]]:
    """(kind, SM) of each entry, read with the layout the C check assumes (header: u16 size at 6, u64 body at 8;
    entry: u16 kind, u32 header size at 4, u64 payload at 8, u32 SM at 28), every entry ending within the body."""
    magic, _, header, body = struct.unpack_from("<IHHQ", fatbin, 0)
    assert magic == 0xBA55ED50 and header + body == len(fatbin)
    found, off = [], header
    while off < header + body:
        kind, _, size, payload = struct.unpack_from("<HHIQ", fatbin, off)
        found.append((kind, struct.unpack_from("<I", fatbin, off + 28)[0]))
        off += size + payload
    assert off == header + body
    return found


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, bytes]:
    """The fatbins of the attack, made by the toolkit, by name."""
    d = tmp_path_factory.mktemp("fatbins")
    (d / "k.ptx").write_text(PTX)
    for sm in ("sm_90", "sm_90a", "sm_80"):
        subprocess.run(["ptxas", f"-arch={sm}", str(d / "k.ptx"), "-o", str(d / f"{sm}.cubin")], check=True)

    def fatbin(name: str, *images: str, flags: tuple[str, ...] = ()) -> bytes:
        subprocess.run(["fatbinary", "--64", *flags, f"--create={d / name}", *(f"--image3={i}" for i in images)],
                       check=True)
        return (d / name).read_bytes()

    ptx90, ptx90a = f"kind=ptx,sm=90,file={d / 'k.ptx'}", f"kind=ptx,sm=90a,file={d / 'k.ptx'}"
    out = {
        "ptx": fatbin("ptx.fatbin", ptx90),
        "ptx+sm_90": fatbin("both.fatbin", ptx90, f"kind=elf,sm=90,file={d / 'sm_90.cubin'}"),
        "ptx+sm_90a": fatbin("a.fatbin", ptx90a, f"kind=elf,sm=90a,file={d / 'sm_90a.cubin'}"),
        "ptx+sm_90 compressed": fatbin("c.fatbin", ptx90, f"kind=elf,sm=90,file={d / 'sm_90.cubin'}",
                                       flags=("--compress-all",)),
        "ptx+sm_80": fatbin("p80.fatbin", ptx90, f"kind=elf,sm=80,file={d / 'sm_80.cubin'}"),
        "sm_80": fatbin("e80.fatbin", f"kind=elf,sm=80,file={d / 'sm_80.cubin'}"),
    }
    assert _entries(out["ptx"]) == [(1, 90)] and _entries(out["ptx+sm_90"]) == [(1, 90), (2, 90)]
    assert _entries(out["ptx+sm_80"]) == [(1, 90), (2, 80)] and _entries(out["sm_80"]) == [(2, 80)]
    assert _entries(out["ptx+sm_90a"]) == [(1, 90), (2, 90)] == _entries(out["ptx+sm_90 compressed"])
    # the last entry (the sm_90 cubin) cut in half, the header saying so: its header is there, its payload is not
    both = out["ptx+sm_90"]
    cut = len(both) - 1500
    out["truncated"] = both[:6] + struct.pack("<HQ", 16, cut - 16) + both[16:cut]
    out["short file"] = both[:cut]  # the header still says the whole (a file only: a pointer has no size)
    return out


# name -> whether strict mode lets it on to the driver
EXPECTED = {"ptx": False, "ptx+sm_90": True, "ptx+sm_90a": True, "ptx+sm_90 compressed": True, "ptx+sm_80": False,
            "sm_80": True, "truncated": False, "short file": False, "wrapper(ptx)": False, "wrapper(ptx+sm_90)": True}
POINTER_LOADERS = ("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData", "procaddr")
FILE_LOADERS = ("cuModuleLoad", "cuLibraryLoadFromFile")

_LOADS = r"""
import ctypes, json, os, sys
from nojit.loader.strict import guards, inprocess_guard
mode, lib_path, work = sys.argv[1:4]
images = {name: bytes.fromhex(h) for name, h in json.loads(open(os.path.join(work, "images.json")).read()).items()}
if mode == "strict":
    guards.install_strict_guards()
cuda = ctypes.CDLL(lib_path)  # after strict mode: patched on arrival
P = ctypes.POINTER(ctypes.c_void_p)
def attempt(fn, *args):
    return fn(ctypes.byref(ctypes.c_void_p()), *args)
out = {"before_cuInit": attempt(cuda.cuModuleLoadData, images["ptx+sm_90"])}  # the GPU's SM is not known yet
cuda.cuInit(0)
pfn, status = ctypes.c_void_p(), ctypes.c_int()
cuda.cuGetProcAddress_v2(b"cuModuleLoadData", ctypes.byref(pfn), 12000, 0, ctypes.byref(status))
procaddr = ctypes.CFUNCTYPE(ctypes.c_int, P, ctypes.c_void_p)(pfn.value)
class Wrapper(ctypes.Structure):  # __fatBinC_Wrapper_t (fatbinary_section.h)
    _fields_ = [("magic", ctypes.c_int), ("version", ctypes.c_int), ("data", ctypes.c_void_p), ("filename", ctypes.c_void_p)]
keep = []
for name in ("ptx", "ptx+sm_90"):
    buf = ctypes.create_string_buffer(images[name], len(images[name]))
    keep.append(buf)
    images[f"wrapper({name})"] = Wrapper(0x466243B1, 1, ctypes.addressof(buf), None)
rc = {}
for name, image in images.items():
    is_wrapper = isinstance(image, ctypes.Structure)
    arg = ctypes.addressof(image) if is_wrapper else image
    row = {}
    if name != "short file":  # a pointer has no size: the header's is what there is
        loads = {"cuModuleLoadData": lambda a: attempt(cuda.cuModuleLoadData, a),
                 "cuModuleLoadDataEx": lambda a: attempt(cuda.cuModuleLoadDataEx, a, 0, None, None),
                 "cuModuleLoadFatBinary": lambda a: attempt(cuda.cuModuleLoadFatBinary, a),
                 "cuLibraryLoadData": lambda a: attempt(cuda.cuLibraryLoadData, a, None, None, 0, None, None, 0),
                 "procaddr": lambda a: attempt(procaddr, a)}
        for loader, load in loads.items():
            row[loader] = load(ctypes.c_void_p(arg) if is_wrapper else arg)
    if not is_wrapper:  # a wrapper holds a pointer: not a file's content
        path = os.path.join(work, name.replace(" ", "_").replace("+", "_") + ".fatbin").encode()
        open(path, "wb").write(image)
        row["cuModuleLoad"] = attempt(cuda.cuModuleLoad, path)
        row["cuLibraryLoadFromFile"] = attempt(cuda.cuLibraryLoadFromFile, path, None, None, 0, None, None, 0)
    rc[name] = row
out["rc"] = rc
out["jit_compiles"] = cuda.fake_jit_compiles()
report = inprocess_guard.report()
out["c_refusals"] = inprocess_guard.refusals() if report is not None else 0
out["skipped"] = report.skipped if report is not None else []
print(json.dumps(out))
"""


def _stand_in(tmp_path) -> str:
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-I", os.path.join(ROOT, "csrc"),
                    os.path.join(ROOT, "tests", "csrc", "fake_libcuda.c"), "-o", str(lib)], check=True)
    return str(lib)


def test_fatbins_that_need_the_jit_are_refused_through_the_stand_in_libcuda(tmp_path, images):
    """Every fatbin of the attack through every image loader of the stand-in (ctypes exports, the function its
    cuGetProcAddress hands out, files), strict mode off (control) and on; and one load before cuInit, when the GPU's
    SM is not known yet."""
    lib = _stand_in(tmp_path)
    out = {}
    for mode in ("off", "strict"):
        work = tmp_path / mode
        work.mkdir()
        (work / "images.json").write_text(json.dumps({k: v.hex() for k, v in images.items()}))
        log = tmp_path / f"{mode}.jsonl"
        env = {**os.environ, "NOJIT_EVENT_LOG": str(log), "FAKE_CUDA_SM": "90"}
        proc = subprocess.run([sys.executable, "-c", _LOADS, mode, lib, str(work)], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        out[mode]["events"] = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    expected_loaders = {name: (FILE_LOADERS if name == "short file" else
                               POINTER_LOADERS if name.startswith("wrapper") else POINTER_LOADERS + FILE_LOADERS)
                        for name in EXPECTED}
    off, strict = out["off"], out["strict"]
    assert {k: sorted(v) for k, v in off["rc"].items()} == {k: sorted(v) for k, v in expected_loaders.items()}
    # control: the stand-in takes every one, JIT-compiling those with no sm_90 cubin (a cut-off file has its cubin)
    assert all(rc == 0 for row in off["rc"].values() for rc in row.values()) and off["before_cuInit"] == 0, off
    jitted = sum(len(expected_loaders[n]) for n, ok in EXPECTED.items() if not ok and n != "short file")
    assert off["jit_compiles"] == jitted > 0 and off["c_refusals"] == 0, off
    # strict: refused (CUDA_ERROR_JIT_COMPILATION_DISABLED) exactly where the driver would compile or read past the end
    assert strict["skipped"] == [], strict
    assert strict["rc"] == {name: dict.fromkeys(expected_loaders[name], 0 if ok else 223)
                            for name, ok in EXPECTED.items()}, strict["rc"]
    assert strict["before_cuInit"] == 223  # the SM is not known before cuInit: a fatbin with PTX waits for it
    refused = sum(len(expected_loaders[n]) for n, ok in EXPECTED.items() if not ok) + 1
    assert strict["jit_compiles"] == 0 and strict["c_refusals"] == refused, strict
    events = [e for e in strict["events"] if e["event"] == "compile_forbidden"]
    assert len(events) == refused and all(e["via"] == "in-process" and "fatbin" in e["what"] for e in events), events
    assert sum("no sm_90 cubin" in e["what"] for e in events) == 7 + 7 + 5  # ptx, ptx+sm_80, wrapper(ptx)
    assert sum("truncated" in e["what"] or "past its end" in e["what"] for e in events) == 7 + 2


_BINDINGS = r"""
import ctypes, json, os, sys
from cuda.bindings import driver
from nojit.loader.strict import guards
from nojit.loader.errors import CompileForbiddenError
mode, lib_path, work = sys.argv[1:4]
images = {name: bytes.fromhex(h) for name, h in json.loads(open(os.path.join(work, "images.json")).read()).items()}
if mode == "strict":
    guards.install_strict_guards()
ctypes.CDLL(lib_path).cuInit(0)  # the stand-in, patched on arrival: the GPU's SM is asked of it
out = {}
for name, image in images.items():
    path = os.path.join(work, name.replace(" ", "_").replace("+", "_") + ".fatbin")
    open(path, "wb").write(image)
    for how, call in (("data", lambda: driver.cuModuleLoadData(image)), ("file", lambda: driver.cuModuleLoad(path))):
        if how == "data" and name == "short file":
            continue
        try:
            out[f"{name} {how}"] = "driver answered " + str(call()[0])
        except CompileForbiddenError as exc:
            out[f"{name} {how}"] = "forbidden: " + exc.message
        except Exception as exc:  # no driver on this box: cuda.bindings cannot find libcuda
            out[f"{name} {how}"] = "driver answered " + type(exc).__name__
print(json.dumps(out))
"""


def test_bindings_driver_refuses_fatbins_that_need_the_jit(tmp_path, images):
    """The same fatbins handed to cuda.bindings.driver.cuModuleLoadData (bytes) and cuModuleLoad (a file): strict mode
    raises CompileForbiddenError before the driver where the C stub would refuse (the same C check, the SM from the
    stand-in libcuda loaded in that process); the rest go on to the driver (none on this box: it answers an error).
    Control: strict mode off, every one reaches the driver."""
    pytest.importorskip("cuda.bindings")
    lib = _stand_in(tmp_path)
    out = {}
    for mode in ("off", "strict"):
        work = tmp_path / mode
        work.mkdir()
        (work / "images.json").write_text(json.dumps({k: v.hex() for k, v in images.items()}))
        env = {**os.environ, "NOJIT_EVENT_LOG": str(tmp_path / f"{mode}.jsonl")}
        proc = subprocess.run([sys.executable, "-c", _BINDINGS, mode, lib, str(work)], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(v.startswith("driver answered") for v in out["off"].values()), out["off"]
    for key, answer in out["strict"].items():
        ok = EXPECTED[key.rsplit(" ", 1)[0]]
        assert answer.startswith("driver answered" if ok else "forbidden: strict mode: the CUDA driver"), (key, answer)
    assert len(out["strict"]) == 2 * len(images) - 1
