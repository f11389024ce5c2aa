"""The oldest NVIDIA driver a bundle's cubins load on, and the check of this machine's driver against it.

A cubin built by a newer CUDA toolkit than the driver knows is refused at its first load
(`CUDA_ERROR_INVALID_IMAGE`, `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`), in the middle of serving.
The bundle records which toolkit each runtime compiled with (Triton's ptxas in
`producer.ptxas`, DeepGEMM's and TileLang's nvcc, FlashInfer's nvcc and Humming's NVRTC in
their kernel records), so the floor is derived from the bundle itself; old bundles need no
new field, and a runtime whose toolkit is not recorded is reported as such, never guessed.

The rule, from NVIDIA's CUDA Toolkit release notes ("CUDA Toolkit and Corresponding Driver
Versions", Linux x86_64) and the CUDA Compatibility guide ("Minor Version Compatibility",
docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html: CUDA 13.x needs a
driver >= 580, CUDA 12.x >= 525, CUDA 11.x >= 450): since CUDA 11, SASS built by any toolkit
of a major release runs on any driver of that major's minimum or newer ("limited feature
set": PTX newer than the driver is not JIT-compiled, which strict mode forbids anyway). So a
cubin's floor is its toolkit major's minimum driver; the toolkit's own driver (`TOOLKIT_DRIVER`)
is what every feature of that release needs, shown to the operator as the recommended one.

`cuDriverGetVersion` answers in CUDA versions (1000 * major + 10 * minor: 12080 is a driver of
CUDA 12.8), so the comparison is in that unit: a cubin of toolkit 13.0 needs a driver reporting
at least 13000. This module imports nothing of vLLM, Triton or the build, so the build
(`nojit inspect`) and a serving machine (`install()`, `nojit doctor`) read the same table.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nojit.loader.errors import BundleMismatchError
from nojit.loader.bundle.manifest import RUNTIMES
from nojit.loader.bundle.provenance import Provenance

# CUDA major -> the minimum Linux driver of minor version compatibility (the compatibility guide's table;
# the exact releases are the ones the release notes give for x.0 GA, 11.x: the note's 450.80.02)
MINOR_COMPAT_DRIVER: dict[int, str] = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}

# (major, minor) -> the Linux x86_64 driver released with that toolkit (its GA; the release notes' table)
TOOLKIT_DRIVER: dict[tuple[int, int], str] = {
    (12, 0): "525.60.13", (12, 1): "530.30.02", (12, 2): "535.54.03", (12, 3): "545.23.06",
    (12, 4): "550.54.14", (12, 5): "555.42.02", (12, 6): "560.28.03", (12, 8): "570.26",
    (12, 9): "575.51.03", (13, 0): "580.65.06", (13, 1): "590.44.01",
}


class DriverTooOldError(BundleMismatchError):
    """This machine's driver is older than what the bundle's cubins need (they would fail at first load)."""


def parse_toolkit(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a recorded toolkit version: "12.9.86", "V13.0.88 (cuda_13.0...)", "nvrtc+13.0",
    "Cuda compilation tools, release 13.0, V13.0.88". None when nothing in it reads as a CUDA version."""
    if not text:
        return None
    m = re.search(r"release (\d+)\.(\d+)", text) or re.search(r"(?<![\d.])(\d{2})\.(\d+)(?:\.\d+)?", text)
    if m is None or not 10 <= int(m.group(1)) <= 99:
        return None
    return int(m.group(1)), int(m.group(2))


def cuda_text(version: int) -> str:
    """12080 -> "12.8" (cuDriverGetVersion's unit)."""
    return f"{version // 1000}.{version % 1000 // 10}"


@dataclass(frozen=True)
class RuntimeFloor:
    """What one runtime's artifacts need of the driver, and where the bundle says so."""

    runtime: str
    tool: str  # e.g. "Triton's ptxas 12.9.86"
    toolkit: tuple[int, int] | None  # None: the bundle does not record it
    cuda: int  # the least cuDriverGetVersion that loads them (0: unknown)
    driver: str  # the least Linux driver release ("" when unknown)
    recommended: str  # the toolkit's own driver ("" when not in the table)

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "tool": self.tool,
                "toolkit": ".".join(map(str, self.toolkit)) if self.toolkit else None,
                "min_cuda_driver": cuda_text(self.cuda) if self.cuda else None,
                "min_linux_driver": self.driver or None, "recommended_linux_driver": self.recommended or None}


def floor_of(runtime: str, tool: str, recorded: str | None) -> RuntimeFloor:
    toolkit = parse_toolkit(recorded)
    if toolkit is None:
        return RuntimeFloor(runtime, f"{tool} (not recorded)", None, 0, "", "")
    major, _ = toolkit
    shown = re.search(r"V(\d+\.\d+\.\d+)", recorded or "") or re.search(r"(\d{2}\.\d+(?:\.\d+)?)", recorded or "")
    return RuntimeFloor(runtime, f"{tool} {shown.group(1) if shown else recorded}", toolkit, major * 1000, MINOR_COMPAT_DRIVER.get(major, ""),
                        TOOLKIT_DRIVER.get(toolkit, ""))


def bundle_floors(index: Any) -> list[RuntimeFloor]:
    """Per runtime the bundle holds, its driver floor (a Manifest or an Index; the newest toolkit its compiler's
    recorded versions name; which records hold them is the runtime's provenance)."""
    floors = []
    for rt in sorted({k.runtime for k in index.kernels.values()}):
        record = RUNTIMES.get(rt)
        provenance = record.provenance if record else Provenance(rt)
        seen = provenance.compiler_versions([k.info for k in index.kernels.values() if k.runtime == rt], index.producer)
        newest = max(seen, key=lambda s: parse_toolkit(s) or (0, 0), default=None)
        floors.append(floor_of(rt, provenance.compiler, newest))
    return floors


# ------------------------------------------------------------------------------ this machine's driver
LIBCUDA = "libcuda.so.1"  # the seam: tests point it at a stand-in library that reports another version


def driver_cuda_version(library: str | None = None) -> int | None:
    """cuDriverGetVersion of the driver library (needs no cuInit, so it is safe before vLLM forks);
    None when no NVIDIA driver is installed."""
    try:
        lib = ctypes.CDLL(library or LIBCUDA)
    except OSError:
        return None
    version = ctypes.c_int(0)
    try:
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except AttributeError:
        return None
    return version.value


def linux_driver_release() -> str | None:
    """The kernel module's release ("570.124.06"), for messages; None when not readable."""
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8", errors="replace") as f:
            m = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+\.\d+(?:\.\d+)?)", f.read())
    except OSError:
        return None
    return m.group(1) if m else None


def too_old(floors: list[RuntimeFloor], have: int) -> list[RuntimeFloor]:
    return [f for f in floors if f.cuda and have < f.cuda]


def check_driver(index: Any, path: str, strict: bool, warn: Callable[[str], None],
                 note: Callable[[str], None] | None = None) -> int | None:
    """Compare this machine's driver with the bundle's floors. Strict: raise DriverTooOldError; otherwise
    `warn` once per runtime. No driver here: one `note` line, nothing checked. Returns the driver's CUDA
    version (None: no driver)."""
    have = driver_cuda_version()
    if have is None:
        (note or warn)(f"nojit: no NVIDIA driver ({LIBCUDA} not loadable): the bundle's driver floor is not checked")
        return None
    short = too_old(bundle_floors(index), have)
    if not short:
        return have
    release = linux_driver_release()
    this = f"this machine's driver supports CUDA {cuda_text(have)}" + (f" (driver {release})" if release else "")
    lines = [f"{f.runtime}: cubins from {f.tool} need a driver of CUDA {cuda_text(f.cuda)} or newer "
             f"(Linux driver >= {f.driver or '?'}); {this}" for f in short]
    fix = (f"upgrade the NVIDIA driver to >= {max(f.driver for f in short)} (the toolkit's own driver "
           f"{max(f.recommended or f.driver for f in short)} for every feature), or rebuild the bundle with "
           f"toolkits of CUDA {cuda_text(have)} or older")
    if strict:
        raise DriverTooOldError(f"bundle {path} cannot load on this driver:\n    " + "\n    ".join(lines), fix=fix)
    for line in lines:
        warn(f"nojit: {line}: its kernels will fail at first load ({fix})")
    return have
