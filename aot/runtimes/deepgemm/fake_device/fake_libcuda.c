// Build side only: stand-in libcuda.so.1 that records what DeepGEMM asks of the driver (TMA
// descriptors, library loads, attributes, launches) as JSON lines; it runs nothing.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cuda.h>
static FILE* L(void){ static FILE* f; if(!f){ const char* p=getenv("NOJIT_DG_LOG"); f=p?fopen(p,"a"):stderr; setvbuf(f,0,_IONBF,0);} return f; }
CUresult cuGetErrorName(CUresult e,const char**s){*s="FAKE";return 0;}
CUresult cuGetErrorString(CUresult e,const char**s){*s="FAKE";return 0;}
CUresult cuInit(unsigned f){return 0;}
CUresult cuDriverGetVersion(int*v){*v=13000;return 0;}
CUresult cuGetProcAddress_v2(const char*s,void**p,int v,cuuint64_t f,CUdriverProcAddressQueryResult*r){*p=0;return 1;}
CUresult cuTensorMapEncodeTiled(CUtensorMap*m,CUtensorMapDataType dt,cuuint32_t rank,void*ga,const cuuint64_t*gd,const cuuint64_t*gs,const cuuint32_t*box,const cuuint32_t*es,CUtensorMapInterleave il,CUtensorMapSwizzle sw,CUtensorMapL2promotion l2,CUtensorMapFloatOOBfill oob){
  memset(m,0,sizeof *m); FILE*f=L(); fprintf(f,"{\"ev\":\"tma\",\"dtype\":%d,\"rank\":%u,\"addr\":%lu,\"dims\":[",dt,rank,(unsigned long)ga);
  for(unsigned i=0;i<rank;i++)fprintf(f,"%s%llu",i?",":"",(unsigned long long)gd[i]); fprintf(f,"],\"strides\":[");
  for(unsigned i=0;i+1<rank;i++)fprintf(f,"%s%llu",i?",":"",(unsigned long long)gs[i]); fprintf(f,"],\"box\":[");
  for(unsigned i=0;i<rank;i++)fprintf(f,"%s%u",i?",":"",box[i]); fprintf(f,"],\"estr\":[");
  for(unsigned i=0;i<rank;i++)fprintf(f,"%s%u",i?",":"",es[i]); fprintf(f,"],\"interleave\":%d,\"swizzle\":%d,\"l2\":%d,\"oob\":%d}\n",il,sw,l2,oob);
  return 0;}
static int lib_tag=1;
CUresult cuLibraryLoadFromFile(CUlibrary*lib,const char*fn,CUjit_option*a,void**b,unsigned n,CUlibraryOption*c,void**d,unsigned m){
  fprintf(L(),"{\"ev\":\"load\",\"path\":\"%s\"}\n",fn); *lib=(CUlibrary)(long)(lib_tag++); return 0;}
CUresult cuLibraryGetKernelCount(unsigned*c,CUlibrary l){*c=1;return 0;}
CUresult cuLibraryEnumerateKernels(CUkernel*k,unsigned n,CUlibrary l){for(unsigned i=0;i<n;i++)k[i]=(CUkernel)(long)(0x1000+(long)l);return 0;}
CUresult cuKernelGetFunction(CUfunction*f,CUkernel k){*f=(CUfunction)k;return 0;}
CUresult cuKernelGetName(const char**n,CUkernel k){*n="fake";return 0;}
CUresult cuLibraryUnload(CUlibrary l){return 0;}
CUresult cuFuncSetAttribute(CUfunction f,CUfunction_attribute a,int v){fprintf(L(),"{\"ev\":\"attr\",\"fn\":%ld,\"attr\":%d,\"value\":%d}\n",(long)f,a,v);return 0;}
CUresult cuLaunchKernelEx(const CUlaunchConfig*c,CUfunction f,void**p,void**x){
  FILE*o=L(); fprintf(o,"{\"ev\":\"launch\",\"fn\":%ld,\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"smem\":%u,\"attrs\":[",(long)f,c->gridDimX,c->gridDimY,c->gridDimZ,c->blockDimX,c->blockDimY,c->blockDimZ,c->sharedMemBytes);
  for(unsigned i=0;i<c->numAttrs;i++){CUlaunchAttribute*a=&c->attrs[i];fprintf(o,"%s{\"id\":%d,\"v\":[%u,%u,%u]}",i?",":"",a->id,a->value.clusterDim.x,a->value.clusterDim.y,a->value.clusterDim.z);}
  fprintf(o,"]}\n"); return 0;}
