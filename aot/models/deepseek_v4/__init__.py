"""DeepSeek-V4 (vLLM 0.33.0): everything the build knows that is specific to this model.

config.py        the layers' facts that decide keys (compress ratios, indexer KV block stride)
config_view.py   the slice of VllmConfig vLLM's warmup-key providers read
owners.py        Triton warmup owners of the model path;  runner_owners.py  those of the model runners
derived.py       keys derived from the model's call sites; runner_derived.py  from the runners'
cutedsl_owners.py  vLLM's registered CuTeDSL owners (compressor head 512, indexer-q, dequant-gather-K)
humming_moe.py   the routed experts as Humming runs them (MXFP4 on sm_90)
mhc.py           the mHC numbers and the TileLang warmup registrations of the model
deepseek-v4-flash.config.json   the built-in HF config (the default deployment's)
"""

from __future__ import annotations

from nojit.aot.faces import Model
from nojit.aot.models.deepseek_v4 import mhc
from nojit.aot.models.deepseek_v4.config_view import make_vllm_config
from nojit.aot.models.deepseek_v4.cutedsl_owners import CUTEDSL
from nojit.aot.models.deepseek_v4.derived import DSV4_DERIVED
from nojit.aot.models.deepseek_v4.owners import DSV4_OWNERS, REPORT_KERNELS
from nojit.aot.models.deepseek_v4.runner_derived import RUNNER_DERIVED
from nojit.aot.models.deepseek_v4.runner_owners import RUNNER_OWNERS
from nojit.aot.runtimes.deepgemm import DeepGemmTables
from nojit.aot.runtimes.deepgemm.shapes import deepgemm_shapes, fp8_gemm_nt_shapes
from nojit.aot.runtimes.flashinfer import FlashInferTables
from nojit.aot.runtimes.humming import HummingTables
from nojit.aot.models.deepseek_v4.humming_moe import routed_experts
from nojit.aot.runtimes.tilelang import TileLangTables
from nojit.aot.runtimes.triton import TritonTables

TRITON = TritonTables(
    owners=REPORT_KERNELS + DSV4_OWNERS + RUNNER_OWNERS,
    derived=DSV4_DERIVED + RUNNER_DERIVED,
    vllm_config=make_vllm_config,
)
TILELANG = TileLangTables(registrations=mhc.registrations)
# The block-FP8 linears: DeepGEMM's fp8_gemm_nt for M >= 32 and FlashInfer's fp8_blockscale_gemm_90 for M < 32
FLASHINFER = FlashInferTables(block_fp8_linears=lambda d: [(s.n, s.k) for s in fp8_gemm_nt_shapes(d)])

MODEL = Model(name="deepseek_v4", model_type="deepseek_v4",
              tables={"triton": TRITON, "tilelang": TILELANG, "cutedsl": CUTEDSL,
                      "deepgemm": DeepGemmTables(shapes=deepgemm_shapes), "flashinfer": FLASHINFER,
                      "humming": HummingTables(experts=routed_experts)})
