"""Every JIT of a vLLM serving process, which bundle runtime serves it, and what strict mode says about the rest.

Facts read from vLLM 0.33.0 and its dependencies for DeepSeek-V4 on sm_90 (details with file:line in
../shared/other-jits.md and the runtimes' modules). Each runtime's face (loader/runtimes/<runtime>/face.py)
holds its rows; the README's "Use with vLLM" table is written from them; change them there first. In strict mode nothing compiles: a JIT whose runtime the bundle does
not hold is refused at its first compile (the compiler firewall and the in-process guards), and the
registry preflight refuses the start when vLLM's warmup registry declares keys of it. `report()` says at
startup which reachable JITs the open bundle does not serve.
"""

from __future__ import annotations

import importlib.util
import os

from nojit.loader.faces import ProcessJit, Switch
from nojit.loader.runtimes import in_manifest_order


def jits() -> list[ProcessJit]:
    """Every JIT the registered runtimes serve, in the manifest's runtime order."""
    return [jit for runtime in in_manifest_order() for jit in runtime.jits]


IN_STRICT = ("refused: its first compile raises CompileForbiddenError (compiler firewall and in-process guards); "
             "a registry key of it fails the preflight")


# JITs no bundle runtime serves yet, reached by some models only (runtime ""): Qwen3.5 / Qwen3-Next on sm_90 with
# vLLM 0.33.0 (issue 24). Strict mode refuses Inductor at the runner's registry (loader/inductor.py). FlashInfer's
# CuTeDSL GDN prefill is served by the flashinfer_cute runtime (its face's row).
MODEL_ONLY_JITS = (
    ProcessJit("Inductor (torch.compile)", "torch._inductor", "",
               "vLLM's default compilation (mode VLLM_COMPILE) for every architecture outside its breakable-CUDA-graph "
               "list: Qwen3.5 / Qwen3-Next, not DeepSeek-V4",
               (Switch("VLLM_USE_BREAKABLE_CUDAGRAPH=1", "Inductor (mode NONE, breakable CUDA graphs)",
                       "no Inductor fusions; vLLM's custom ops run unfused; breakable instead of piecewise CUDA graphs",
                       "VLLM_USE_BREAKABLE_CUDAGRAPH", "1"),
                Switch("--compilation-config '{\"mode\": 0}'", "Inductor (mode NONE)", "as above")),
               "the Inductor-generated Triton kernels: vLLM's AOT compile artifact is made on the target GPU only"),
)


def _reachable(jit: ProcessJit) -> bool:
    try:
        return importlib.util.find_spec(jit.module) is not None
    except (ImportError, ValueError):
        return False


def _switched_off(switch: Switch) -> bool:
    return switch.env is not None and os.environ.get(switch.env) == switch.off_value


def unserved(served_runtimes: frozenset[str]) -> list[ProcessJit]:
    """The reachable JITs whose runtime has no entries in the bundle."""
    return [jit for jit in jits() if jit.runtime not in served_runtimes and _reachable(jit)]


def report(served_runtimes: frozenset[str]) -> list[str]:
    """One block: every reachable JIT served, or one line per reachable JIT the bundle does not serve."""
    missing = unserved(served_runtimes)
    if not missing:
        names = ", ".join(jit.name.split(" (")[0] for jit in jits() if jit.runtime in served_runtimes)
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
