"""NVRTC's builtins library, made unreadable to the strict process tree, so no process of it can compile CUDA C++.

The in-process guards patch NVRTC in processes that install nojit; a child that never does (`python -c` with a
ctypes-loaded libnvrtc, started with an environment of its own) escaped them, and Landlock's exec allow-list does not
see a library. libnvrtc itself cannot be taken away: torch's libtorch_cuda.so links it, so every worker's `import
torch` maps it. But NVRTC opens `libnvrtc-builtins.so.*` only when it compiles (nvrtcCompileProgram dlopens it; it
holds the built-in headers), and nothing in a strict serving process compiles. So Landlock handles reading files too,
and allows it everywhere except at the builtins (unreadable.py: the rules, what they cost, and the copies left
readable below the working, home and temporary folders).

Copies are looked for where NVRTC is installed: the Python environment's `nvidia/*/lib` wheel folders (and
torch/lib), the CUDA toolkit folders, the system library folders and LD_LIBRARY_PATH. A copy elsewhere (made before
install, or brought by the attacker) stays readable, as a compiler copied where nojit does not search stays runnable.
"""

from __future__ import annotations

import glob
import os
import site
import sys

_NAMES = ("libnvrtc-builtins.so*", "libnvrtc-builtins.alt.so*")
_SYSTEM = ("/usr/local/cuda*/lib64", "/usr/local/cuda*/lib", "/usr/local/cuda*/targets/*/lib", "/usr/lib/x86_64-linux-gnu",
           "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib", "/opt/cuda*/lib64")


def _folders() -> list[str]:
    bases = [*sys.path, *site.getsitepackages(), site.getusersitepackages()]
    found = [d for b in bases if b for pattern in ("nvidia/*/lib", "nvidia/*/*/lib", "torch/lib")
             for d in glob.glob(os.path.join(b, pattern))]
    found += [d for pattern in _SYSTEM for d in glob.glob(pattern)]
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            found += [os.path.join(os.environ[var], "lib64"), os.path.join(os.environ[var], "lib")]
    found += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    return list(dict.fromkeys(os.path.realpath(d) for d in found if os.path.isdir(d)))


def find() -> list[str]:
    """The real paths of every NVRTC builtins library found where NVRTC is installed: each folder listed once for
    both names (_NAMES as glob patterns; /usr/lib/x86_64-linux-gnu alone holds thousands of entries)."""
    prefixes = tuple(name.rstrip("*") for name in _NAMES)
    copies = set()
    for d in _folders():
        try:
            with os.scandir(d) as entries:
                names = [e.name for e in entries if e.name.startswith(prefixes)]
        except OSError:
            continue
        copies.update(os.path.realpath(os.path.join(d, n)) for n in names)
    return sorted(p for p in copies if os.path.isfile(p))
