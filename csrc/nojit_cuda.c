/*
 * nojit C launcher. See nojit_cuda.h for the contract.
 *
 * The few driver types used here are declared locally with the layout the CUDA driver
 * ABI fixes (checked against the real cuda.h by tests/csrc/test_launcher.py), so building
 * needs no CUDA headers. Entry points are resolved with dlsym from libcuda.so.1.
 */
#define _GNU_SOURCE
#include "nojit_cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nojit_cuda_abi.h"
#include "nojit_half.h"
#include "nojit_launch_config.h"

typedef NjResult (*fn_cuInit)(unsigned int);
typedef NjResult (*fn_cuDriverGetVersion)(int *);
typedef NjResult (*fn_cuGetErrorName)(NjResult, const char **);
typedef NjResult (*fn_cuGetErrorString)(NjResult, const char **);
typedef NjResult (*fn_cuCtxGetCurrent)(NjContext *);
typedef NjResult (*fn_cuCtxSetCurrent)(NjContext);
typedef NjResult (*fn_cuDeviceGet)(NjDevice *, int);
typedef NjResult (*fn_cuDevicePrimaryCtxRetain)(NjContext *, NjDevice);
typedef NjResult (*fn_cuModuleLoadData)(NjModule *, const void *);
typedef NjResult (*fn_cuModuleUnload)(NjModule);
typedef NjResult (*fn_cuModuleGetFunction)(NjFunction *, NjModule, const char *);
typedef NjResult (*fn_cuFuncGetAttribute)(int *, int, NjFunction);
typedef NjResult (*fn_cuFuncSetAttribute)(NjFunction, int, int);
typedef NjResult (*fn_cuFuncSetCacheConfig)(NjFunction, int);
typedef NjResult (*fn_cuLaunchKernelEx)(const NjLaunchConfig *, NjFunction, void **, void **);

static struct {
  void *lib;
  int initialized;
  NjResult init_status;
  fn_cuInit cuInit;
  fn_cuDriverGetVersion cuDriverGetVersion;
  fn_cuGetErrorName cuGetErrorName;
  fn_cuGetErrorString cuGetErrorString;
  fn_cuCtxGetCurrent cuCtxGetCurrent;
  fn_cuCtxSetCurrent cuCtxSetCurrent;
  fn_cuDeviceGet cuDeviceGet;
  fn_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain;
  fn_cuModuleLoadData cuModuleLoadData;
  fn_cuModuleUnload cuModuleUnload;
  fn_cuModuleGetFunction cuModuleGetFunction;
  fn_cuFuncGetAttribute cuFuncGetAttribute;
  fn_cuFuncSetAttribute cuFuncSetAttribute;
  fn_cuFuncSetCacheConfig cuFuncSetCacheConfig;
  fn_cuLaunchKernelEx cuLaunchKernelEx;
} drv;

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0)
    return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static int driver_error(NjResult rc, const char *call, char *err, size_t errlen) {
  const char *name = "?";
  const char *text = "";
  if (drv.cuGetErrorName)
    drv.cuGetErrorName(rc, &name);
  if (drv.cuGetErrorString)
    drv.cuGetErrorString(rc, &text);
  set_err(err, errlen, "%s failed: %s (%d): %s", call, name ? name : "?", (int)rc, text ? text : "");
  return (int)rc;
}

#define RESOLVE(name)                                                                   \
  do {                                                                                  \
    drv.name = (fn_##name)dlsym(drv.lib, #name);                                        \
    if (!drv.name) {                                                                    \
      set_err(err, errlen, "libcuda.so.1 lacks %s (driver too old?)", #name);           \
      return NOJIT_ERR_NO_DRIVER;                                                       \
    }                                                                                   \
  } while (0)

static int init_locked(char *err, size_t errlen) {
  if (drv.initialized)
    return drv.init_status == 0 ? 0 : driver_error(drv.init_status, "cuInit", err, errlen);
  drv.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!drv.lib) {
    const char *why = dlerror();
    set_err(err, errlen, "cannot open libcuda.so.1 (no NVIDIA driver on this machine?): %s",
            why ? why : "unknown");
    return NOJIT_ERR_NO_DRIVER;
  }
  RESOLVE(cuInit);
  RESOLVE(cuDriverGetVersion);
  RESOLVE(cuGetErrorName);
  RESOLVE(cuGetErrorString);
  RESOLVE(cuCtxGetCurrent);
  RESOLVE(cuCtxSetCurrent);
  RESOLVE(cuDeviceGet);
  RESOLVE(cuDevicePrimaryCtxRetain);
  RESOLVE(cuModuleLoadData);
  RESOLVE(cuModuleUnload);
  RESOLVE(cuModuleGetFunction);
  RESOLVE(cuFuncGetAttribute);
  RESOLVE(cuFuncSetAttribute);
  RESOLVE(cuFuncSetCacheConfig);
  RESOLVE(cuLaunchKernelEx);
  drv.init_status = drv.cuInit(0);
  drv.initialized = 1;
  if (drv.init_status != 0)
    return driver_error(drv.init_status, "cuInit", err, errlen);
  return 0;
}

int nojit_init(char *err, size_t errlen) {
  if (drv.initialized && drv.init_status == 0)
    return 0;
  pthread_mutex_lock(&init_lock);
  int rc = init_locked(err, errlen);
  pthread_mutex_unlock(&init_lock);
  return rc;
}

int nojit_driver_version(int *version, char *err, size_t errlen) {
  int rc = nojit_init(err, errlen);
  if (rc)
    return rc;
  NjResult r = drv.cuDriverGetVersion(version);
  return r ? driver_error(r, "cuDriverGetVersion", err, errlen) : 0;
}

int nojit_ensure_context(int device, char *err, size_t errlen) {
  int rc = nojit_init(err, errlen);
  if (rc)
    return rc;
  NjContext ctx = NULL;
  NjResult r = drv.cuCtxGetCurrent(&ctx);
  if (r)
    return driver_error(r, "cuCtxGetCurrent", err, errlen);
  if (ctx)
    return 0;
  NjDevice dev;
  r = drv.cuDeviceGet(&dev, device);
  if (r)
    return driver_error(r, "cuDeviceGet", err, errlen);
  r = drv.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r)
    return driver_error(r, "cuDevicePrimaryCtxRetain", err, errlen);
  r = drv.cuCtxSetCurrent(ctx);
  return r ? driver_error(r, "cuCtxSetCurrent", err, errlen) : 0;
}

int nojit_load(const void *image, size_t image_size, const char *symbol, uint32_t dynamic_smem,
               uint64_t *module_out, uint64_t *function_out, int *num_regs_out,
               int *max_threads_out, char *err, size_t errlen) {
  int rc = nojit_init(err, errlen);
  if (rc)
    return rc;
  if (!image || image_size < 4 || !symbol) {
    set_err(err, errlen, "nojit_load: empty image or symbol");
    return NOJIT_ERR_BAD_ARGUMENT;
  }
  NjModule mod = NULL;
  NjResult r = drv.cuModuleLoadData(&mod, image);
  if (r)
    return driver_error(r, "cuModuleLoadData", err, errlen);
  NjFunction fn = NULL;
  r = drv.cuModuleGetFunction(&fn, mod, symbol);
  if (r) {
    rc = driver_error(r, "cuModuleGetFunction", err, errlen);
    drv.cuModuleUnload(mod);
    return rc;
  }
  if (dynamic_smem > 49152) {
    r = drv.cuFuncSetCacheConfig(fn, NJ_FUNC_CACHE_PREFER_SHARED);
    if (!r)
      r = drv.cuFuncSetAttribute(fn, NJ_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)dynamic_smem);
    if (r) {
      rc = driver_error(r, "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", err, errlen);
      drv.cuModuleUnload(mod);
      return rc;
    }
  }
  int regs = 0, max_threads = 0;
  drv.cuFuncGetAttribute(&regs, NJ_FUNC_ATTRIBUTE_NUM_REGS, fn);
  drv.cuFuncGetAttribute(&max_threads, NJ_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn);
  *module_out = (uint64_t)(uintptr_t)mod;
  *function_out = (uint64_t)(uintptr_t)fn;
  if (num_regs_out)
    *num_regs_out = regs;
  if (max_threads_out)
    *max_threads_out = max_threads;
  return 0;
}

int nojit_unload(uint64_t module, char *err, size_t errlen) {
  int rc = nojit_init(err, errlen);
  if (rc)
    return rc;
  NjResult r = drv.cuModuleUnload((NjModule)(uintptr_t)module);
  return r ? driver_error(r, "cuModuleUnload", err, errlen) : 0;
}

static int pack_args(const char *types, const uint64_t *values, int n, uint64_t *slots,
                     void **params, char *err, size_t errlen) {
  for (int i = 0; i < n; i++) {
    uint64_t v = values[i];
    double d;
    switch (types[i]) {
    case 'p':
    case 'l':
    case 'L':
      slots[i] = v;
      break;
    case 'i':
    case 'u': {
      uint32_t x = (uint32_t)v;
      memcpy(&slots[i], &x, 4);
      break;
    }
    case 'h':
    case 'H': {
      uint16_t x = (uint16_t)v;
      memcpy(&slots[i], &x, 2);
      break;
    }
    case 'c': {
      uint8_t x = (uint8_t)v;
      memcpy(&slots[i], &x, 1);
      break;
    }
    case 'f': {
      memcpy(&d, &v, 8);
      float f = (float)d;
      memcpy(&slots[i], &f, 4);
      break;
    }
    case 'd':
      slots[i] = v;
      break;
    case 'e': {
      memcpy(&d, &v, 8);
      uint16_t x = to_fp16(d);
      memcpy(&slots[i], &x, 2);
      break;
    }
    case 'b': {
      memcpy(&d, &v, 8);
      uint16_t x = to_bf16(d);
      memcpy(&slots[i], &x, 2);
      break;
    }
    default:
      set_err(err, errlen, "argument %d has unknown type code '%c'", i, types[i] ? types[i] : '0');
      return NOJIT_ERR_BAD_ARGUMENT;
    }
    params[i] = &slots[i];
  }
  return 0;
}

int nojit_launch(uint64_t function, uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                 uint32_t block_x, uint32_t block_y, uint32_t block_z, uint32_t shared_bytes,
                 uint64_t stream, const char *arg_types, const uint64_t *arg_values, int num_args,
                 uint32_t cluster_x, uint32_t cluster_y, uint32_t cluster_z, int pdl,
                 int cooperative, char *err, size_t errlen) {
  if (grid_x == 0 || grid_y == 0 || grid_z == 0)
    return 0;
  if (!drv.initialized || drv.init_status != 0) {
    int rc = nojit_init(err, errlen);
    if (rc)
      return rc;
  }
  if (num_args < 0 || (num_args > 0 && (!arg_types || !arg_values)) ||
      (arg_types && (int)strlen(arg_types) != num_args)) {
    set_err(err, errlen, "nojit_launch: %d arguments but type string '%s'", num_args,
            arg_types ? arg_types : "(null)");
    return NOJIT_ERR_BAD_ARGUMENT;
  }
  uint64_t fast_slots[NOJIT_MAX_FAST_ARGS];
  void *fast_params[NOJIT_MAX_FAST_ARGS];
  uint64_t *slots = fast_slots;
  void **params = fast_params;
  if (num_args > NOJIT_MAX_FAST_ARGS) {
    slots = (uint64_t *)calloc((size_t)num_args, sizeof(uint64_t));
    params = (void **)calloc((size_t)num_args, sizeof(void *));
    if (!slots || !params) {
      free(slots);
      free(params);
      set_err(err, errlen, "nojit_launch: out of host memory for %d arguments", num_args);
      return NOJIT_ERR_OUT_OF_MEMORY;
    }
  }
  int rc = pack_args(arg_types, arg_values, num_args, slots, params, err, errlen);
  /* A cluster that is empty or whose 32-bit product wraps must be refused, never launched without it. */
  uint64_t cluster_blocks = (uint64_t)cluster_x * cluster_y * cluster_z;
  if (!rc && (cluster_blocks == 0 || cluster_blocks > NOJIT_MAX_CLUSTER_BLOCKS)) {
    set_err(err, errlen, "nojit_launch: cluster (%u, %u, %u) is outside 1..%d blocks", cluster_x, cluster_y,
            cluster_z, NOJIT_MAX_CLUSTER_BLOCKS);
    rc = NOJIT_ERR_BAD_ARGUMENT;
  }
  if (!rc) {
    NjLaunchAttribute attrs[NJ_MAX_LAUNCH_ATTRS];
    NjLaunchConfig cfg;
    const uint32_t grid[3] = {grid_x, grid_y, grid_z}, block[3] = {block_x, block_y, block_z};
    const uint32_t cluster[3] = {cluster_x, cluster_y, cluster_z};
    nj_launch_config(&cfg, attrs, grid, block, shared_bytes, stream, cluster, pdl, cooperative);
    NjResult r = drv.cuLaunchKernelEx(&cfg, (NjFunction)(uintptr_t)function, params, NULL);
    if (r)
      rc = driver_error(r, "cuLaunchKernelEx", err, errlen);
  }
  if (slots != fast_slots) {
    free(slots);
    free(params);
  }
  return rc;
}

int nojit_launch_entry(uint64_t *address, char *err, size_t errlen) {
  int rc = nojit_init(err, errlen);
  if (rc)
    return rc;
  *address = (uint64_t)(uintptr_t)drv.cuLaunchKernelEx;
  return 0;
}
