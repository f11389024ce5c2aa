"""Every JIT of a vLLM serving process, which bundle runtime serves it, and what strict mode says about the rest.

Facts read from vLLM 0.33.0 and its dependencies for DeepSeek-V4 on sm_90 (details with file:line in
../shared/other-jits.md and the runtimes' modules). The README's "Use with vLLM" table is written from
this table; change it here first. In strict mode nothing compiles: a JIT whose runtime the bundle does
not hold is refused at its first compile (the compiler firewall and the in-process guards), and the
registry preflight refuses the start when vLLM's warmup registry declares keys of it. `report()` says at
startup which reachable JITs the open bundle does not serve.
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
class ProcessJit:
    """One compiler the serving process can reach, and the bundle runtime that serves it."""

    name: str
    module: str  # importable module whose presence makes the JIT reachable
    runtime: str  # the bundle runtime (nojit.loader.bundle.manifest.RUNTIMES) whose entries serve it
    used_for: str  # what DeepSeek-V4 on sm_90 uses it for
    switches: tuple[Switch, ...] = ()
    unavoidable: str = ""  # what no switch removes (a bundle without this runtime cannot serve that part)


_FLASHINFER_SWITCHES = (
    Switch("VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER=0", "fp8_blockscale_gemm_90 (block-FP8 GEMM, M < 32)",
           "DeepGEMM for small M too", "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "0"),
    Switch("VLLM_ALLREDUCE_USE_FLASHINFER=0", "trtllm_comm / trtllm_mnnvl_comm (TP allreduce fusion)",
           "custom allreduce / NCCL", "VLLM_ALLREDUCE_USE_FLASHINFER", "0"),
    Switch("VLLM_USE_FLASHINFER_SAMPLER=0", "sampling (top-k / top-p)", "vLLM's Triton top-k/top-p",
           "VLLM_USE_FLASHINFER_SAMPLER", "0"),
)

JITS: tuple[ProcessJit, ...] = (
    ProcessJit("Triton (vLLM's kernels)", "triton", "triton",
               "attention metadata, compressor, indexer, sampling, spec decode"),
    ProcessJit("TileLang (mHC)", "tilelang", "tilelang", "mHC pre/post/fused/head kernels"),
    ProcessJit("DeepGEMM (vendored 2.8.1)", "vllm.third_party.deep_gemm", "deepgemm",
               "fp8_gemm_nt, fp8_einsum (o_proj), tf32_hc_prenorm_gemm (mHC), the indexer's MQA logits",
               unavoidable="fp8_einsum and the sparse-attention indexer have no non-DeepGEMM path on CUDA"),
    ProcessJit("CuTeDSL", "cutlass", "cutedsl",
               "head-512 compressor, indexer-q, dequant-gather-K, router GEMM ll_bf16"),
    ProcessJit("FlashInfer JIT", "flashinfer", "flashinfer",
               "block-FP8 GEMM M < 32 (with TensorRT-LLM's DeepGEMM), TP allreduce fusion, sampling",
               _FLASHINFER_SWITCHES),
    ProcessJit("Humming (NVRTC)", "humming", "humming", "MXFP4 MoE experts"),
)

IN_STRICT = ("refused: its first compile raises CompileForbiddenError (compiler firewall and in-process guards); "
             "a registry key of it fails the preflight")


def _reachable(jit: ProcessJit) -> bool:
    try:
        return importlib.util.find_spec(jit.module) is not None
    except (ImportError, ValueError):
        return False


def _switched_off(switch: Switch) -> bool:
    return switch.env is not None and os.environ.get(switch.env) == switch.off_value


def unserved(served_runtimes: frozenset[str]) -> list[ProcessJit]:
    """The reachable JITs whose runtime has no entries in the bundle."""
    return [jit for jit in JITS if jit.runtime not in served_runtimes and _reachable(jit)]


def report(served_runtimes: frozenset[str]) -> list[str]:
    """One block: every reachable JIT served, or one line per reachable JIT the bundle does not serve."""
    missing = unserved(served_runtimes)
    if not missing:
        names = ", ".join(jit.name.split(" (")[0] for jit in JITS if jit.runtime in served_runtimes)
        return [f"nojit: every JIT this process can reach is served by the bundle ({names})"]
    lines = ["nojit: JITs this process can reach that the bundle does not serve (strict mode: nothing compiles):"]
    for jit in missing:
        off = [s.setting for s in jit.switches if _switched_off(s)]
        on = [s.setting for s in jit.switches if s.env is not None and not _switched_off(s)]
        parts = [f"  - {jit.name} ({jit.used_for}): no {jit.runtime} entries in the bundle; {IN_STRICT}"]
        if off:
            parts.append(f"switched off here: {', '.join(off)}")
        if on:
            parts.append(f"avoid with {', '.join(on)}")
        if jit.unavoidable:
            parts.append(f"no switch: {jit.unavoidable}")
        parts.append(f"fix: build the bundle with --runtime {jit.runtime}")
        lines.append("; ".join(parts))
    return lines
