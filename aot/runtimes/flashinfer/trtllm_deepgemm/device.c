/* Build side only: the answers Compiler::build's getSMVersion() gets (include/tensorrt_llm/common/cudaUtils.h:273):
   device 0, compute capability 9.0. Linked into the driver ahead of libcudart, so these two win. */
int cudaGetDevice(int* device) { *device = 0; return 0; }
int cudaDeviceGetAttribute(int* value, int attr, int device) {
  (void)device;
  *value = attr == 75 ? 9 : 0; /* cudaDevAttrComputeCapabilityMajor = 75, ...Minor = 76 (driver_types.h) */
  return 0;
}
