"""NVRTC's builtins library, made unreadable to the strict process tree, so no process of it can compile CUDA C++.

The in-process guards patch NVRTC in processes that install nojit; a child that never does (`python -c` with a
ctypes-loaded libnvrtc, started with an environment of its own) escaped them, and Landlock's exec allow-list does not
see a library. libnvrtc itself cannot be taken away: torch's libtorch_cuda.so links it, so every worker's `import
torch` maps it. But NVRTC opens `libnvrtc-builtins.so.*` only when it compiles (nvrtcCompileProgram dlopens it; it
holds the built-in headers), and nothing in a strict serving process compiles. So Landlock handles reading files too,
and allows it everywhere except at the builtins: Landlock rules only allow, so "everything except X" is one rule per
entry of each folder above X other than the path down to X (a folder's rule covers its tree). What that costs: a
file or folder created after install directly in one of those folders (not below one of its entries) cannot be read
by the process tree. So a copy is left readable (and said so) when a folder above it is one where a serving process
creates things: the working folder, the home folder, the temporary folder.

Copies are looked for where NVRTC is installed: the Python environment's `nvidia/*/lib` wheel folders (and
torch/lib), the CUDA toolkit folders, the system library folders and LD_LIBRARY_PATH. A copy elsewhere (made before
install, or brought by the attacker) stays readable, as a compiler copied where nojit does not search stays runnable.
"""

from __future__ import annotations

import glob
import os
import site
import sys
import tempfile

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
    """The real paths of every NVRTC builtins library found where NVRTC is installed."""
    copies = {os.path.realpath(p) for d in _folders() for name in _NAMES for p in glob.glob(os.path.join(d, name))}
    return sorted(p for p in copies if os.path.isfile(p))


def _busy_folders() -> set[str]:
    """Folders where a serving process creates entries of its own: a copy below them is left readable."""
    busy = {os.getcwd(), os.path.expanduser("~"), tempfile.gettempdir()}
    return {os.path.realpath(b) for b in busy if b}


def _above(path: str) -> list[str]:
    out = []
    d = os.path.dirname(path)
    while True:
        out.append(d)
        if d == os.sep:
            return out
        d = os.path.dirname(d)


def read_rules(copies: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(paths that get a read rule, copies made unreadable, copies left readable with why)."""
    busy = _busy_folders()
    denied, kept = [], []
    for c in copies:
        near = [d for d in _above(c) if d in busy]
        if near:
            kept.append(f"{c} (below {near[0]}, where files are created while serving)")
        else:
            denied.append(c)
    if not denied:
        return [], [], kept
    ancestors = {d for c in denied for d in _above(c)}
    out_of_rules = ancestors | set(denied)
    rules = []
    for folder in sorted(ancestors):
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for e in entries:
            if e.path in out_of_rules or e.is_symlink():  # a link is read where it points, under that path's rules
                continue
            rules.append(e.path)
    return rules, denied, kept
