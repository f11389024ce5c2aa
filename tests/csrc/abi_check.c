/* Compiled by tests/csrc/test_launcher.py against the real cuda.h: nojit's own ABI declarations must agree. */
#include <cuda.h>
#include <stddef.h>
#include "nojit_cuda_abi.h"

#define SAME(a, b) _Static_assert((a) == (b), #a " != " #b)
SAME(sizeof(NjLaunchAttribute), sizeof(CUlaunchAttribute));
SAME(offsetof(NjLaunchAttribute, value), offsetof(CUlaunchAttribute, value));
SAME(sizeof(NjLaunchAttributeValue), sizeof(CUlaunchAttributeValue));
SAME(sizeof(NjLaunchConfig), sizeof(CUlaunchConfig));
SAME(offsetof(NjLaunchConfig, sharedMemBytes), offsetof(CUlaunchConfig, sharedMemBytes));
SAME(offsetof(NjLaunchConfig, hStream), offsetof(CUlaunchConfig, hStream));
SAME(offsetof(NjLaunchConfig, attrs), offsetof(CUlaunchConfig, attrs));
SAME(offsetof(NjLaunchConfig, numAttrs), offsetof(CUlaunchConfig, numAttrs));
SAME(NJ_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK);
SAME(NJ_FUNC_ATTRIBUTE_NUM_REGS, CU_FUNC_ATTRIBUTE_NUM_REGS);
SAME(NJ_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES);
SAME(NJ_FUNC_CACHE_PREFER_SHARED, CU_FUNC_CACHE_PREFER_SHARED);
SAME(NJ_LAUNCH_ATTRIBUTE_COOPERATIVE, CU_LAUNCH_ATTRIBUTE_COOPERATIVE);
SAME(NJ_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION);
SAME(NJ_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE, CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE);
SAME(NJ_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
SAME(NJ_CLUSTER_SCHEDULING_POLICY_SPREAD, CU_CLUSTER_SCHEDULING_POLICY_SPREAD);
SAME(offsetof(NjLaunchAttributeValue, clusterDim), offsetof(CUlaunchAttributeValue, clusterDim));
SAME(sizeof(NjResult), sizeof(CUresult));
SAME(sizeof(NjStream), sizeof(CUstream));
int main(void) { return 0; }
