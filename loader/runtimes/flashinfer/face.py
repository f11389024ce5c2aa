"""FlashInfer's serving face: nojit as FlashInfer's `flashinfer_jit_cache` provider, TensorRT-LLM DeepGEMM's
cache seeded from the bundle."""

from __future__ import annotations

from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime, Switch

SWITCHES = (
    Switch("VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER=0", "fp8_blockscale_gemm_90 (block-FP8 GEMM, M < 32)",
           "DeepGEMM for small M too", "VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER", "0"),
    Switch("VLLM_ALLREDUCE_USE_FLASHINFER=0", "trtllm_comm / trtllm_mnnvl_comm (TP allreduce fusion)",
           "custom allreduce / NCCL", "VLLM_ALLREDUCE_USE_FLASHINFER", "0"),
    Switch("VLLM_USE_FLASHINFER_SAMPLER=0", "sampling (top-k / top-p)", "vLLM's Triton top-k/top-p",
           "VLLM_USE_FLASHINFER_SAMPLER", "0"),
)


def install(ctx: InstallContext) -> Handle:
    from nojit.loader.runtimes.flashinfer import serving

    state = serving.install(ctx.bundle, ctx.kernel_ids, ctx.policy)
    return Handle(state=state, undo=serving.uninstall if state is not None else (lambda: None))  # None: not installed


RUNTIME = Runtime(
    name="flashinfer",
    display="FlashInfer",
    install=install,
    jits=(ProcessJit("FlashInfer JIT", "flashinfer", "flashinfer",
                     "block-FP8 GEMM M < 32 (with TensorRT-LLM's DeepGEMM), TP allreduce fusion, sampling", SWITCHES),),
)
