"""The JITs of a vLLM serving process that nojit does not serve yet: one table, one report.

Facts read from vLLM 0.33.0 and its dependencies for DeepSeek-V4 on sm_90 (file:line in
vLLM unless named). The README's "Use with vLLM" section is written from this table; change
it here first. In strict mode nothing of these may compile: the compiler firewall refuses the
first compile (the library's compile entry point in-process, or the compiler process it would
start), and the registry preflight refuses the start when vLLM's warmup registry declares keys
of one of them. `report()` says at startup which of them this process can reach.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Switch:
    """A vLLM setting that keeps the process away from the JIT, and what it costs."""

    setting: str  # environment variable assignment or CLI flag, exactly as the operator types it
    avoids: str
    cost: str
    env: str | None = None  # the variable read to tell whether it is set
    off_value: str | None = None  # the value that switches the JIT off


@dataclass(frozen=True)
class UnservedJit:
    name: str
    module: str  # importable module whose presence makes the JIT reachable
    used_for: str  # what DeepSeek-V4 on sm_90 uses it for, and when it compiles
    in_strict: str  # what strict mode does at its first compile
    switches: tuple[Switch, ...]
    unavoidable: str = ""  # what no switch removes (then strict mode cannot serve that part yet)


UNSERVED: tuple[UnservedJit, ...] = (
    UnservedJit(
        "DeepGEMM (vendored 2.8.1): the indexer's MQA logits",
        "vllm.third_party.deep_gemm",
        "fp8_gemm_nt, fp8_einsum (o_proj) and tf32_hc_prenorm_gemm (mhc) are served from the bundle through "
        "DeepGEMM's own cache lookup (loader/deepgemm_serving.py); not yet bundled: the indexer's "
        "fp8_fp4_mqa_logits / fp8_fp4_paged_mqa_logits and get_paged_mqa_logits_metadata (sparse_attn_indexer.py, "
        "indexer.py), which compile with nvcc (libc popen) in the profile run and capture",
        "refused: the nvcc probe is answered in process and every compile command refused (no process starts); "
        "the call raises KernelNotInBundleError",
        (),
        unavoidable="the sparse-attention indexer has no non-DeepGEMM path on CUDA; VLLM_DEEP_GEMM_WARMUP=skip only "
        "moves the compiles to the profile run and capture (issue 11: MQA logits not enumerated yet)",
    ),
)


def _reachable(jit: UnservedJit) -> bool:
    try:
        return importlib.util.find_spec(jit.module) is not None
    except (ImportError, ValueError):
        return False


def _switched_off(switch: Switch) -> bool:
    return switch.env is not None and os.environ.get(switch.env) == switch.off_value


def report() -> list[str]:
    """One block, one line per unserved JIT: reachable here or not, what strict mode does, the switches."""
    lines = ["nojit: JITs this process can reach that nojit does not serve yet (strict mode: nothing compiles):"]
    for jit in UNSERVED:
        if not _reachable(jit):
            lines.append(f"  - {jit.name}: not installed here, unreachable")
            continue
        off = [s.setting for s in jit.switches if _switched_off(s)]
        on = [s.setting for s in jit.switches if s.env is not None and not _switched_off(s)]
        parts = [f"  - {jit.name}: reachable; {jit.in_strict}"]
        if off:
            parts.append(f"switched off here: {', '.join(off)}")
        if on:
            parts.append(f"avoid with {', '.join(on)}")
        if jit.unavoidable:
            parts.append(f"no switch: {jit.unavoidable}")
        lines.append("; ".join(parts))
    return lines
