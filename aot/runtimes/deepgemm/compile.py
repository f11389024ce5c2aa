"""Compile DeepGEMM cache entries with DeepGEMM's own generated source and its own nvcc command line.

The command is the one DeepGEMM wrote into the entry's meta.json during enumeration (flags, arch,
include path of the installed DeepGEMM); only the compiler (the recording stand-in becomes the real
nvcc whose `--version` text is in the entry's key), the source path and the output path are swapped.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from nojit.aot.errors import BuildError


@dataclass(frozen=True)
class CompiledEntry:
    name: str           # DeepGEMM's cache directory name: <kernel>.<digest>
    source: str         # kernel.cu as DeepGEMM generated it
    cubin: bytes
    command: list[str]  # the nvcc command that produced the cubin (build-box paths)
    seconds: float


def nvcc_command(entry_dir: str, nvcc: str, output: str) -> list[str]:
    with open(os.path.join(entry_dir, "meta.json")) as f:
        recorded = shlex.split(json.load(f)["command"])
    flags, skip = [], False
    for token in recorded[2:]:  # [0] = recording nvcc, [1] = DeepGEMM's temporary kernel.cu
        if skip:
            skip = False
        elif token in ("--output-file", "-o"):
            skip = True
        else:
            flags.append(token)
    return [nvcc, os.path.join(entry_dir, "kernel.cu"), "--cubin", "--output-file", output] + \
        [t for t in flags if t != "--cubin"]


def compile_entry(cache_dir: str, name: str, nvcc: str, work: str) -> CompiledEntry:
    entry_dir = os.path.join(cache_dir, "cache", name)
    output = os.path.join(work, name + ".cubin")
    cmd = nvcc_command(entry_dir, nvcc, output)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    seconds = time.monotonic() - start
    if proc.returncode != 0 or not os.path.exists(output) or os.path.getsize(output) == 0:
        raise BuildError(f"nvcc failed for DeepGEMM entry {name}: {proc.stderr.strip()[-1500:]}",
                         fix="check the nvcc version and DeepGEMM's include path in " + entry_dir)
    with open(os.path.join(entry_dir, "kernel.cu")) as f:
        source = f.read()
    with open(output, "rb") as f:
        cubin = f.read()
    return CompiledEntry(name, source, cubin, cmd, seconds)


def compile_entries(cache_dir: str, names: list[str], nvcc: str, work: str, jobs: int = 1) -> list[CompiledEntry]:
    os.makedirs(work, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda n: compile_entry(cache_dir, n, nvcc, work), sorted(names)))
