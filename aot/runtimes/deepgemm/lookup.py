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
from nojit.aot.runtimes.deepgemm.planner import kernel_id
from nojit.aot.runtimes.deepgemm.shapes import deepgemm_shapes, op_row
from nojit.loader.runtimes.deepgemm.cache import find_key, seed


def processes_between_markers(trace: str) -> list[str] | None:
    """Process starts between the markers; None when the trace lacks them (then nothing was shown)."""
    inside, started, seen = False, [], 0
    for line in trace.splitlines():
        if "/nojit-deepgemm-calls-begin" in line:
            inside, seen = True, seen + 1
        elif "/nojit-deepgemm-calls-end" in line:
            inside, seen = False, seen + 1
        elif inside and (any(f" {call}(" in line for call in ("execve", "fork", "vfork")) or (
                any(f" {call}(" in line for call in ("clone", "clone3")) and "CLONE_THREAD" not in line)):
            started.append(line.strip())  # a clone without CLONE_THREAD is a new process (popen, posix_spawn)
    return started if seen == 2 else None


def bundle_lookup_check(d: Deployment, bundle_path: str, work: str, ms: list[int] | None = None,
                        use_strace: bool = True) -> dict[str, Any]:
    """The serving path itself: `install(bundle, mode="strict")` (compiler firewall up, cache seeded from
    the bundle, probe answered in process), then DeepGEMM's real op for every shape at every M in `ms`
    (default 1..max_num_batched_tokens) under the fake device, optionally under strace. Passes when
    every call loads the entry the bundle maps it to from the seeded cache, nothing is refused, the
    probe was answered, DG_JIT_NVCC_COMPILER is the firewall's stand-in, and no process started
    between the worker's begin and end markers."""
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.runtimes.deepgemm.cache import section_of
    from nojit.loader.strict.firewall import is_stand_in

    bundle = Bundle.open(bundle_path)
    ids = [k for k, rec in bundle.manifest.kernels.items() if rec.runtime == "deepgemm"]
    section = section_of(bundle.manifest.kernels, bundle.entries, ids)
    os.makedirs(work, exist_ok=True)
    env = {**os.environ, **build_stand_ins(work, find_nvcc()), "NOJIT_DG_NUM_SMS": str(d.platform.sm_count),
           "NOJIT_DEEPGEMM_DIR": os.path.join(work, "seeded"), "NOJIT_MODE": "strict",
           "NOJIT_EVENT_LOG": os.path.join(work, "events.jsonl"), "NOJIT_QUIET": "1"}
    for name in ("DG_JIT_CACHE_DIR", "DG_JIT_NVCC_COMPILER", "NOJIT_FIREWALL_DIR"):
        env.pop(name, None)  # install() sets them; nothing of the enumeration's may leak in
    ms = ms or list(range(1, d.max_num_batched_tokens + 1))
    ops = [op_row(op, s, ms, d.platform.sm_count)
           for op, shapes in deepgemm_shapes(d).items() if kernel_id(op) in ids for s in shapes]
    spec_path, out_path = os.path.join(work, "lookup-spec.json"), os.path.join(work, "lookup.jsonl")
    with open(spec_path, "w") as f:
        json.dump({"ops": ops, "num_sms": d.platform.sm_count, "pdl": d.platform.pdl, "out": out_path,
                   "install": os.path.abspath(bundle_path)}, f)
    result = _run_worker(spec_path, env, work, use_strace)
    if "error" in result:
        return {"ok": False, **result}
    rows = _read_rows(out_path)
    with open(out_path + ".install.json") as f:
        installed = json.load(f)
    root = installed["cache_dir"]
    wrong = _wrong_rows(rows, section, root)
    started, firewall = result["started"], result["firewall"]
    stand_in = installed["DG_JIT_NVCC_COMPILER"]
    return {"ok": not wrong and not firewall["refused"] and firewall["answered"] >= 1 and started is not None
            and not started and is_stand_in(stand_in),
            "keys": len(rows), "entries": len({r["entry"] for r in rows}), "shapes": len(ops),
            "expected_keys": sum(len(row["ms"]) for row in ops), "ops": {r["op"] for r in rows}, "wrong": wrong[:5],
            "n_wrong": len(wrong), "probe_answered": firewall["answered"], "refused": firewall["refused"][:3],
            "processes_started": started, "traced": result["traced"], "seeded": root, "nvcc_compiler": stand_in}


def _run_worker(spec_path: str, env: dict[str, str], work: str, use_strace: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "nojit.aot.runtimes.deepgemm.enumerate_worker", spec_path]
    trace_path = os.path.join(work, "lookup.strace")
    strace = shutil.which("strace") if use_strace else None
    if strace:
        cmd = [strace, "-f", "-qq", "-e", "trace=execve,fork,vfork,clone,clone3,access", "-o", trace_path] + cmd
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-1500:]}
    with open(json.load(open(spec_path))["out"] + ".firewall.json") as f:
        firewall = json.load(f)
    started: list[str] | None = []
    if strace:
        with open(trace_path) as f:
            started = processes_between_markers(f.read())
    return {"firewall": firewall, "started": started, "traced": bool(strace)}


def _wrong_rows(rows: list[dict], section: dict[str, Any], root: str) -> list[dict]:
    """Calls that failed, loaded another entry than the bundle maps the key to, or loaded from outside the seed."""
    return [r for r in rows if r["error"] or r["entry"] != find_key(section, r["op"], r["n"], r["k"], r["m"], r["name"])
            or not (r["library"] or "").startswith(root + os.sep)]


def _read_rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f]


def lookup_check(d: Deployment, section: dict[str, Any], read_blob: Callable[[str], bytes], work: str,
                 ms: list[int] | None = None, use_strace: bool = True) -> dict[str, Any]:
    root = seed(section, read_blob, "lookup-check", base=os.path.join(work, "seeded"))
    stub = os.path.join(root, "bin", "nvcc")
    env = {**os.environ, **build_stand_ins(work, find_nvcc()), "NOJIT_DG_NUM_SMS": str(d.platform.sm_count),
           "DG_JIT_CACHE_DIR": root, "DG_JIT_NVCC_COMPILER": stub, "CUDA_HOME": root}
    ms = ms or list(range(1, d.max_num_batched_tokens + 1))
    ops = [op_row(op, s, ms, d.platform.sm_count) for op, shapes in deepgemm_shapes(d).items() for s in shapes]
    spec_path, out_path = os.path.join(work, "lookup-spec.json"), os.path.join(work, "lookup.jsonl")
    with open(spec_path, "w") as f:
        json.dump({"ops": ops, "num_sms": d.platform.sm_count, "pdl": d.platform.pdl, "out": out_path,
                   "firewall": {"nvcc": stub, "version_text": section["nvcc_version"]}}, f)
    result = _run_worker(spec_path, env, work, use_strace)
    if "error" in result:
        return {"ok": False, **result}
    rows = _read_rows(out_path)
    wrong = _wrong_rows(rows, section, root)
    started, firewall = result["started"], result["firewall"]
    return {"ok": not wrong and not firewall["refused"] and firewall["answered"] >= 1
            and started is not None and not started,
            "keys": len(rows), "wrong": wrong[:5], "n_wrong": len(wrong), "probe_answered": firewall["answered"],
            "refused": firewall["refused"][:3], "processes_started": started, "traced": result["traced"],
            "seeded": root}
