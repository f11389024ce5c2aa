"""`nojit doctor`: will this bundle serve on this machine? Answered before vLLM starts, without importing it.

An operator otherwise learns it from the startup lines of each vLLM process, or at the first
launch of a kernel in the middle of serving. Each check here reads what `install()` would read
(the bundle's index, package metadata, the driver library, the folders it seeds, the kernel's
Landlock ABI) and none of it imports vLLM, Triton, TileLang or the build, so it runs on a
serving image with none of them (it then says what is missing). Every finding carries its fix;
the exit code is 0 only when no finding is a failure.

GPU facts come from the driver library (`driver_floor.LIBCUDA`, the tests' seam): the doctor is
its own process, so unlike `install()` it may `cuInit` to read each device's capability.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import stat
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from nojit.loader.bundle import driver_floor
from nojit.loader.bundle.arch_fit import arch_problems
from nojit.loader.errors import NoJitError

OK, WARN, FAIL, SKIP = "ok", "warn", "fail", "skip"


@dataclass(frozen=True)
class Finding:
    area: str
    status: str  # ok | warn (serves, but read this) | fail (serving will not work) | skip (not checked here)
    what: str
    fix: str = ""


@dataclass(frozen=True)
class GpuFacts:
    """What the driver says. driver None: no NVIDIA driver library; devices empty: none visible."""

    driver: int | None
    release: str | None = None
    devices: tuple[tuple[str, tuple[int, int]], ...] = ()
    error: str = ""


def gpu_facts(library: str | None = None) -> GpuFacts:
    """Driver version and each visible device's name and compute capability, through the driver API."""
    lib_name = library or driver_floor.LIBCUDA
    try:
        lib = ctypes.CDLL(lib_name)
    except OSError as exc:
        return GpuFacts(None, error=f"{lib_name} cannot be loaded ({exc})")
    version = driver_floor.driver_cuda_version(lib_name)
    release = driver_floor.linux_driver_release()
    try:
        if lib.cuInit(0) != 0:
            return GpuFacts(version, release, (), "cuInit failed: no usable GPU (CUDA_VISIBLE_DEVICES empty?)")
        count = ctypes.c_int(0)
        lib.cuDeviceGetCount(ctypes.byref(count))
        devices = []
        for i in range(count.value):
            dev, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
            name = ctypes.create_string_buffer(256)
            lib.cuDeviceGet(ctypes.byref(dev), i)
            lib.cuDeviceGetName(name, 256, dev)
            lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
            lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)
            devices.append((name.value.decode(errors="replace"), (major.value, minor.value)))
    except AttributeError as exc:
        return GpuFacts(version, release, (), f"{lib_name} lacks a driver entry point ({exc})")
    return GpuFacts(version, release, tuple(devices))


# ------------------------------------------------------------------------------ checks
def _open_bundle(path: str | None) -> tuple[Any, str, list[Finding]]:
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.settings import settings

    try:
        if path or settings.bundle:
            bundle = Bundle.open(path or settings.bundle, expected_sha256=settings.bundle_sha256)
        else:
            from nojit.loader.bundle.installed import open_installed_bundle

            bundle = open_installed_bundle(settings.bundle_sha256)
            if bundle is None:
                return None, "", [Finding("bundle", FAIL, "no bundle given (no argument, NOJIT_BUNDLE unset, no "
                                          "bundle wheel installed)", "pass the bundle: nojit doctor BUNDLE")]
        bundle.index  # noqa: B018  (header and index read and checked)
    except NoJitError as exc:
        return None, path or "", [Finding("bundle", FAIL, exc.message, exc.fix)]
    ix = bundle.index
    runtimes = sorted({k.runtime for k in ix.kernels.values()})
    return bundle, bundle.path, [Finding("bundle", OK, f"{bundle.path}: {len(ix.kernels)} kernels, {ix.entry_count} "
                                         f"entries ({', '.join(runtimes)}), {ix.target.arch}, built with nojit "
                                         f"{ix.producer.nojit}")]


def check_gpu(index: Any, gpu: GpuFacts) -> list[Finding]:
    if gpu.driver is None:
        return [Finding("GPU", FAIL, f"no NVIDIA driver: {gpu.error}; GPU, architecture and driver not checked",
                        "run nojit doctor on the serving machine (an NVIDIA GPU with its driver installed)")]
    if not gpu.devices:
        return [Finding("GPU", FAIL, f"no GPU visible: {gpu.error or 'the driver lists no device'}",
                        "check CUDA_VISIBLE_DEVICES and nvidia-smi")]
    out = []
    for i, (name, cap) in enumerate(gpu.devices):
        problems = arch_problems(index, cap) if index is not None else []
        what = f"GPU {i}: {name}, compute capability {cap[0]}.{cap[1]}"
        if problems:
            out.append(Finding("architecture", FAIL, f"{what}: " + "; ".join(problems),
                               "build a bundle for this GPU (its deployment's platform), or serve on the GPU it was "
                               "built for"))
        else:
            out.append(Finding("architecture", OK, what + (f" = the bundle's {index.target.arch}" if index else "")))
    return out


def check_driver(index: Any, gpu: GpuFacts) -> list[Finding]:
    if gpu.driver is None:
        return [Finding("driver", SKIP, "no NVIDIA driver here: the bundle's driver floor is not checked")]
    have = driver_floor.cuda_text(gpu.driver) + (f" (driver {gpu.release})" if gpu.release else "")
    out = []
    for f in driver_floor.bundle_floors(index):
        if not f.cuda:
            out.append(Finding("driver", WARN, f"{f.runtime}: {f.tool}: its driver floor is unknown",
                               "rebuild the bundle with this nojit (it records the toolkit), or check by hand"))
        elif gpu.driver < f.cuda:
            out.append(Finding("driver", FAIL, f"{f.runtime}: cubins from {f.tool} need a driver of CUDA "
                               f"{driver_floor.cuda_text(f.cuda)} or newer (Linux >= {f.driver}); this driver supports "
                               f"CUDA {have}", f"upgrade the NVIDIA driver to >= {f.driver}, or rebuild the bundle with "
                               f"toolkits of CUDA {driver_floor.cuda_text(gpu.driver)} or older"))
        else:
            out.append(Finding("driver", OK, f"{f.runtime}: {f.tool} needs CUDA {driver_floor.cuda_text(f.cuda)} "
                               f"(Linux >= {f.driver}); this driver supports CUDA {have}"))
    return out


def _installed(dist: str) -> str | None:
    from nojit.loader.bundle.versions import installed_version

    return installed_version(dist)


def _major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


def check_libraries(index: Any, gpu: GpuFacts) -> list[Finding]:
    """The CUDA user-space libraries the serving process loads (pip wheels), against the driver and the bundle."""
    out = []
    runtime_version = _installed("nvidia-cuda-runtime") or _installed("nvidia-cuda-runtime-cu12")
    nvrtc = _installed("nvidia-cuda-nvrtc") or _installed("nvidia-cuda-nvrtc-cu12")
    torch_version = _installed("torch")
    out.append(Finding("CUDA libraries", OK if runtime_version else WARN,
                       f"CUDA runtime {runtime_version or 'wheel not found'}, NVRTC {nvrtc or 'wheel not found'}, "
                       f"torch {torch_version or 'not installed'}",
                       "" if runtime_version else "install the CUDA runtime wheel vLLM's torch depends on"))
    if runtime_version and gpu.driver is not None:
        major = int(runtime_version.split(".")[0])
        if gpu.driver < major * 1000:
            out.append(Finding("CUDA libraries", FAIL, f"the CUDA {runtime_version} runtime needs a CUDA {major}.x "
                               f"driver; this driver supports CUDA {driver_floor.cuda_text(gpu.driver)}",
                               f"upgrade the NVIDIA driver to >= {driver_floor.MINOR_COMPAT_DRIVER.get(major, '?')}"))
    humming = {k.info.get("nvrtc") for k in index.kernels.values() if k.runtime == "humming"} if index else set()
    for built in sorted(str(b) for b in humming if b):
        if nvrtc and built.partition("+")[2] != _major_minor(nvrtc):
            out.append(Finding("CUDA libraries", FAIL, f"Humming's kernels were built with {built}; this machine "
                               f"has NVRTC {nvrtc} (install refuses Humming's cache key otherwise)",
                               f"install nvidia-cuda-nvrtc {built.partition('+')[2]}.*, or rebuild the bundle here"))
    return out


# runtime -> (kernel-record info field, distribution it names) the serving process must have at that version
_RECORDED_PACKAGES: dict[str, tuple[tuple[str, str], ...]] = {
    "flashinfer": (("flashinfer_version", "flashinfer-python"),),
    "cutedsl": (("nvidia-cutlass-dsl", "nvidia-cutlass-dsl"), ("apache-tvm-ffi", "apache-tvm-ffi"),
                ("quack-kernels", "quack-kernels")),
    "humming": (("humming_version", "humming-kernels"),),
    "flashinfer_cute": (("nvidia-cutlass-dsl", "nvidia-cutlass-dsl"), ("apache-tvm-ffi", "apache-tvm-ffi"),
                        ("flashinfer-python", "flashinfer-python")),
}


def check_versions(index: Any) -> list[Finding]:
    from nojit.loader.bundle.versions import RuntimeVersions, version_differences

    out = []
    here = RuntimeVersions.of_this_process()
    diffs = version_differences(index, here)
    p = index.producer
    runtimes = {k.runtime for k in index.kernels.values()}
    for fact, built, have in (("vllm", p.vllm, here.vllm), ("triton", p.triton, here.triton),
                              ("tilelang", p.tilelang, here.tilelang)):
        if fact in diffs:
            out.append(Finding("versions", FAIL, diffs[fact], f"install {fact}=={built} (the bundle's), or rebuild "
                               f"the bundle here with `nojit build`" if built else "rebuild the bundle here"))
        elif built or have:
            note = " (need not be installed to serve)" if fact == "tilelang" and have is None else ""
            out.append(Finding("versions", OK, f"{fact}: bundle {built or '-'}, here {have or 'not installed'}{note}"))
    if "deepgemm" in runtimes:
        out.append(Finding("versions", OK if "vllm" not in diffs else FAIL,
                           f"DeepGEMM: vendored in vLLM {p.vllm} (its headers are checked at install)",
                           "" if "vllm" not in diffs else f"install vllm=={p.vllm}"))
    for rt, fields in _RECORDED_PACKAGES.items():
        if rt not in runtimes:
            continue
        for info_field, dist in fields:
            built = {str(k.info.get(info_field)) for k in index.kernels.values()
                     if k.runtime == rt and k.info.get(info_field)}
            have = _installed(dist)
            for b in sorted(built):
                if have != b:
                    out.append(Finding("versions", FAIL, f"{rt}: bundle built with {dist} {b}, here "
                                       f"{have or 'not installed'}", f"install {dist}=={b}, or rebuild the bundle here"))
                else:
                    out.append(Finding("versions", OK, f"{rt}: {dist} {b}"))
    return out


def folder_problem(path: str) -> str | None:
    """Why `path` (a folder nojit writes kernels into, or will create) is not private and writable; None if it is.
    Private: a real folder owned by this user that nobody else can write, in a parent nobody else can swap it in."""
    probe = path
    while not os.path.lexists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return "no existing parent folder"
        probe = parent
    info = os.lstat(probe)
    if stat.S_ISLNK(info.st_mode):
        return f"{probe} is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return f"{probe} is not a folder"
    if probe == path:
        if info.st_uid != os.getuid():
            return f"{path} belongs to uid {info.st_uid}, not this user ({os.getuid()})"
        if info.st_mode & 0o022:
            return f"{path} is writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    elif info.st_mode & 0o002 and not info.st_mode & stat.S_ISVTX:
        return f"{probe}, where it would be created, is writable by everyone without the sticky bit"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable by this user"
    return None


def _seed_folders(index: Any) -> list[tuple[str, str, str]]:
    """(runtime, folder, setting) for every runtime whose kernels install() writes to disk for its library: the
    serving modules' own defaults (one place for each), the digest folder below each made at install."""
    from nojit.loader.runtimes.deepgemm import cache as deepgemm_cache
    from nojit.loader.runtimes.flashinfer import serving as flashinfer_serving
    from nojit.loader.runtimes.humming import serving as humming_serving

    runtimes = {k.runtime for k in index.kernels.values()}
    seeded = (("deepgemm", deepgemm_cache.default_base, "NOJIT_DEEPGEMM_DIR"),
              ("flashinfer", flashinfer_serving.default_base, "NOJIT_FLASHINFER_DIR"),
              ("humming", humming_serving.default_base, "NOJIT_HUMMING_DIR"))
    return [(rt, base(), setting) for rt, base, setting in seeded if rt in runtimes]


def check_seed_folders(index: Any) -> list[Finding]:
    out = []
    try:
        folders = _seed_folders(index)
    except NoJitError as exc:  # the runtime folder itself is not private
        return [Finding("seed folders", FAIL, exc.message, exc.fix)]
    for rt, folder, setting in folders:
        problem = folder_problem(folder)
        if problem:
            out.append(Finding(f"seed: {rt}", FAIL, f"{folder}: {problem}",
                               f"remove it, or set {setting} to a folder of this user's with mode 0700"))
        else:
            out.append(Finding(f"seed: {rt}", OK, f"{folder}: private and writable"
                               + ("" if os.path.isdir(folder) else " (created at install)")))
    if not folders:
        out.append(Finding("seed folders", OK, "the bundle's runtimes are served from memory (nothing is seeded)"))
    return out


def check_firewall(index: Any) -> list[Finding]:
    """Strict mode's stand-ins live in this user's runtime folder and must be executable from there."""
    from nojit.loader.strict.firewall import runtime_dir

    try:
        base = runtime_dir()
        with tempfile.TemporaryDirectory(prefix="doctor-", dir=base) as d:
            script = os.path.join(d, "probe")
            with open(script, "w") as f:
                f.write("#!/bin/sh\necho nojit-doctor\n")
            os.chmod(script, 0o700)
            done = subprocess.run([script], capture_output=True, text=True, timeout=10)
        if done.stdout.strip() != "nojit-doctor":
            raise OSError(f"a stand-in in {base} did not run (exit {done.returncode}; noexec mount?)")
    except NoJitError as exc:
        return [Finding("firewall", FAIL, exc.message, exc.fix)]
    except (OSError, subprocess.SubprocessError) as exc:
        return [Finding("firewall", FAIL, f"the compiler firewall cannot be set up: {exc}",
                        "set XDG_RUNTIME_DIR to a private folder on a filesystem that allows executables")]
    if index is None:
        return [Finding("firewall", OK, f"stand-ins can be made and run in {base}")]
    recorded = bool(index.producer.toolchain)
    return [Finding("firewall", OK if recorded else WARN,
                    f"stand-ins can be made and run in {base}; "
                    + ("they answer version probes with the toolchain the bundle recorded" if recorded else
                       "the bundle recorded no toolchain: install probes the installed compilers first"),
                    "" if recorded else "rebuild the bundle with this nojit (it records the toolchain)")]


LANDLOCK_CREATE_RULESET = 444  # the syscall number on x86-64 and arm64 (the generic table)
LANDLOCK_CREATE_RULESET_VERSION = 1


def landlock_abi() -> int | None:
    """The kernel's Landlock ABI version (landlock_create_ruleset(NULL, 0, VERSION)); None: not available."""
    if platform.system() != "Linux":
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(ctypes.c_long(LANDLOCK_CREATE_RULESET), None, ctypes.c_size_t(0),
                       ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return int(abi) if abi > 0 else None


def check_landlock() -> list[Finding]:
    abi = landlock_abi()
    if abi is None:
        return [Finding("landlock", WARN, "Landlock is not available in this kernel (or is disabled)",
                        "use a kernel >= 5.13 with landlock in the lsm= boot list to confine the serving process")]
    return [Finding("landlock", OK, f"Landlock ABI {abi}")]


def check_jits(index: Any) -> list[Finding]:
    from nojit.loader.unserved import _reachable, _switched_off, jits

    served = {k.runtime for k in index.kernels.values()}
    out = []
    for jit in jits():
        if jit.runtime in served:
            out.append(Finding("JIT", OK, f"{jit.name}: served from the bundle"))
        elif not _reachable(jit):
            out.append(Finding("JIT", SKIP, f"{jit.name}: not installed here ({jit.module})"))
        elif jit.switches and all(_switched_off(s) for s in jit.switches) and not jit.unavoidable:
            out.append(Finding("JIT", OK, f"{jit.name}: not served, switched off ("
                               + ", ".join(s.setting for s in jit.switches) + ")"))
        else:
            avoid = [s.setting for s in jit.switches if not _switched_off(s)]
            out.append(Finding("JIT", FAIL, f"{jit.name} ({jit.used_for}): reachable, not served by the bundle; strict "
                               "mode refuses its first compile", f"build the bundle with --runtime {jit.runtime}"
                               + (f", or set {' '.join(avoid)}" if avoid and not jit.unavoidable else "")))
    return out


@dataclass
class Report:
    bundle: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(f.status == FAIL for f in self.findings) else 0

    def to_json(self) -> dict[str, Any]:
        return {"bundle": self.bundle, "serves": self.exit_code == 0, "exit_code": self.exit_code,
                "findings": [asdict(f) for f in self.findings]}

    def table(self) -> str:
        width = max((len(f.area) for f in self.findings), default=4)
        lines = [f"nojit doctor: {self.bundle or '(no bundle)'}"]
        for f in self.findings:
            lines.append(f"  {f.status.upper():4}  {f.area:<{width}}  {f.what}")
            if f.fix and f.status in (FAIL, WARN):
                lines.append(f"  {'':4}  {'':<{width}}  fix: {f.fix}")
        fails = sum(f.status == FAIL for f in self.findings)
        lines.append("serving will work here" if not fails else f"serving will NOT work here: {fails} failing check(s)")
        return "\n".join(lines)


def diagnose(bundle_path: str | None = None, gpu: GpuFacts | None = None) -> Report:
    """Every check, in the order an operator fixes them. `gpu` defaults to what the driver says."""
    bundle, path, findings = _open_bundle(bundle_path)
    gpu = gpu_facts() if gpu is None else gpu
    index = bundle.index if bundle is not None else None
    findings += check_gpu(index, gpu)
    if index is not None:
        findings += check_driver(index, gpu)
    findings += check_libraries(index, gpu)
    if index is not None:
        findings += check_versions(index) + check_seed_folders(index)
    findings += check_firewall(index) + check_landlock()
    if index is not None:
        findings += check_jits(index)
    return Report(path, findings)


def main(bundle: str | None, as_json: bool) -> int:
    report = diagnose(bundle)
    print(json.dumps(report.to_json(), indent=1) if as_json else report.table())
    return report.exit_code
