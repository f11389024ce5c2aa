"""DeepGEMM in the build: the model's GEMM shapes into the plan, one cache entry's compile in a worker.

Planning runs DeepGEMM's own ops on the fake device (enumerate.py) for every shape at every M
from 1 to the deployment's max_num_batched_tokens (the indexer's decode ops: batch 1 to max_num_seqs,
shapes.py); each distinct cache entry DeepGEMM picks becomes
one request whose key is DeepGEMM's own entry name (`<kernel>.<digest>`, the key its cache lookup
uses) and whose compile inputs are its generated source, its flags and the calls it serves
(shape, N, K, M range). A key recorded at serve time (NOJIT_MODE=record: {"op", "n", "k", "m"})
is planned as it was recorded and resolved to its entry in the worker (one enumeration run).

Kernel ids are vLLM's entry points (`vllm.utils.deep_gemm:<op>`), the functions the loader wraps.
Compiled entries go through the build's compile cache (cache_inputs), so a rebuild starts no worker
and no nvcc for an entry it compiled before.
Their source digest is DeepGEMM's version plus its `include/deep_gemm` headers (loader/runtimes/deepgemm/cache.py
headers_digest): DeepGEMM hashes those headers into every entry name, so other headers find nothing.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nojit.aot.compile_cache import file_sha256, launch_reader
from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError
from nojit.aot.faces import CompileResult, Model, Runtime, Selection, WorkerSettings
from nojit.aot.plan import Plan, PlanKernel, PlanRequest
from nojit.aot.runtimes.deepgemm import compile as compile_module
from nojit.aot.runtimes.deepgemm.compile import compile_entry, deep_gemm_dir, portable_flags
from nojit.aot.runtimes.deepgemm.enumerate import enumerate_ops, find_nvcc, recorded_op
from nojit.aot.runtimes.deepgemm.shapes import GemmShape, op_row
from nojit.aot.target import TARGET
from nojit.loader.runtimes.deepgemm.cache import compress_keys, headers_digest
from nojit.loader.bundle.manifest import DeepGemmLaunch
from nojit.loader.bundle.versions import installed_version

NAME = "deepgemm"
GROUP = "deepgemm"  # the --groups name that selects DeepGEMM's entries
VLLM_MODULE = "vllm.utils.deep_gemm"
# the kernel each op launches on sm90 (DeepGEMM's jit_kernels/impls): a cross-check of the enumeration's
# attribution of launches to cache entries
SM90_KERNEL = {"fp8_gemm_nt": "sm90_fp8_gemm_1d2d", "fp8_einsum": "sm90_fp8_gemm_1d2d",
               "tf32_hc_prenorm_gemm": "sm90_tf32_hc_prenorm_gemm", "fp8_fp4_mqa_logits": "sm90_fp8_mqa_logits",
               "fp8_fp4_paged_mqa_logits": "sm90_fp8_paged_mqa_logits",
               "get_paged_mqa_logits_metadata": "sm90_paged_mqa_logits_metadata"}


@dataclass(frozen=True)
class DeepGemmTables:
    """A model's DeepGEMM rows: per vLLM entry point (op), the GEMM shapes a TP rank reaches."""

    shapes: Callable[[Deployment], dict[str, list[GemmShape]]]


def kernel_id(op: str) -> str:
    return f"{VLLM_MODULE}:{op}"


def _nvcc_version(nvcc: str) -> str:
    return subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout


def _kernel_info(op: str, d: Deployment, nvcc_version: str) -> dict[str, Any]:
    import vllm.envs as envs
    from vllm.third_party.deep_gemm import __version__ as dg_version

    return {"op": op, "deep_gemm_version": dg_version, "nvcc_version": nvcc_version, "sm_count": d.platform.sm_count,
            "pdl": d.platform.pdl, "use_ue8m0": bool(envs.VLLM_USE_DEEP_GEMM_E8M0)}


def plan(p: Plan, d: Deployment, model: Model, selection: Selection) -> None:
    tables: DeepGemmTables | None = model.tables.get(NAME)
    if tables is None or not d.platform.deep_gemm or not selection.in_groups((GROUP,)):
        return
    shapes = {op: rows for op, rows in tables.shapes(d).items() if selection.wants(kernel_id(op))}
    if not shapes:
        return
    ms = list(range(1, d.max_num_batched_tokens + 1))
    ops = [op_row(op, s, ms, d.platform.sm_count) for op, rows in shapes.items() for s in rows]
    work = tempfile.mkdtemp(prefix="nojit-deepgemm-plan-")
    try:
        en = enumerate_ops(ops, d.platform.sm_count, d.platform.pdl, work)
        package = deep_gemm_dir()
        source_hash = headers_digest(package)
        by_op: dict[str, dict[str, list[dict]]] = {}
        for key in en.keys:
            if key["entry"].partition(".")[0] != SM90_KERNEL.get(key["op"], key["entry"].partition(".")[0]):
                raise BuildError(f"DeepGEMM enumeration attributed {key['op']} N={key['n']} K={key['k']} M={key['m']} "
                                 f"to {key['entry']}, not a {SM90_KERNEL[key['op']]} kernel",
                                 fix="a nojit bug in the enumeration's driver log (enumerate_worker.py); report it")
            by_op.setdefault(key["op"], {}).setdefault(key["entry"], []).append(key)
        for op, entries in sorted(by_op.items()):
            p.add_kernel(kernel_id(op), PlanKernel(NAME, source_hash, [], _kernel_info(op, d, en.nvcc_version)))
            for name, keys in sorted(entries.items()):
                source, flags = en.entry_inputs(name)
                calls = [[r[1], r[2], r[3], r[4], r[5]] for r in compress_keys(keys)]
                p.add(PlanRequest(kernel_id(op), name, "exact", f"derived:deepgemm.{op}",
                                  compile_inputs={"source": source, "flags": portable_flags(flags, package),
                                                  "calls": calls}))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def prepare_worker(settings: WorkerSettings) -> None:
    pass  # nvcc and DeepGEMM's headers are found per compile; nothing is imported ahead


def _resolve_recorded(key: dict[str, Any], info: dict[str, Any], settings: WorkerSettings) -> dict[str, Any]:
    """A recorded call -> the entry DeepGEMM picks for it, by one enumeration run on the fake device."""
    work = tempfile.mkdtemp(prefix="nojit-deepgemm-recorded-", dir=settings.cache_dir if os.path.isdir(
        settings.cache_dir) else None)
    try:
        en = enumerate_ops([recorded_op(key)], info["sm_count"], info["pdl"], work)
        name = en.keys[0]["entry"]
        source, flags = en.entry_inputs(name)
        row = en.keys[0]
        return {"name": name, "source": source, "flags": portable_flags(flags, deep_gemm_dir()),
                "calls": [["recorded", row["n"], row["k"], row["m"], row["m"]]]}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compile_request(request: PlanRequest, kernel_id: str, kernel: PlanKernel, settings: WorkerSettings) -> CompileResult:
    nvcc = find_nvcc()
    version = _nvcc_version(nvcc)
    if version != kernel.info["nvcc_version"]:
        raise BuildError(f"{kernel_id}: planned with another nvcc ({kernel.info['nvcc_version'].strip()[-40:]!r}) "
                         f"than this worker's {nvcc} ({version.strip()[-40:]!r}); DeepGEMM's entry names hash that text",
                         fix="plan and compile with the same nvcc (NOJIT_NVCC)")
    inputs = dict(request.compile_inputs)
    if isinstance(request.key, str):
        inputs["name"] = request.key
    else:
        inputs = _resolve_recorded(request.key, kernel.info, settings)
    entry = compile_entry(inputs["name"], inputs["source"], inputs["flags"], nvcc, version, settings.cache_dir)
    launch = DeepGemmLaunch(entry=inputs["name"], source=inputs["source"],
                            calls=tuple(tuple(c) for c in inputs["calls"]))
    return CompileResult(entry.cubin, launch, kernel.source_hash, tools={"nvcc": _short(version)})


def _short(version_text: str) -> str:
    """"Cuda compilation tools, release 13.0, V13.0.88" -> "13.0.88" (the bundle's producer.nvcc)."""
    for part in version_text.replace(",", " ").split():
        if part.startswith("V") and part[1:2].isdigit():
            return part[1:]
    return version_text.strip().splitlines()[-1][:64] if version_text.strip() else "unknown"


def recorded_inputs(kernel: str, key: Any) -> dict[str, Any]:
    if not (isinstance(key, dict) and {"op", "n", "k", "m"} <= set(key)):
        raise BuildError(f"recorded DeepGEMM key {key!r} of {kernel} is not {{op, n, k, m}}",
                         fix="pass a file written by NOJIT_MODE=record")
    return {}  # resolved to DeepGEMM's entry in the compile worker (_resolve_recorded)


def cache_inputs(request: PlanRequest, kernel: PlanKernel) -> dict[str, Any]:
    """What one entry's cubin and launch depend on (aot/compile_cache.py): DeepGEMM's entry name (its own digest
    of source, flags and nvcc text), the generated source's digest and the flags as planned, the calls it serves
    (its launch), the headers digest and the facts DeepGEMM was run with (kernel info: DeepGEMM version, nvcc
    version text, SM count, PDL, UE8M0), the target, and nojit's compile code. A key recorded at serve time is
    resolved in the worker by DeepGEMM's own heuristics, so the extension that holds them is an input too."""
    inputs: dict[str, Any] = {
        "runtime": NAME,
        "kernel": request.kernel,
        "source_hash": kernel.source_hash,
        "info": kernel.info,
        "key": request.key,
        "target": TARGET.to_json(),
        "compiler": _compiler_code(),
        "vllm": installed_version("vllm"),  # its vendored include/cute and cutlass, which DeepGEMM's digest leaves out
    }
    if isinstance(request.key, str):
        c = request.compile_inputs
        inputs.update(source_sha256=hashlib.sha256(c["source"].encode()).hexdigest(), flags=c["flags"],
                      calls=c["calls"])
    else:
        inputs["extension"] = file_sha256(_extension_file())
    return inputs


@functools.cache
def _compiler_code() -> str:
    return ",".join(file_sha256(m.__file__) for m in (compile_module, sys.modules[__name__]))


def _extension_file() -> str:
    """DeepGEMM's compiled extension (its heuristics and code generator), found without importing it."""
    package = deep_gemm_dir()
    names = sorted(n for n in os.listdir(package) if n.startswith("_C_extension") and n.endswith(".so"))
    if len(names) != 1:
        raise BuildError(f"DeepGEMM at {package} has {len(names)} _C_extension libraries",
                         fix="install vLLM 0.33.0's vendored DeepGEMM unchanged")
    return os.path.join(package, names[0])


RUNTIME = Runtime(name=NAME, plan=plan, prepare_worker=prepare_worker, compile=compile_request,
                  recorded_inputs=recorded_inputs, cache_inputs=cache_inputs,
                  launch_from_json=launch_reader(DeepGemmLaunch))
