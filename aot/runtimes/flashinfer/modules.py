"""The FlashInfer JIT modules vLLM 0.33.0 reaches for a deployment, one row per module.

Read from vLLM 0.33.0 and FlashInfer 0.7.2.post1 (paths under site-packages). Each row names the
FlashInfer function that makes the module's JitSpec (the same function vLLM's call site reaches, so
the module name, sources and flags are FlashInfer's own), what vLLM uses it for, the vLLM switch that
avoids it, and when the deployment reaches it. A module FlashInfer would build for a call the table
does not list is refused in strict mode, naming the module (loader/runtimes/flashinfer/serving.py).
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass

from nojit.aot.deployment import Deployment
from nojit.aot.errors import BuildError


@dataclass(frozen=True)
class FlashInferModule:
    gen: str        # "module:qualname" of FlashInfer's gen_*_module function
    name: str       # the module's name (FlashInfer's JitSpec.name: its AOT file is <name>/<name>.so)
    use: str
    call_site: str
    switch: str     # the vLLM environment variable that keeps the server off this module
    reached: Callable[[Deployment], bool]


def _hopper(d: Deployment) -> bool:
    return tuple(d.platform.capability) == (9, 0)


def _vllm_allreduce_sizes() -> dict[int, dict[int, float]]:
    """vLLM's FI_ALLREDUCE_FUSION_MAX_SIZE_MB (compilation/passes/fusion/allreduce_rms_fusion.py:104), read from
    the installed file: importing that module needs vLLM's CUDA ops, which a build box does not load."""
    spec = importlib.util.find_spec("vllm.compilation.passes.fusion.allreduce_rms_fusion")
    if spec is None or spec.origin is None:
        raise BuildError("vLLM has no allreduce_rms_fusion module", fix="install vLLM 0.33.0")
    with open(spec.origin) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == "FI_ALLREDUCE_FUSION_MAX_SIZE_MB" and node.value is not None:
            return ast.literal_eval(node.value)
    raise BuildError(f"{spec.origin} no longer defines FI_ALLREDUCE_FUSION_MAX_SIZE_MB",
                     fix="update aot/runtimes/flashinfer/modules.py for the installed vLLM")


def _flashinfer_allreduce(d: Deployment) -> bool:
    """FlashInferAllReduce is enabled for the TP group when vLLM's size table has the world size for this
    GPU (distributed/device_communicators/flashinfer_all_reduce.py:418-429)."""
    major, minor = d.platform.capability
    sizes = _vllm_allreduce_sizes().get(major * 10 + minor, {})
    return d.tensor_parallel_size > 1 and bool(sizes.get(d.tensor_parallel_size))


def _flashinfer_sampler(d: Deployment) -> bool:
    """v1/sample/ops/topk_topp_sampler.py:102-160: CUDA, a capability FlashInfer's backend takes (>= 7.5),
    more than 16 SMs; used on the first request with top-k/top-p (gpu/sample/sampler.py:89, 341)."""
    return tuple(d.platform.capability) >= (7, 5) and d.platform.sm_count > 16


MODULES: tuple[FlashInferModule, ...] = (
    FlashInferModule(
        gen="flashinfer.jit.gemm.fp8_blockscale:gen_fp8_blockscale_gemm_sm90_module",
        name="fp8_blockscale_gemm_90",
        use="block-FP8 linears with M < 32 (swapAB; TensorRT-LLM's DeepGEMM copy inside)",
        call_site="model_executor/kernels/linear/scaled_mm/flashinfer.py:229-313 -> flashinfer.gemm."
                  "fp8_blockscale_gemm_sm90 (gemm/gemm_base.py:11928-11937)",
        switch="VLLM_BLOCKSCALE_FP8_GEMM_FLASHINFER",
        reached=_hopper,  # has_flashinfer_fp8_blockscale_gemm: capability 9.0 (utils/flashinfer.py:1186-1192)
    ),
    FlashInferModule(
        gen="flashinfer.jit.comm:gen_trtllm_mnnvl_comm_module",
        name="trtllm_mnnvl_comm",
        use="TP allreduce, backend mnnvl (vLLM's first choice on one node)",
        call_site="distributed/device_communicators/flashinfer_all_reduce.py:142-177, 521-537 -> "
                  "flashinfer.comm.allreduce_fusion (comm/trtllm_mnnvl_ar.py:328-329)",
        switch="VLLM_ALLREDUCE_USE_FLASHINFER",
        reached=_flashinfer_allreduce,
    ),
    FlashInferModule(
        gen="flashinfer.jit.comm:gen_trtllm_comm_module",
        name="trtllm_comm",
        use="TP allreduce, backend trtllm (vLLM's fallback when the node has no NVLink multicast)",
        call_site="distributed/device_communicators/flashinfer_all_reduce.py:217-232 -> "
                  "flashinfer.comm.allreduce_fusion (comm/trtllm_ar.py:121-122)",
        switch="VLLM_ALLREDUCE_USE_FLASHINFER",
        reached=_flashinfer_allreduce,
    ),
    FlashInferModule(
        gen="flashinfer.jit.sampling:gen_sampling_module",
        name="sampling",
        use="top-k/top-p sampling (first request that uses them)",
        call_site="v1/sample/ops/topk_topp_sampler.py:631-670 -> flashinfer.sampling (sampling.py:175-176)",
        switch="VLLM_USE_FLASHINFER_SAMPLER",
        reached=_flashinfer_sampler,
    ),
)


def reached_modules(d: Deployment) -> list[FlashInferModule]:
    return [m for m in MODULES if m.reached(d)]
