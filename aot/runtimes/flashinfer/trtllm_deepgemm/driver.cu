// Build side only (never shipped, never run when serving): TensorRT-LLM DeepGEMM's own JIT, FlashInfer's copy
// included from the installed package, run on a box without a GPU for the block-FP8 GEMMs with M < 32 of a
// deployment. It makes the calls fp8_blockscale_gemm_90's gemm_dispatch makes for M < 32
// (csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/fp8_blockscale_gemm/fp8_blockscale_gemm_kernel.cuh:1361-1370):
// get_best_gemm_config(N, M, K, 1, SMs, false, true), then Compiler::build(N, K, block_m, block_n, 128, 1, stages,
// multicast, Normal, swapAB), which writes $TRTLLM_DG_CACHE_DIR/cache/<name>/nvcc_kernel.cubin with nvcc
// ($TRTLLM_DG_NVCC_COMPILER). The two device questions build() asks are answered by device.c (sm_90).
//
//   driver configs INCLUDE_DIR SM_COUNT N K       one line per M in 1..31: "M block_m block_n stages multicast"
//   driver build INCLUDE_DIR N K BLOCK_M BLOCK_N STAGES MULTICAST
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "tensorrt_llm/deep_gemm/compiler.cuh"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  deep_gemm::jit::Compiler::setIncludeDirs({argv[2]});
  if (!strcmp(argv[1], "configs") && argc == 6) {
    int sms = atoi(argv[3]);
    uint32_t n = atoi(argv[4]), k = atoi(argv[5]);
    for (uint32_t m = 1; m < 32; ++m) {
      auto [bm, bn, st, mc, smem] = deep_gemm::jit::get_best_gemm_config(n, m, k, 1, sms, false, true);
      printf("%u %d %d %d %d\n", m, bm, bn, st, mc);
    }
    return 0;
  }
  if (!strcmp(argv[1], "build") && argc == 9) {
    deep_gemm::jit::getGlobalCompiler().build(atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]), 128, 1,
                                              atoi(argv[7]), atoi(argv[8]), deep_gemm::GemmType::Normal, true);
    return 0;
  }
  return 2;
}
