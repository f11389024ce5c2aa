"""Enumerate DeepGEMM's compile keys for a deployment on a GPU-less box, with DeepGEMM's own code.

A worker process runs DeepGEMM's real op entry points (enumerate_worker.py) with three stand-ins
that only answer and record: fake_cudart (LD_PRELOAD: device properties of an sm_90 GPU with the
deployment's SM count; meta tensors pass its is_cuda checks), fake libcuda.so.1 (records TMA
descriptors, loads, launches; runs nothing) and nvcc_recorder.sh (answers `--version` with the real
nvcc's text, which is part of DeepGEMM's cache key, and writes a placeholder cubin). DeepGEMM
itself picks each configuration, writes each kernel.cu and names each cache entry
`<kernel>.<digest>`; nothing is re-derived here.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources

from nojit.aot.deployment import Deployment
from nojit.aot.runtimes.deepgemm.shapes import GemmShape, deepgemm_shapes, op_row
from nojit.aot.errors import BuildError


@dataclass(frozen=True)
class Enumeration:
    keys: list[dict]            # one per (op, shape, M): {"op", "name", "n", "k", "m", "entry"}
    cache_dir: str              # DeepGEMM's cache as the enumeration left it (kernel.cu + placeholder cubins)
    nvcc: str
    nvcc_version: str

    def entries(self) -> dict[str, list[dict]]:
        """entry name -> the keys that use it."""
        out: dict[str, list[dict]] = {}
        for key in self.keys:
            out.setdefault(key["entry"], []).append(key)
        return out

    def entry_inputs(self, name: str) -> tuple[str, list[str]]:
        """(kernel.cu as DeepGEMM generated it, DeepGEMM's nvcc flags) of one entry."""
        entry_dir = os.path.join(self.cache_dir, "cache", name)
        with open(os.path.join(entry_dir, "kernel.cu")) as f:
            source = f.read()
        return source, recorded_flags(entry_dir)


def recorded_flags(entry_dir: str) -> list[str]:
    """DeepGEMM's nvcc flags for an entry (from its meta.json), without the compiler, source and output."""
    with open(os.path.join(entry_dir, "meta.json")) as f:
        recorded = shlex.split(json.load(f)["command"])
    flags, skip = [], False
    for token in recorded[2:]:  # [0] = recording nvcc, [1] = DeepGEMM's temporary kernel.cu
        if skip:
            skip = False
        elif token in ("--output-file", "-o"):
            skip = True
        elif token != "--cubin":
            flags.append(token)
    return flags


def find_nvcc() -> str:
    home = os.environ.get("CUDA_HOME")
    for cand in (os.environ.get("NOJIT_NVCC"), home and os.path.join(home, "bin", "nvcc"),
                 "/usr/local/cuda/bin/nvcc", shutil.which("nvcc")):
        if cand and os.access(cand, os.X_OK):
            return cand
    raise BuildError("no nvcc found for DeepGEMM entries",
                     fix="install nvcc 13.x (e.g. the nvidia-cuda-nvcc wheel) or set NOJIT_NVCC; or build without "
                     "DeepGEMM (--runtime triton,tilelang)")


def _cuda_include(nvcc: str) -> str:
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "include")
    if not os.path.exists(os.path.join(inc, "cuda.h")):
        raise BuildError(f"no cuda.h next to {nvcc}", fix="point NOJIT_NVCC at a full CUDA toolkit's nvcc")
    return inc


def build_stand_ins(work: str, nvcc: str) -> dict[str, str]:
    """Compile the two C stand-ins and place the recording nvcc; returns the environment to run under."""
    src = resources.files("nojit.aot.runtimes.deepgemm").joinpath("fake_device")
    inc = _cuda_include(nvcc)
    os.makedirs(os.path.join(work, "lib"), exist_ok=True)
    os.makedirs(os.path.join(work, "cuda_home", "bin"), exist_ok=True)
    cudart = os.path.join(work, "lib", "libnojit_fake_cudart.so")
    libcuda = os.path.join(work, "lib", "libcuda.so.1")
    cc = os.environ.get("CC", "cc")
    for source, target, extra in (("fake_cudart.c", cudart, ["-ldl"]),
                                  ("fake_libcuda.c", libcuda, ["-Wl,-soname,libcuda.so.1"])):
        cmd = [cc, "-shared", "-fPIC", "-O1", f"-I{inc}", "-o", target, str(src.joinpath(source)), *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"cannot build the DeepGEMM stand-in {source}: {proc.stderr.strip()[:500]}",
                             fix="install a host C compiler (gcc) on the build box")
    recorder = os.path.join(work, "cuda_home", "bin", "nvcc")
    shutil.copy(str(src.joinpath("nvcc_recorder.sh")), recorder)
    os.chmod(recorder, 0o755)
    return {"LD_PRELOAD": cudart, "LD_LIBRARY_PATH": os.path.join(work, "lib"),
            "CUDA_HOME": os.path.join(work, "cuda_home"), "DG_JIT_NVCC_COMPILER": recorder,
            "NOJIT_DG_REAL_NVCC": nvcc, "NOJIT_DG_LOG": os.path.join(work, "driver.jsonl"),
            "DG_JIT_CACHE_DIR": os.path.join(work, "dg_cache")}


def enumerate_keys(d: Deployment, work: str, ms: list[int] | None = None, nvcc: str | None = None,
                   extra_keys: list[dict] | None = None,
                   shapes: dict[str, list[GemmShape]] | None = None) -> Enumeration:
    """Every shape of every op at every M in `ms` (default 1..max_num_batched_tokens), plus `extra_keys`
    ({"op", "n", "k", "m"}, e.g. recorded by NOJIT_MODE=record) for shapes or M outside that. `shapes`: the
    model's rows (its DeepGemmTables.shapes(d)); default DeepSeek-V4's."""
    ms = ms or list(range(1, d.max_num_batched_tokens + 1))
    shapes = deepgemm_shapes(d) if shapes is None else shapes
    ops = [op_row(op, s, ms, d.platform.sm_count) for op, rows in shapes.items() for s in rows]
    for extra in extra_keys or []:
        ops.append(recorded_op(extra))
    return enumerate_ops(ops, d.platform.sm_count, d.platform.pdl, work, nvcc)


# per op, the fields beyond {op, n, k, m} a recorded key carries into the worker's row (enumerate_worker.py)
RECORDED_FIELDS: dict[str, tuple[str, ...]] = {
    "fp8_gemm_nt": (), "fp8_einsum": (), "tf32_hc_prenorm_gemm": (), "fp8_fp4_mqa_logits": (),
    "fp8_fp4_paged_mqa_logits": ("next_n", "block_kv", "max_context_len", "num_slots"),
    "get_paged_mqa_logits_metadata": ("next_n", "block_kv", "num_slots")}


def recorded_op(key: dict) -> dict:
    """A key recorded by NOJIT_MODE=record ({"op", "n", "k", "m"}, loader/runtimes/deepgemm/serving.py call_key) as one
    op row of the worker's spec."""
    op = key.get("op")
    if op not in RECORDED_FIELDS:
        raise BuildError(f"recorded DeepGEMM key {key} is for an op nojit does not enumerate yet",
                         fix=f"only {', '.join(RECORDED_FIELDS)} keys can be added today")
    row = {"op": op, "name": "recorded", "n": int(key["n"]), "k": int(key["k"]), "ms": [int(key["m"])],
           "groups": int(key.get("groups", 1))}
    if op == "tf32_hc_prenorm_gemm":
        row["splits"] = [int(key["splits"])]
    row.update({field: int(key[field]) for field in RECORDED_FIELDS[op]})
    return row


def enumerate_ops(ops: list[dict], num_sms: int, pdl: bool, work: str, nvcc: str | None = None) -> Enumeration:
    """Run DeepGEMM's own ops for every row of `ops` ({"op", "name", "n", "k", "ms"}) on the fake device."""
    nvcc = nvcc or find_nvcc()
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    env = dict(os.environ, **build_stand_ins(work, nvcc), NOJIT_DG_NUM_SMS=str(num_sms))
    spec_path, out_path = os.path.join(work, "spec.json"), os.path.join(work, "keys.jsonl")
    with open(spec_path, "w") as f:
        json.dump({"ops": ops, "num_sms": num_sms, "pdl": pdl, "out": out_path}, f)
    proc = subprocess.run([sys.executable, "-m", "nojit.aot.runtimes.deepgemm.enumerate_worker", spec_path],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"DeepGEMM key enumeration failed: {proc.stderr.strip()[-1500:]}",
                         fix="see the error above; the stand-ins are in " + work)
    with open(out_path) as f:
        keys = [json.loads(line) for line in f]
    missing = [k for k in keys if not k["entry"]]
    if missing:
        raise BuildError(f"DeepGEMM launched no kernel for {missing[0]}", fix="report this shape")
    return Enumeration(keys, env["DG_JIT_CACHE_DIR"], nvcc, version)
