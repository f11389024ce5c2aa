"""Strict mode's guard against compilers that run inside the serving process, with no process to refuse.

NVRTC (CUDA C++ to SASS), nvJitLink (PTX/LTO-IR to SASS) and NVVM (NVVM IR to PTX) are libraries:
the firewall's stand-ins never see them. In strict mode each exported compile entry of every loaded
copy is hot-patched (x86-64, csrc/nojit_inproc.c) to jump to a refusing stub that returns the
library's own error code and writes the firewall's event line:

| library (file name) | entries refused | error returned |
|---|---|---|
| libnvrtc.so*, libnvrtc.alt.so* | nvrtcCompileProgram | NVRTC_ERROR_COMPILATION |
| libnvJitLink.so* | nvJitLinkAddData, nvJitLinkAddFile, nvJitLinkComplete (and their `__..._13_N` versions) | NVJITLINK_ERROR_INVALID_INPUT / _PTX_COMPILE |
| libnvvm.so* | nvvmCompileProgram | NVVM_ERROR_COMPILATION |
| libcuda.so* | cuLinkAddData, cuLinkAddFile (and `_v2`): the driver's linker, every input | CUDA_ERROR_JIT_COMPILATION_DISABLED |
| libcuda.so* | cuModuleLoadData, cuModuleLoadDataEx, cuModuleLoadFatBinary, cuLibraryLoadData, cuModuleLoad, cuLibraryLoadFromFile: an image (or file) that is neither a cubin nor a fatbin, or a fatbin (or fatbin wrapper) with PTX but no cubin for the GPU's SM, or a malformed one | CUDA_ERROR_JIT_COMPILATION_DISABLED |

An exported compiler entry that is only a `jmp` to its body (nvJitLink's and NVVM's are) is followed to the body,
which is patched instead, so every versioned alias lands in the stub too. A fatbin is read entry by entry, as the
driver chooses among them: it goes on if it holds an ELF (SASS) entry for every visible GPU's SM (asked of the
driver through the patched libcuda's own cuDeviceGetAttribute, once), or nothing but ELF entries; one whose PTX the
driver would JIT-compile, or whose sizes run past its end, is refused (CUDA_DISABLE_PTX_JIT=1 did not stop the
H200's driver 580 from JIT-compiling a PTX-only fatbin). The driver's image loaders must go on loading cubins: their stubs check the image and call the original through a trampoline of its moved first
instructions (x86_relocate.py; an entry that is itself only `jmp rel32` is patched with a 5-byte jump to a thunk and
its stub calls that jump's destination); the file loaders read the file once and hand the bytes to the data
loader. An entry whose first instructions cannot be moved is left unpatched and named in `skipped`. What libcuda's
cuGetProcAddress hands out for each guarded name is patched too when it is not the export (cudart, Triton and
cuda.bindings take entries that way). Copies loaded later are patched when they arrive: after every `ctypes.CDLL`
and `_ctypes.dlopen` (cuda.bindings and cuda.pathfinder load NVRTC and nvJitLink that way), every extension module
import (an extension linked against one of them), and cuda.bindings' `cuInit`/`cuGetProcAddress`. Strict mode
loads `libcuda.so.1` itself at activate() (no cuInit), so a later dlopen of it from C gets the patched copy. Python
wrappers (`cuda.bindings.nvrtc.nvrtcCompileProgram`, `cuda.bindings.nvjitlink.add_data/add_file/complete`,
`cuda.bindings.nvvm.compile_program`, `cuda.bindings.driver.cuLinkAddData/cuLinkAddFile`, and the image loaders of
`cuda.bindings.driver` given an image or file the C stubs would refuse, checked by the same C code) raise CompileForbiddenError
before reaching C. Another compiler library loaded later by C code's own dlopen is patched only at the next ctypes
load, extension import or `rescan()`. Patching an entry while another thread runs its first bytes is not safe:
activate() runs before CUDA is used (vLLM's plugin), and later copies are patched as they load.

The driver's PTX JIT: `CUDA_DISABLE_PTX_JIT=1` is set here, before CUDA initializes when install() runs
where vLLM's plugin runs it (workers: vllm/v1/worker/worker_base.py:289, `init_worker`, before the worker class
and its device; the engine core and the API server initialize no CUDA before it). If this process already initialized CUDA,
the variable reaches only child processes, and activate() says so (`ptx_jit` of the report).

Who uses these in the serving process legitimately (read from vLLM 0.33.0's installed packages): torch
links libnvrtc for its jiterator (a few elementwise ops, e.g. torch.special's Bessel functions and some
complex-number ops, compile at first use: refused in strict mode, torch raises); DeepGEMM 2.8.1 (vendored)
compiles with nvcc only; TensorRT-LLM's DeepGEMM copy in FlashInfer links NVRTC but always uses nvcc
(`kJitUseNvcc` is hard-wired true); cuSPARSE/cuFFT use nvJitLink only for their JIT-LTO features; Humming runs
NVRTC in a child process, not here. Nothing vLLM's DeepSeek-V4 path serves from the bundle calls them.

Other in-process compilers that cannot be patched this way (LLVM through llvmlite/numba's CPU JIT, CuPy's
and PyCUDA's wrappers around the same libraries, ...) are reported when importable (`importable_compilers`),
never imported to find out.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.strict import firewall
from nojit.loader.strict import x86_relocate
from nojit.loader.errors import CompileForbiddenError

# (file-name pattern of the library, symbol pattern -> stub name); a stub is named after the entry it refuses
_LIBRARIES: tuple[tuple[re.Pattern[str], re.Pattern[str]], ...] = (
    (re.compile(r"libnvrtc(\.alt)?\.so(\.[0-9]+)*$"), re.compile(r"(nvrtcCompileProgram)$")),
    (re.compile(r"libnvJitLink\.so(\.[0-9]+)*$"),
     re.compile(r"(?:__)?(nvJitLinkAddData|nvJitLinkAddFile|nvJitLinkComplete)(?:_[0-9]+_[0-9]+)?$")),
    (re.compile(r"libnvvm\.so(\.[0-9]+)*$"), re.compile(r"(nvvmCompileProgram)$")),
    (re.compile(r"libcuda\.so(\.[0-9]+)*$"), re.compile(r"(cuLinkAddData|cuLinkAddFile)(?:_v2)?$"
                                                          r"|(cuModuleLoadData|cuModuleLoadDataEx|cuModuleLoadFatBinary"
                                                          r"|cuLibraryLoadData|cuModuleLoad|cuLibraryLoadFromFile)")),
)
# libcuda's image loaders: their stubs pass a cubin or a fatbin on. Those that take an image call the original
# through a trampoline; those that take a path read the file and hand its bytes to the data loader named here.
_DATA_LOADERS = ("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData")
_FILE_LOADERS = {"cuModuleLoad": "cuModuleLoadData", "cuLibraryLoadFromFile": "cuLibraryLoadData"}
# names asked of cuGetProcAddress (CUDA 12.0 and later ABI versions): a function it hands out that is not the
# patched export is patched too
_PROC_NAMES = ("cuLinkAddData", "cuLinkAddFile", *_DATA_LOADERS, *_FILE_LOADERS)
# what the fatbin check asks of libcuda for the GPUs' SMs (their exports, not what cuGetProcAddress hands out)
_DEVICE_QUERY = ("cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute")
# importable in-process compilers this guard cannot patch: reported, not refused
IN_PROCESS_COMPILERS = ("numba", "llvmlite", "cupy", "pycuda", "warp", "jax", "taichi")
# event lines activate() writes that report a state, not a refusal
STATUS_EVENTS = frozenset({"inprocess_compiler_importable", "ptx_jit_not_disabled"})


@dataclass
class InprocessReport:
    """What activate() did: the entries patched (library, symbol), what is only reported, the PTX JIT."""

    patched: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # entries found but not patchable, with why
    importable: tuple[str, ...] = ()
    ptx_jit: str = ""

    def summary(self) -> str:
        libs = sorted({os.path.basename(lib) for lib, _ in self.patched})
        text = f"in-process compilers refused in {', '.join(libs) or 'no loaded library yet'}; {self.ptx_jit}"
        if self.importable:
            text += f"; importable, not refused: {', '.join(self.importable)}"
        return text


_lock = threading.RLock()
_state: dict[str, Any] = {"active": False, "adds": -1, "fd": -1, "env": None, "report": None}
_patches: dict[int, tuple[bytes, str, str]] = {}  # address -> (original code, library, symbol)
_exports: dict[tuple[str, str], int] = {}  # (library path, symbol) -> its address, for each guarded library
_slots: dict[str, int] = {}  # loader stub -> slots used
_pending_proc: set[str] = set()  # libcuda copies whose cuGetProcAddress answered "not initialized"
_seen: set[tuple[str, int]] = set()  # (library path, load bias) already scanned
_restore: list[tuple[Any, str, Any]] = []
_wrapped: set[tuple[str, str]] = set()  # (module, attribute) of _WRAPPERS replaced now


def _native() -> Any:
    from nojit.loader import _inproc  # type: ignore[attr-defined]

    return _inproc


def _exported_functions(path: str) -> list[tuple[str, int, int]]:
    """(name, st_value, st_size) of the defined functions in an x86-64 ELF's dynamic symbol table (no dlopen, no mmap)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or struct.unpack_from("<H", head, 18)[0] != 62:
            return []
        shoff, = struct.unpack_from("<Q", head, 40)
        shentsize, shnum = struct.unpack_from("<HH", head, 58)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        sections = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        found: list[tuple[str, int, int]] = []
        for sh in sections:
            if sh[1] != 11:  # SHT_DYNSYM
                continue
            strtab = sections[sh[6]]
            f.seek(sh[4])
            syms = f.read(sh[5])
            f.seek(strtab[4])
            names = f.read(strtab[5])
            for off in range(0, len(syms) - 23, 24):
                st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", syms, off)
                if st_shndx == 0 or st_info & 0xF != 2 or not st_value:  # defined STT_FUNC only
                    continue
                end = names.index(b"\0", st_name)
                found.append((names[st_name:end].decode(errors="replace"), st_value, st_size))
        return found


def _body(address: int) -> int:
    """Follow an entry that is only a jump (`jmp rel32`/`jmp rel8`) to the code it jumps to."""
    import ctypes

    for _ in range(4):
        code = ctypes.string_at(address, 5)
        if code[0] == 0xE9:
            address = address + 5 + struct.unpack_from("<i", code, 1)[0]
        elif code[0] == 0xEB:
            address = address + 2 + struct.unpack_from("<b", code, 1)[0]
        else:
            break
    return address


def _patch_at(address: int, stub: str, path: str, name: str, report: InprocessReport, size: int | None) -> bool:
    """Patch one entry to its stub; False (with why in the report) if it cannot be. `size` is the symbol's size, None
    for a function cuGetProcAddress handed out (then its first instructions must decode, so a short one is not
    overwritten past its end). A loader's stub gets a slot and its target: the original, reached through a
    trampoline of its moved first instructions (or, for an entry that is only `jmp rel32`, that jump's
    destination), or for a file loader the data loader's export."""
    native = _native()
    if address in _patches:
        return True
    loader = stub in _DATA_LOADERS or stub in _FILE_LOADERS
    code = _code_at(address, 32)
    thunk = 0
    jump_only = loader and code[0] == 0xE9  # a 5-byte jump: patched with a 5-byte jump to a thunk near it
    if jump_only:
        thunk = native.trampoline_alloc(address)
        if not thunk:
            report.skipped.append(f"{path}:{name}: not patched (no page within reach for its thunk)")
            return False
    elif size is not None and 0 < size < native.PATCH_LEN:  # the jump would overwrite the next function
        report.skipped.append(f"{path}:{name}: not patched ({size} bytes, neither a jump nor {native.PATCH_LEN} long)")
        return False
    elif (loader or size is None) and x86_relocate.lengths(code, native.PATCH_LEN) is None:
        report.skipped.append(f"{path}:{name}: not patched (its first instructions cannot be moved)")
        return False
    args: tuple[Any, ...] = ()
    if loader:
        slot = _slots.get(stub, 0)
        if slot >= native.SLOTS:
            report.skipped.append(f"{path}:{name}: not patched (more than {native.SLOTS} copies)")
            return False
        if stub in _FILE_LOADERS:
            target = _exports.get((path, _FILE_LOADERS[stub]), 0)
        elif jump_only:
            target = address + 5 + struct.unpack_from("<i", code, 1)[0]
        else:
            page = native.trampoline_alloc(address)
            trampoline = x86_relocate.relocate(code, address, page, native.PATCH_LEN) if page else None
            if trampoline is None:
                report.skipped.append(f"{path}:{name}: not patched (no trampoline within reach)")
                return False
            native.trampoline_write(page, trampoline)
            target = page
        if not target:
            report.skipped.append(f"{path}:{name}: not patched (no {_FILE_LOADERS[stub]} to hand the file to)")
            return False
        args = (slot, target, thunk)
        _slots[stub] = slot + 1
    try:
        original = native.patch(address, stub, *args)
    except (OSError, ValueError) as exc:
        report.skipped.append(f"{path}:{name}: not patched ({exc})")
        return False
    _patches[address] = (original, path, name)
    report.patched.append((path, name))
    return True


def _code_at(address: int, size: int) -> bytes:
    import ctypes

    return ctypes.string_at(address, size)


def _patch_library(path: str, bias: int, symbol_pattern: re.Pattern[str], report: InprocessReport) -> None:
    native = _native()
    try:
        functions = _exported_functions(path)
    except (OSError, ValueError, struct.error) as exc:
        report.skipped.append(f"{path}: symbol table unreadable ({exc})")
        return
    found = []
    for name, value, size in functions:
        if name in ("cuGetProcAddress_v2", "cuDriverGetVersion", *_DEVICE_QUERY):
            _exports[(path, name)] = bias + value
        m = symbol_pattern.fullmatch(name)
        if m is not None:
            found.append((name, bias + value, size, next(g for g in m.groups() if g)))
            _exports[(path, name)] = bias + value
    for name, entry, size, stub in found:
        # a compiler's entry that is only a jump is followed to its body (every versioned alias lands there); a
        # loader is patched where it is, as its stub calls the original and a shared body may take other arguments
        address = entry if stub in _DATA_LOADERS or stub in _FILE_LOADERS else _body(entry)
        _patch_at(address, stub, path, name, report, size if address == entry else native.PATCH_LEN)
    if any(stub in _DATA_LOADERS for _, _, _, stub in found):
        query = [_exports.get((path, name), 0) for name in _DEVICE_QUERY]
        if all(query) and not _state.get("device_query"):  # the first libcuda: every copy reports the same GPUs
            native.set_device_query(*query)
            _state["device_query"] = path
        _patch_proc_addresses(path, report)


def _patch_proc_addresses(path: str, report: InprocessReport) -> None:
    """Patch what this libcuda's cuGetProcAddress hands out for each guarded name, where that is not the patched
    export (cudart, Triton and cuda.bindings take driver entries that way). Called before or after cuInit."""
    import ctypes

    get, version = _exports.get((path, "cuGetProcAddress_v2")), _exports.get((path, "cuDriverGetVersion"))
    if not get or not version:
        return
    driver = ctypes.c_int(0)
    if ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)(version)(ctypes.byref(driver)) != 0:
        return
    lookup = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64,
                              ctypes.c_void_p)(get)
    for name in _PROC_NAMES:
        for abi in sorted({v for v in (12000, 13000, driver.value) if v <= driver.value}):
            pfn, status = ctypes.c_void_p(0), ctypes.c_int(0)
            rc = lookup(name.encode(), ctypes.byref(pfn), abi, 0, ctypes.byref(status))
            if rc == 3:  # CUDA_ERROR_NOT_INITIALIZED: asked again at the next rescan (torch's CUDA init, cuInit)
                _pending_proc.add(path)
                return
            if rc != 0 or not pfn.value:
                continue
            address = pfn.value if name in _DATA_LOADERS or name in _FILE_LOADERS else _body(pfn.value)
            if address not in _patches:
                _patch_at(address, name, path, f"{name} (cuGetProcAddress, {abi})", report, None)


def rescan() -> InprocessReport | None:
    """Patch every copy of the libraries loaded since the last scan (cheap when nothing new loaded)."""
    with _lock:
        report = _state["report"]
        if not _state["active"] or report is None:
            return None
        if platform.machine() not in ("x86_64", "AMD64"):  # the patch is x86-64 code
            if not report.skipped:
                report.skipped.append(f"{platform.machine()}: entries not patched (x86-64 only); Python wrappers only")
            return report
        native = _native()
        for path in sorted(_pending_proc):
            _pending_proc.discard(path)
            _patch_proc_addresses(path, report)
        if native.adds() == _state["adds"]:
            return report
        adds, objects = native.loaded()
        _state["adds"] = adds
        for path, bias in objects:
            if (path, bias) in _seen:
                continue
            _seen.add((path, bias))
            base = os.path.basename(path)
            for name_pattern, symbol_pattern in _LIBRARIES:
                if name_pattern.match(base):
                    _patch_library(path, bias, symbol_pattern, report)
        return report


def importable_compilers() -> tuple[str, ...]:
    """The in-process compilers of IN_PROCESS_COMPILERS that could be imported here (found, not imported)."""
    found = []
    for name in IN_PROCESS_COMPILERS:
        try:
            if name in sys.modules or importlib.util.find_spec(name) is not None:
                found.append(name)
        except (ImportError, ValueError):
            continue
    return tuple(found)


def _cuda_initialized() -> bool:
    """Whether this process has initialized CUDA (torch's flag, else the driver's own answer if it is loaded)."""
    torch_cuda = sys.modules.get("torch.cuda")
    if torch_cuda is not None and getattr(torch_cuda, "is_initialized", lambda: False)():
        return True
    if not any(os.path.basename(p).startswith("libcuda.so") for p, _ in _native().loaded()[1]):
        return False
    import ctypes

    try:
        count = ctypes.c_int(0)
        lib = ctypes.CDLL("libcuda.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        return lib.cuDeviceGetCount(ctypes.byref(count)) != 3  # CUDA_ERROR_NOT_INITIALIZED before cuInit
    except (OSError, AttributeError):
        return False


# What guards.py hands this module at activate(): its one refusal (recorded, logged, raised) and its after-import
# finder, so that this module imports nothing of guards.py (which imports it).
_from_guards: dict[str, Any] = {"forbid": None, "after_import": None}


def _forbid(what: str) -> CompileForbiddenError:
    return _from_guards["forbid"](what, {"via": "in-process"})  # the one refusal: recorded, logged, raised


def _refusing(what: str) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise _forbid(what)

    return refused


# Python wrappers refused before C: module -> attribute -> what is refused
_WRAPPERS: dict[str, dict[str, str]] = {
    "cuda.bindings.nvrtc": {"nvrtcCompileProgram": "NVRTC (cuda.bindings.nvrtc.nvrtcCompileProgram) was about to compile CUDA C++"},
    "cuda.bindings.nvjitlink": {
        "add_data": "nvJitLink (cuda.bindings.nvjitlink.add_data) was about to take input to compile or link",
        "add_file": "nvJitLink (cuda.bindings.nvjitlink.add_file) was about to take input to compile or link",
        "complete": "nvJitLink (cuda.bindings.nvjitlink.complete) was about to compile or link",
    },
    "cuda.bindings.nvvm": {"compile_program": "NVVM (cuda.bindings.nvvm.compile_program) was about to compile"},
    "cuda.bindings.driver": {
        "cuLinkAddData": "the CUDA driver's linker (cuda.bindings.driver.cuLinkAddData) was about to compile or link",
        "cuLinkAddFile": "the CUDA driver's linker (cuda.bindings.driver.cuLinkAddFile) was about to compile or link",
    },
}
# cuda.bindings.driver entries that load an image (or a file: its path is the first argument of cuModuleLoad and of
# cuLibraryLoadFromFile): refused when the C stubs would refuse the image
_IMAGE_LOADERS = ("cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary", "cuLibraryLoadData",
                  "cuModuleLoad", "cuLibraryLoadFromFile")
# cuda.bindings.driver entries after which libcuda is loaded (bindings dlopen it from C): rescanned after the call,
# so the pointers cuGetProcAddress hands out are patched before anyone calls them
_RESCAN_AFTER = ("cuInit", "cuGetProcAddress", "cuDriverGetVersion")


def _image_refusal(image: Any) -> str | None:
    """Why the C stubs would refuse an image passed to a driver load (bytes, a buffer, str, or an address), None if
    they would not or the image's form is unknown here (the patched C entry checks it then)."""
    if isinstance(image, str):
        image = image.encode()
    if isinstance(image, (bytes, bytearray, memoryview)):
        return _native().image_refusal(bytes(image))
    if isinstance(image, int) and image:
        return _native().image_refusal(image)
    return None


def _file_refusal(path: Any) -> str | None:
    """Why the C stubs would refuse the file a driver load names (None if it cannot be read: the driver answers that)."""
    try:
        with open(os.fsdecode(path) if isinstance(path, (str, bytes)) else path, "rb") as f:
            data = f.read()
    except (OSError, TypeError, ValueError):
        return None
    return _native().image_refusal(data, True)


def _refusing_ptx(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def load(*args: Any, **kwargs: Any) -> Any:
        image = args[0] if args else next(iter(kwargs.values()), None)  # the image (or the path) is the first parameter
        why = _file_refusal(image) if name in ("cuModuleLoad", "cuLibraryLoadFromFile") else _image_refusal(image)
        if why is not None:
            raise _forbid(f"the CUDA driver (cuda.bindings.driver.{name}) was about to JIT-compile {why}")
        return original(*args, **kwargs)

    return load


def _rescanning(original: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        rescan()
        return result

    return call


def _guard_wrappers() -> None:
    with _lock:
        if not _state["active"]:
            return
        for module_name, names in _WRAPPERS.items():
            module = sys.modules.get(module_name)
            if module is None:
                continue
            # a module still executing (one of these imports another) lacks its functions yet: each name is
            # wrapped once it is there, so a later call (its import finishing) wraps the rest
            driver = module_name == "cuda.bindings.driver"
            for name in (*names, *(_IMAGE_LOADERS + _RESCAN_AFTER if driver else ())):
                if (module_name, name) in _wrapped or not hasattr(module, name):
                    continue
                original = getattr(module, name)
                _restore.append((module, name, original))
                wrapped = (_refusing_ptx(name, original) if driver and name in _IMAGE_LOADERS else
                           _rescanning(original) if driver and name in _RESCAN_AFTER else _refusing(names[name]))
                setattr(module, name, wrapped)
                _wrapped.add((module_name, name))
        rescan()


def _hook_loaders() -> None:
    """Rescan after every ctypes load and every extension module import (cheap: a counter of loads)."""
    import ctypes
    import importlib.machinery

    RunAfterImport = _from_guards["after_import"]  # noqa: N806 (a class)

    original_dlopen = ctypes._dlopen  # type: ignore[attr-defined]

    def dlopen_then_rescan(*args: Any, **kwargs: Any) -> Any:
        handle = original_dlopen(*args, **kwargs)
        rescan()
        return handle

    _restore.append((ctypes, "_dlopen", original_dlopen))
    ctypes._dlopen = dlopen_then_rescan  # type: ignore[attr-defined]
    import _ctypes  # the same function under its own name: `CDLL(path, handle=_ctypes.dlopen(path))` skips ctypes._dlopen

    _restore.append((_ctypes, "dlopen", _ctypes.dlopen))
    _ctypes.dlopen = dlopen_then_rescan
    loader = importlib.machinery.ExtensionFileLoader
    create = loader.create_module

    def create_then_rescan(self: Any, spec: Any) -> Any:
        module = create(self, spec)
        rescan()
        return module

    _restore.append((loader, "create_module", create))
    loader.create_module = create_then_rescan  # type: ignore[method-assign]
    torch_cuda = sys.modules.get("torch.cuda")
    if torch_cuda is not None and hasattr(torch_cuda, "_lazy_call"):  # libcuda arrives with torch's CUDA init (C)
        _after_torch_cuda_init(torch_cuda, rescan)
    finder = RunAfterImport(lambda name: name in _WRAPPERS and _state["active"], _guard_wrappers)
    sys.meta_path.insert(0, finder)
    _state["finder"] = finder


_QUEUED_AT = ["  queued by nojit.loader.strict.inprocess_guard._hook_loaders (strict mode's install): the rescan that "
              "patches the libraries torch's CUDA initialization loaded\n"]


def _after_torch_cuda_init(torch_cuda: Any, call: Callable[[], Any]) -> None:
    """What `torch.cuda._lazy_call(call)` does (call now if CUDA is initialized, else queue it for torch's
    initialization, under torch's lock), without the stack it keeps for the error message of a queued call that
    fails: traceback.format_stack reads the source file of every calling frame (linecache), which in a vLLM
    worker (the plugin runs some 40 frames deep) costs milliseconds at each start. The message names this
    function instead. Where torch's queue is not the one expected, `_lazy_call` itself."""
    queue = getattr(torch_cuda, "_queued_calls", None)
    lock = getattr(torch_cuda, "_initialization_lock", None)
    initialized = getattr(torch_cuda, "is_initialized", None)
    if type(queue) is not list or lock is None or not callable(initialized):
        torch_cuda._lazy_call(call)
        return
    with lock:
        if initialized():
            call()
        else:
            queue.append((call, list(_QUEUED_AT)))


def _preload_driver() -> None:
    """Load libcuda.so.1 now (no cuInit: nothing initializes), so that its loaders are patched before any code can
    reach them: a later dlopen of the same file from C (cudart, cuda.bindings, nojit's launcher) gets this patched
    copy, where without it that copy would wait for the next rescan. No driver here: nothing to do."""
    import ctypes

    try:
        ctypes.CDLL("libcuda.so.1")  # through ctypes._dlopen: rescanned (patched) on arrival
    except OSError:
        pass


def activate(forbid: Callable[..., CompileForbiddenError], after_import: type) -> InprocessReport:
    """Strict mode: set CUDA_DISABLE_PTX_JIT=1, patch every loaded copy now and each copy loaded later,
    guard the Python wrappers, report importable compilers (idempotent; a second call rescans). `forbid` and
    `after_import` are guards.py's refusal and after-import finder."""
    _from_guards.update(forbid=forbid, after_import=after_import)
    with _lock:
        if _state["active"]:
            rescan()
            _guard_wrappers()
            return _state["report"]
        report = InprocessReport()
        initialized = _cuda_initialized()
        _state["env"] = os.environ.get("CUDA_DISABLE_PTX_JIT")
        os.environ["CUDA_DISABLE_PTX_JIT"] = "1"
        report.ptx_jit = ("driver PTX JIT on in this process (CUDA was initialized before nojit; "
                          "CUDA_DISABLE_PTX_JIT=1 reaches child processes only)" if initialized else
                          "driver PTX JIT off (CUDA_DISABLE_PTX_JIT=1 before CUDA initialized)")
        try:
            fd = os.open(firewall.event_log_path(), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | os.O_NOFOLLOW, 0o600)
        except (OSError, Exception):  # no event log: the refusal itself stays the error
            fd = -1
        _state["fd"] = fd
        _native().set_log_fd(fd)
        _state.update(active=True, report=report, adds=-1)
        rescan()
        _hook_loaders()
        _preload_driver()
        _guard_wrappers()
        report.importable = importable_compilers()
        if report.importable:
            firewall.log_event({"event": "inprocess_compiler_importable", "modules": list(report.importable),
                                "what": "importable in-process compilers strict mode does not refuse"})
        if initialized:
            firewall.log_event({"event": "ptx_jit_not_disabled", "what": report.ptx_jit})
        return report


def report() -> InprocessReport | None:
    return _state["report"] if _state["active"] else None


def refusals() -> int:
    """How many calls the C stubs refused in this process."""
    return int(_native().refusals())


def deactivate() -> None:
    """Undo everything activate() did (uninstall, tests): original code, loaders, wrappers, environment."""
    with _lock:
        if not _state["active"]:
            return
        native = _native()
        for address, (original, _, _) in reversed(list(_patches.items())):
            native.unpatch(address, original)
        _patches.clear()
        _seen.clear()
        _exports.clear()
        _pending_proc.clear()
        _slots.clear()  # trampolines stay mapped: a thread may still be running one
        while _restore:
            obj, name, value = _restore.pop()
            setattr(obj, name, value)
        _wrapped.clear()
        finder = _state.pop("finder", None)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not finder]
        native.set_log_fd(-1)
        native.set_device_query(0, 0, 0)
        _state.pop("device_query", None)
        if _state["fd"] >= 0:
            os.close(_state["fd"])
        env = _state["env"]
        if env is None:
            os.environ.pop("CUDA_DISABLE_PTX_JIT", None)
        else:
            os.environ["CUDA_DISABLE_PTX_JIT"] = env
        _state.update(active=False, report=None, adds=-1, fd=-1, env=None)
