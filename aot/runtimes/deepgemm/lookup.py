"""Check on a GPU-less box that DeepGEMM's own lookup finds every bundled entry, with no process.

Seeds the cache exactly as the serving side does (loader.deepgemm_cache.seed), answers the nvcc
probe in process (loader.deepgemm_popen), and runs DeepGEMM's real op for every key under the
enumeration's device stand-ins, optionally under `strace -f -e trace=execve,fork,vfork`. It passes
when every key loads the entry the build recorded from the seeded directory, nothing is refused,
the probe was answered, and no process was started between the worker's begin and end markers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.runtimes.deepgemm.enumerate import build_stand_ins, find_nvcc
from nojit.aot.runtimes.deepgemm.shapes import fp8_gemm_nt_shapes
from nojit.loader.deepgemm_cache import find_key, seed


def processes_between_markers(trace: str) -> list[str] | None:
    """Process starts between the markers; None when the trace lacks them (then nothing was shown)."""
    inside, started, seen = False, [], 0
    for line in trace.splitlines():
        if "/nojit-deepgemm-calls-begin" in line:
            inside, seen = True, seen + 1
        elif "/nojit-deepgemm-calls-end" in line:
            inside, seen = False, seen + 1
        elif inside and any(f" {call}(" in line for call in ("execve", "fork", "vfork")):
            started.append(line.strip())
    return started if seen == 2 else None


def lookup_check(d: Deployment, section: dict[str, Any], read_blob: Callable[[str], bytes], work: str,
                 ms: list[int] | None = None, use_strace: bool = True) -> dict[str, Any]:
    root = seed(section, read_blob, "lookup-check", base=os.path.join(work, "seeded"))
    stub = os.path.join(root, "bin", "nvcc")
    env = {**os.environ, **build_stand_ins(work, find_nvcc()), "NOJIT_DG_NUM_SMS": str(d.platform.sm_count),
           "DG_JIT_CACHE_DIR": root, "DG_JIT_NVCC_COMPILER": stub, "CUDA_HOME": root}
    ms = ms or list(range(1, d.max_num_batched_tokens + 1))
    ops = [{"op": "fp8_gemm_nt", "name": s.name, "n": s.n, "k": s.k, "ms": ms} for s in fp8_gemm_nt_shapes(d)]
    spec_path, out_path = os.path.join(work, "lookup-spec.json"), os.path.join(work, "lookup.jsonl")
    with open(spec_path, "w") as f:
        json.dump({"ops": ops, "num_sms": d.platform.sm_count, "pdl": d.platform.pdl, "out": out_path,
                   "firewall": {"nvcc": stub, "version_text": section["nvcc_version"]}}, f)
    cmd = [sys.executable, "-m", "nojit.aot.runtimes.deepgemm.enumerate_worker", spec_path]
    trace_path = os.path.join(work, "lookup.strace")
    strace = shutil.which("strace") if use_strace else None
    if strace:
        cmd = [strace, "-f", "-qq", "-e", "trace=execve,fork,vfork,access", "-o", trace_path] + cmd
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"ok": False, "error": proc.stderr.strip()[-1500:]}
    with open(out_path) as f:
        rows = [json.loads(line) for line in f]
    with open(out_path + ".firewall.json") as f:
        firewall = json.load(f)
    wrong = [r for r in rows if r["error"] or r["entry"] != find_key(section, r["op"], r["n"], r["k"], r["m"])
             or not (r["library"] or "").startswith(root + os.sep)]
    started: list[str] | None = []
    if strace:
        with open(trace_path) as f:
            started = processes_between_markers(f.read())
    return {"ok": not wrong and not firewall["refused"] and firewall["answered"] >= 1
            and started is not None and not started,
            "keys": len(rows), "wrong": wrong[:5], "n_wrong": len(wrong), "probe_answered": firewall["answered"],
            "refused": firewall["refused"][:3], "processes_started": started, "traced": bool(strace),
            "seeded": root}
