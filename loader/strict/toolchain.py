"""The compiler toolchain's version answers, recorded once so strict mode can replay them.

Libraries ask compilers for their version before they do anything else (FlashInfer runs
`nvcc --version`, Triton `ptxas --version`, DeepGEMM checks nvcc >= 12.9, torch `ninja
--version`). The build records the exact text each tool prints for each probe (the
bundle's `producer.toolchain`); in strict mode the firewall's stand-ins print that text and
refuse everything else. The probe runs the real tools, so it is called at build time, or at
install time before the firewall is up for a bundle that has no record.
"""

from __future__ import annotations

import os
import shutil
import subprocess

# tool family -> the version probes it answers (the arguments, as one string)
PROBES: dict[str, tuple[str, ...]] = {
    "nvcc": ("--version",),
    "ptxas": ("--version",),
    "nvlink": ("--version",),
    "fatbinary": ("--version",),
    "cuobjdump": ("--version",),
    "nvdisasm": ("--version",),
    "cicc": ("--version",),
    "gcc": ("--version", "-dumpversion", "-dumpfullversion", "-v"),
    "g++": ("--version", "-dumpversion", "-dumpfullversion", "-v"),
    "clang": ("--version", "-dumpversion"),
    "clang++": ("--version", "-dumpversion"),
    "ld": ("--version", "-v", "-V"),
    "as": ("--version",),
    "ninja": ("--version",),
}

Toolchain = dict[str, dict[str, dict[str, str]]]  # tool family -> probe arguments -> {"stdout": ..., "stderr": ...}


def _cuda_bin(tool: str) -> str | None:
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root:
            for sub in ("bin", "nvvm/bin"):
                path = os.path.join(root, sub, tool)
                if os.access(path, os.X_OK):
                    return path
    return None


def find_tool(tool: str) -> str | None:
    """Where the real tool is: the CUDA toolkit of CUDA_HOME/CUDA_PATH first for NVIDIA tools, then PATH."""
    return _cuda_bin(tool) or shutil.which(tool)


def probe(tools: tuple[str, ...] = tuple(PROBES), timeout_s: float = 20.0) -> Toolchain:
    """Run every version probe of every tool that is installed; tools that are absent or fail are left out."""
    found: Toolchain = {}
    for tool in tools:
        path = find_tool(tool)
        if path is None:
            continue
        answers: dict[str, dict[str, str]] = {}
        for args in PROBES[tool]:
            try:
                done = subprocess.run([path, *args.split()], capture_output=True, text=True, timeout=timeout_s,
                                      stdin=subprocess.DEVNULL)
            except (OSError, subprocess.SubprocessError):
                continue
            if done.returncode == 0 and (done.stdout or done.stderr):
                answers[args] = {"stdout": done.stdout, "stderr": done.stderr}
        if answers:
            found[tool] = answers
    return found
