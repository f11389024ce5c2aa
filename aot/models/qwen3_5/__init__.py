"""Qwen3.5 (MoE and dense) and Qwen3-Next (vLLM 0.33.0): one set of rows for every model_type they use.

config.py          the text config (Qwen3.5 nests it), the GDN layer and cache facts that decide keys, KV-cache groups
config_view.py     the slice of VllmConfig the runners' warmup-key providers read
launches.py        vLLM's launch code run on the stand-in GPU, its Triton calls recorded
stand_in.py        a GDN layer and a runner as vLLM's launch code reads them (caches laid out as the runner does)
call_sites.py      the layers' launches per step kind and size, through vLLM's own wrappers
gdn_prefill.py     FlashInfer's CuTeDSL GDN prefill through vLLM's fi_chunk_gated_delta_rule, per chunk shape
fla_prefill.py     with --gdn-prefill-backend triton: FLA's autotuned chunk kernels through vLLM's forward_native
fla_host.py        FLA imported with its import-time GPU questions answered as on the H200 (its config lists)
prefill_inputs.py  the GDN prefill's chunk shapes and input tensors, shared by both backends' rows
moe.py             fused_moe_kernel per M with vLLM's own tile-config lookup (block-FP8 checkpoints)
linears.py         the block-FP8 linears' (N, K) for DeepGEMM and FlashInfer's block-FP8 GEMM
derived.py         the Triton rows
deployment_rules.py  what a deployment of these models must say
qwen3.5-35b-a3b-fp8.config.json   the built-in HF config (aot/data/qwen3.5-35b-a3b-fp8-h200.toml)
"""

from __future__ import annotations

from nojit.aot.faces import Model
from nojit.aot.models.qwen3_5.config import kv_cache_groups
from nojit.aot.models.qwen3_5.config_view import make_vllm_config
from nojit.aot.models.qwen3_5.deployment_rules import check_deployment
from nojit.aot.models.qwen3_5 import fla_prefill, gdn_prefill
from nojit.aot.models.qwen3_5.derived import QWEN_DERIVED
from nojit.aot.models.qwen3_5.linears import fp8_linears
from nojit.aot.models.runner.derived import runner_derived
from nojit.aot.models.runner.owners import runner_owners
from nojit.aot.runtimes.deepgemm import DeepGemmTables
from nojit.aot.runtimes.flashinfer import FlashInferTables
from nojit.aot.runtimes.flashinfer_cute import FiCuteSite, FlashInferCuteTables
from nojit.aot.runtimes.triton import TritonSite, TritonTables

TRITON = TritonTables(  # the model's rows, then the runners' (aot/models/runner/) with this model's KV-cache groups
    owners=runner_owners(kv_cache_groups),
    derived=QWEN_DERIVED + runner_derived(kv_cache_groups),
    vllm_config=make_vllm_config,
    # --gdn-prefill-backend triton: FLA's autotuned chunk kernels, run through vLLM's forward_native (tuning keys and
    # pruned configs from Triton's own Autotuner); nothing with FlashInfer's backend, the sm_90 default
    sites=(TritonSite(fla_prefill.KERNELS, fla_prefill.SITE, fla_prefill.run,
                      "autotuned (triton.autotune): vLLM's forward_native run on the stand-in GPU per chunk shape, "
                      "Triton's Autotuner intercepted", ("qwen", "qwen-gdn")),),
)

# The block-FP8 linears: DeepGEMM's fp8_gemm_nt for M >= 32 and FlashInfer's fp8_blockscale_gemm_90 for M < 32
DEEPGEMM = DeepGemmTables(shapes=lambda d: {"fp8_gemm_nt": fp8_linears(d)})
FLASHINFER = FlashInferTables(block_fp8_linears=lambda d: [(s.n, s.k) for s in fp8_linears(d)])
# FlashInfer's CuTeDSL GDN prefill (the sm_90 default), the keys its own cached_compile looks up per chunk shape
FLASHINFER_CUTE = FlashInferCuteTables(sites=(FiCuteSite(gdn_prefill.SITE, gdn_prefill.calls),))

# The model_types vLLM's qwen_triton_warmup serves (warmup/qwen_triton_warmup.py:20-30), top level or in text_config.
MODEL_TYPES = ("qwen3_5_moe", "qwen3_5_moe_text", "qwen3_5", "qwen3_5_text", "qwen3_next")
TABLES = {"triton": TRITON, "deepgemm": DEEPGEMM, "flashinfer": FLASHINFER, "flashinfer_cute": FLASHINFER_CUTE}
MODELS = tuple(Model(name="qwen3_5", model_type=t, tables=TABLES, check_deployment=check_deployment) for t in MODEL_TYPES)
