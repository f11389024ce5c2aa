"""Inductor in the serving process: whether vLLM's compilation config would compile, and strict mode's refusal.

vLLM's default optimization level (O2) gives compilation mode VLLM_COMPILE with the Inductor backend
(config/vllm.py:1826-1831) for every architecture outside DEFAULT_BREAKABLE_CUDAGRAPH_ARCHITECTURES
(:76-108, DeepSeek-V4 among them, Qwen3.5 / Qwen3-Next not), which auto-enable breakable CUDA graphs and
set mode NONE (:842-870). Inductor then generates and compiles Triton kernels at the first dummy run,
before vLLM's JIT warmup registry runs; nojit does not bundle them (README, "Inductor"). The model runner
builds its `JitWarmupRegistry(vllm_config)` in its constructor (v1/worker/gpu_model_runner.py:478,
v1/worker/gpu/model_runner.py:214), after the config is final and before the model is loaded, so that
is where strict mode's preflight checks it and refuses the start with one message.
"""

from __future__ import annotations

from typing import Any

from nojit.loader.errors import PreflightError

SWITCH = "VLLM_USE_BREAKABLE_CUDAGRAPH=1"  # mode NONE + breakable CUDA graphs (what DeepSeek-V4 gets by default)
ALTERNATIVE = "--compilation-config '{\"mode\": 0}' (-cc.mode=none)"
COST = ("no torch.compile: vLLM's custom ops run as their CUDA/Triton implementations instead of Inductor's fused "
        "code, Inductor's fusion passes (norm + quant, activation + quant, allreduce fusions) are off, and CUDA graphs "
        "are breakable (eager segments between captured ones) instead of piecewise; the speed cost is not measured here")
FIX = (f"start vLLM with {SWITCH} (or {ALTERNATIVE}); or NOJIT_MODE=permissive to let Inductor compile in the "
       "process")
VLLM_COMPILE = 3  # CompilationMode.VLLM_COMPILE (config/compilation.py:37-50)
NONE = 0


def would_compile(vllm_config: Any) -> str | None:
    """What Inductor would compile under this VllmConfig (None: nothing)."""
    try:
        cc = vllm_config.compilation_config
        mode = int(getattr(cc, "mode", NONE) or NONE)
        backend = str(getattr(cc, "backend", "") or "inductor")
    except Exception:  # a config with no compilation config (a partial view in a test) says nothing about it
        return None
    if mode == NONE or backend == "eager":
        return None
    model = getattr(getattr(vllm_config, "model_config", None), "architectures", None) or ["the model"]
    return (f"vLLM's compilation mode {mode} ({'VLLM_COMPILE' if mode == VLLM_COMPILE else 'torch.compile'}) with "
            f"the {backend} backend compiles {', '.join(model)} with Inductor at startup (its generated Triton "
            "kernels are not in the bundle)")


def message(what: str) -> str:
    return (f"strict mode: {what}, so the start is refused before anything compiles. vLLM's switch: {SWITCH} "
            f"(or {ALTERNATIVE}). What it costs: {COST}.")


def check(vllm_config: Any) -> None:
    """Strict mode's preflight for Inductor: raise PreflightError naming the switch and its cost."""
    what = would_compile(vllm_config)
    if what is not None:
        raise PreflightError(message(what), fix=FIX)
