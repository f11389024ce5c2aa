"""DeepSeek-V4 (vLLM 0.33.0): everything the build knows that is specific to this model.

config.py        the layers' facts that decide keys (compress ratios, KV-cache groups, indexer KV block stride)
config_view.py   the slice of VllmConfig vLLM's warmup-key providers read
owners.py        Triton warmup owners of the model path (the runners' rows: aot/models/runner/)
derived.py       keys derived from the model's call sites
cutedsl_owners.py  vLLM's registered CuTeDSL owners (compressor head 512, indexer-q, dequant-gather-K)
humming_moe.py   the routed experts as Humming runs them (MXFP4 on sm_90)
mhc.py           the mHC numbers and the TileLang warmup registrations of the model
deployment_rules.py  what a deployment of this model must say (block size 256, mtp only, fp8_ds_mla)
deepseek-v4-flash.config.json   the built-in HF config (the default deployment's)
"""

from __future__ import annotations

from nojit.aot.faces import Model
from nojit.aot.models.deepseek_v4 import mhc
from nojit.aot.models.deepseek_v4.config import kv_cache_groups
from nojit.aot.models.deepseek_v4.config_view import make_vllm_config
from nojit.aot.models.deepseek_v4.cutedsl_owners import CUTEDSL
from nojit.aot.models.deepseek_v4.deployment_rules import check_deployment
from nojit.aot.models.deepseek_v4.derived import DSV4_DERIVED
from nojit.aot.models.deepseek_v4.owners import DSV4_OWNERS, REPORT_KERNELS
from nojit.aot.runtimes.deepgemm import DeepGemmTables
from nojit.aot.runtimes.deepgemm.shapes import deepgemm_shapes, fp8_gemm_nt_shapes
from nojit.aot.runtimes.flashinfer import FlashInferTables
from nojit.aot.runtimes.humming import HummingTables
from nojit.aot.models.deepseek_v4.humming_moe import routed_experts
from nojit.aot.models.runner.derived import runner_derived
from nojit.aot.models.runner.owners import runner_owners
from nojit.aot.runtimes.tilelang import TileLangTables
from nojit.aot.runtimes.triton import TritonTables

TRITON = TritonTables(  # the model's rows, then the runners' (aot/models/runner/) with this model's KV-cache groups
    owners=REPORT_KERNELS + DSV4_OWNERS + runner_owners(kv_cache_groups),
    derived=DSV4_DERIVED + runner_derived(kv_cache_groups),
    vllm_config=make_vllm_config,
)
TILELANG = TileLangTables(registrations=mhc.registrations)
# The block-FP8 linears: DeepGEMM's fp8_gemm_nt for M >= 32 and FlashInfer's fp8_blockscale_gemm_90 for M < 32
FLASHINFER = FlashInferTables(block_fp8_linears=lambda d: [(s.n, s.k) for s in fp8_gemm_nt_shapes(d)])

MODEL = Model(name="deepseek_v4", model_type="deepseek_v4",
              tables={"triton": TRITON, "tilelang": TILELANG, "cutedsl": CUTEDSL,
                      "deepgemm": DeepGemmTables(shapes=deepgemm_shapes), "flashinfer": FLASHINFER,
                      "humming": HummingTables(experts=routed_experts)},
              check_deployment=check_deployment)
