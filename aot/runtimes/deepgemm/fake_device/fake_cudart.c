// Build side only: answers the CUDA runtime queries DeepGEMM makes (an sm_90 GPU with the deployment's SM
// count) and lets meta tensors pass its is_cuda checks, so its own heuristics and code generation run
// on a GPU-less box.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <cuda_runtime_api.h>
static FILE* logf_(void){ static FILE* f; if(!f){ const char* p=getenv("NOJIT_DG_LOG"); f=p?fopen(p,"a"):stderr; setvbuf(f,0,_IONBF,0);} return f; }
cudaError_t cudaGetDevice(int* d){ *d=0; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* p, int d){
  memset(p,0,sizeof *p); strcpy(p->name,"NVIDIA H200"); p->major=9; p->minor=0;
  p->multiProcessorCount=getenv("NOJIT_DG_NUM_SMS")?atoi(getenv("NOJIT_DG_NUM_SMS")):132;
  p->sharedMemPerBlockOptin=232448; p->sharedMemPerBlock=49152; p->sharedMemPerMultiprocessor=233472;
  p->l2CacheSize=62914560; p->totalGlobalMem=150754820096ULL; p->warpSize=32; p->maxThreadsPerBlock=1024;
  p->regsPerBlock=65536; p->regsPerMultiprocessor=65536; p->maxThreadsPerMultiProcessor=2048;
  return cudaSuccess; }
cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus* st){ *st=cudaStreamCaptureStatusNone; return cudaSuccess; }
cudaError_t cudaMemsetAsync(void* p,int v,size_t n,cudaStream_t s){ fprintf(logf_(),"{\"ev\":\"memset\",\"n\":%zu}\n",n); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void){ return cudaSuccess; }
int32_t aoti_torch_get_device_type(void* t, int32_t* out){
  static int32_t (*real)(void*,int32_t*); if(!real){ void* h=dlopen("libtorch_cpu.so",RTLD_NOLOAD|RTLD_LAZY); real=dlsym(h,"aoti_torch_get_device_type"); }
  int32_t r=real(t,out); static int32_t (*meta)(void); if(!meta){ void* h=dlopen("libtorch_cpu.so",RTLD_NOLOAD|RTLD_LAZY); meta=dlsym(h,"aoti_torch_device_type_meta"); } if(*out==meta()) *out=1; return r; }
int32_t aoti_torch_get_current_cuda_stream(int32_t idx, void** s){ *s=(void*)0; return 0; }
int32_t aoti_torch_get_current_device_index(int32_t* i){ *i=0; return 0; }
cudaError_t cudaFree(void* p){ return cudaSuccess; }
const char* cudaGetErrorString(cudaError_t e){ return "fake"; }
const char* cudaGetErrorName(cudaError_t e){ return "fake"; }
int cublasLtCreate(void** h){ *h=(void*)0x1; return 0; }
int cublasLtDestroy(void* h){ return 0; }
// DeepGEMM views parts of a meta tensor through from_blob (the paged KV cache's values and scales): make
// those views meta tensors too (no CUDA tensor can be made here). torch makes a meta tensor from a null
// pointer only (another pointer leaves the handle unset), so the view's address is 0 like every meta tensor's.
int32_t aoti_torch_create_tensor_from_blob_v2(void* data, int64_t ndim, const int64_t* sizes, const int64_t* strides,
    int64_t offset, int32_t dtype, int32_t device_type, int32_t device_index, void** ret, int32_t layout,
    const uint8_t* opaque, int64_t opaque_size){
  static int32_t (*real)(void*,int64_t,const int64_t*,const int64_t*,int64_t,int32_t,int32_t,int32_t,void**,int32_t,const uint8_t*,int64_t);
  static int32_t (*meta)(void); static int32_t (*cuda)(void);
  if(!real){ void* h=dlopen("libtorch_cpu.so",RTLD_NOLOAD|RTLD_LAZY); real=dlsym(h,"aoti_torch_create_tensor_from_blob_v2");
    meta=dlsym(h,"aoti_torch_device_type_meta"); cuda=dlsym(h,"aoti_torch_device_type_cuda"); }
  if(device_type==cuda()){ device_type=meta(); device_index=0; data=0; offset=0; }
  return real(data,ndim,sizes,strides,offset,dtype,device_type,device_index,ret,layout,opaque,opaque_size); }
