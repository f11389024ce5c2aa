/*
 * The slice of the CUDA driver ABI the launcher uses, declared with our own names.
 *
 * Values and layouts are fixed by the driver ABI (cuda.h, CUDA 12 and 13 alike);
 * tests/csrc/test_launcher.py compiles these next to the real cuda.h and checks every size,
 * offset and constant, so a mistake here cannot ship.
 */
#ifndef NOJIT_CUDA_ABI_H
#define NOJIT_CUDA_ABI_H

typedef int NjResult;
typedef int NjDevice;
typedef struct NjCtx_st *NjContext;
typedef struct NjMod_st *NjModule;
typedef struct NjFunc_st *NjFunction;
typedef struct NjStream_st *NjStream;

#define NJ_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK 0
#define NJ_FUNC_ATTRIBUTE_NUM_REGS 4
#define NJ_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES 8
#define NJ_FUNC_CACHE_PREFER_SHARED 1

#define NJ_LAUNCH_ATTRIBUTE_COOPERATIVE 2
#define NJ_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION 4
#define NJ_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE 5
#define NJ_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION 6
#define NJ_CLUSTER_SCHEDULING_POLICY_SPREAD 1

typedef union NjLaunchAttributeValue {
  char pad[64];
  void *align_as_pointer; /* the driver's union holds pointers: 8-byte aligned */
  struct {
    unsigned int x;
    unsigned int y;
    unsigned int z;
  } clusterDim;
  int cooperative;
  int programmaticStreamSerializationAllowed;
  int clusterSchedulingPolicyPreference;
} NjLaunchAttributeValue;

typedef struct NjLaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  NjLaunchAttributeValue value;
} NjLaunchAttribute;

typedef struct NjLaunchConfig {
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;
  NjStream hStream;
  NjLaunchAttribute *attrs;
  unsigned int numAttrs;
} NjLaunchConfig;

#endif /* NOJIT_CUDA_ABI_H */
