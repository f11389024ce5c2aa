/* A stand-in libcuda.so.1 for CPU tests: records what the launcher passes, launches nothing.
 * Each launch appends one line to $FAKE_CUDA_LOG:
 *   grid=x,y,z block=x,y,z smem=N stream=S nattrs=K attrs=id:v,... params=<hex of each param, by cubin size>
 * The "cubin" is text: "FAKE <symbol> <param sizes, comma-separated>", or an ELF image with $FAKE_CUDA_PARAM_SIZES set;
 * PTX text is "JIT-compiled" (counted, logged as "jit"), and so is a fatbin (or a fatbin wrapper) with no ELF entry for
 * the stand-in GPU's SM ($FAKE_CUDA_SM, default 90; a fatbin is otherwise taken whole, whatever it holds); anything
 * else fails. The SM is answered by cuDeviceGetAttribute after cuInit (before it, cuDeviceGetCount answers
 * CUDA_ERROR_NOT_INITIALIZED, as the driver does). The image loaders that take a path or
 * options and cuGetProcAddress_v2 are there for strict mode's tests (tests/loader/strict/test_inprocess_guard.py).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "nojit_cuda_abi.h"

typedef struct { char symbol[128]; int nsizes; int sizes[64]; } FakeModule;
static int current_ctx = 0;

static int initialized = 0;
NjResult cuInit(unsigned int f) { initialized = 1; return 0; }
static int fake_sm(void) { return getenv("FAKE_CUDA_SM") ? atoi(getenv("FAKE_CUDA_SM")) : 90; }
NjResult cuDeviceGetCount(int *n) {
  if (!initialized) return 3; /* CUDA_ERROR_NOT_INITIALIZED */
  *n = 1;
  return 0;
}
NjResult cuDeviceGetAttribute(int *v, int attr, NjDevice d) {
  if (!initialized) return 3;
  if (attr != 75 && attr != 76) return 1; /* COMPUTE_CAPABILITY_MAJOR, _MINOR; nothing else asked */
  *v = attr == 75 ? fake_sm() / 10 : fake_sm() % 10;
  return 0;
}
NjResult cuDriverGetVersion(int *v) { *v = 13000; return 0; }
NjResult cuGetErrorName(NjResult r, const char **s) { *s = r == 200 ? "CUDA_ERROR_INVALID_IMAGE" : "CUDA_ERROR_FAKE"; return 0; }
NjResult cuGetErrorString(NjResult r, const char **s) { *s = "fake driver error"; return 0; }
NjResult cuCtxGetCurrent(NjContext *c) { *c = current_ctx ? (NjContext)0x1 : NULL; return 0; }
NjResult cuCtxSetCurrent(NjContext c) { current_ctx = c != NULL; return 0; }
NjResult cuDeviceGet(NjDevice *d, int o) { *d = o; return 0; }
NjResult cuDevicePrimaryCtxRetain(NjContext *c, NjDevice d) { *c = (NjContext)0x1; return 0; }
/* PTX text (".version ..." or a "//" comment first) is "JIT-compiled" as a real driver would: counted by
 * fake_jit_compiles() and logged as "jit" to $FAKE_CUDA_LOG, the module taking any symbol. */
static int jit_compiles = 0;
int fake_jit_compiles(void) { return jit_compiles; }
/* Whether the driver would JIT-compile this fatbin: an entry other than ELF (kind 2), and no ELF entry for fake_sm(),
 * among the entries that lie within the size its header gives (header: u16 header size at 6, u64 body size at 8; entry: u16 kind, u32 header
 * size at 4, u64 payload size at 8, u32 SM at 28). */
static int fatbin_needs_jit(const unsigned char *p) {
  uint16_t header, kind;
  uint32_t size, sm;
  uint64_t body, payload;
  int others = 0;
  memcpy(&header, p + 6, 2);
  memcpy(&body, p + 8, 8);
  for (uint64_t off = header; off + 32 <= header + body;) {
    memcpy(&kind, p + off, 2);
    memcpy(&size, p + off + 4, 4);
    memcpy(&payload, p + off + 8, 8);
    memcpy(&sm, p + off + 28, 4);
    if (size < 32 || off + size + payload > header + body) break;
    if (kind == 2 && (int)sm == fake_sm()) return 0;
    others |= kind != 2;
    off += size + payload;
  }
  return others;
}
static NjResult load_image(NjModule *m, const void *image) {
  const char *s = (const char *)image;
  FakeModule *fm = calloc(1, sizeof(FakeModule));
  char sizes[512];
  const unsigned char *fatbin = memcmp(s, "\x50\xed\x55\xba", 4) == 0 ? (const unsigned char *)s
                                : memcmp(s, "\xb1\x43\x62\x46", 4) == 0 ? *(const unsigned char *const *)(s + 8)
                                                                          : NULL;
  if (strncmp(s, ".version", 8) == 0 || strncmp(s, "//", 2) == 0 || (fatbin != NULL && fatbin_needs_jit(fatbin))) {
    jit_compiles++;
    if (getenv("FAKE_CUDA_LOG")) {
      FILE *log = fopen(getenv("FAKE_CUDA_LOG"), "a");
      fprintf(log, "jit\n");
      fclose(log);
    }
    strcpy(fm->symbol, "*");
    *m = (NjModule)fm;
    return 0;
  }
  if (fatbin != NULL || (memcmp(s, "\x7f" "ELF", 4) == 0 && getenv("FAKE_CUDA_PARAM_SIZES"))) {
    /* a real cubin or fatbin: any symbol; parameter sizes come from the test */
    strcpy(fm->symbol, "*");
    snprintf(sizes, sizeof(sizes), "%s", getenv("FAKE_CUDA_PARAM_SIZES") ? getenv("FAKE_CUDA_PARAM_SIZES") : "8");
  } else if (strncmp(s, "FAKE ", 5) != 0 || sscanf(s + 5, "%127s %511s", fm->symbol, sizes) != 2) {
    free(fm);
    return 200;
  }
  for (char *tok = strtok(sizes, ","); tok && fm->nsizes < 64; tok = strtok(NULL, ",")) fm->sizes[fm->nsizes++] = atoi(tok);
  *m = (NjModule)fm;
  return 0;
}
NjResult cuModuleLoadData(NjModule *m, const void *image) { return load_image(m, image); }
NjResult cuModuleLoadDataEx(NjModule *m, const void *image, unsigned n, void *o, void **v) { return load_image(m, image); }
NjResult cuModuleLoadFatBinary(NjModule *m, const void *image) { return load_image(m, image); }
NjResult cuLibraryLoadData(NjModule *lib, const void *code, void *jo, void **jv, unsigned nj, int *lo, void **lv,
                           unsigned nl) {
  return load_image(lib, code);
}
static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *buf = calloc(1, 1 << 20);
  size_t n = fread(buf, 1, (1 << 20) - 1, f);
  fclose(f);
  if (n == 0) { free(buf); return NULL; }
  return buf;
}
NjResult cuModuleLoad(NjModule *m, const char *path) {
  char *image = slurp(path);
  if (!image) return 301; /* CUDA_ERROR_FILE_NOT_FOUND */
  NjResult r = load_image(m, image);
  free(image);
  return r;
}
NjResult cuLibraryLoadFromFile(NjModule *lib, const char *path, void *jo, void **jv, unsigned nj, int *lo, void **lv,
                               unsigned nl) {
  return cuModuleLoad(lib, path);
}
/* What cuGetProcAddress hands out for cuModuleLoadData: a function of its own, not the export (as a driver may). */
static int proc_calls = 0;
__attribute__((noinline, used)) static NjResult proc_load_data(NjModule *m, const void *image) {
  proc_calls++;
  if (getenv("FAKE_CUDA_LOG")) {
    FILE *log = fopen(getenv("FAKE_CUDA_LOG"), "a");
    fprintf(log, "procaddr load %d\n", proc_calls);
    fclose(log);
  }
  return load_image(m, image);
}
NjResult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
  static const struct { const char *name; void *fn; } table[] = {
      {"cuModuleLoadData", (void *)proc_load_data}, {"cuModuleLoadDataEx", (void *)cuModuleLoadDataEx},
      {"cuModuleLoadFatBinary", (void *)cuModuleLoadFatBinary}, {"cuLibraryLoadData", (void *)cuLibraryLoadData},
      {"cuModuleLoad", (void *)cuModuleLoad}, {"cuLibraryLoadFromFile", (void *)cuLibraryLoadFromFile},
      {"cuInit", (void *)cuInit}};
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(symbol, table[i].name) == 0) {
      *pfn = table[i].fn;
      if (status) *status = 0;
      return 0;
    }
  *pfn = NULL;
  if (status) *status = 1; /* CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND */
  return 500;                /* CUDA_ERROR_NOT_FOUND */
}
NjResult cuModuleUnload(NjModule m) { free(m); return 0; }
NjResult cuModuleGetFunction(NjFunction *f, NjModule m, const char *name) {
  if (strcmp(((FakeModule *)m)->symbol, "*") != 0 && strcmp(((FakeModule *)m)->symbol, name) != 0) return 500;
  *f = (NjFunction)m;
  return 0;
}
NjResult cuFuncGetAttribute(int *v, int attr, NjFunction f) { *v = attr == 0 ? 1024 : 32; return 0; }
NjResult cuFuncSetAttribute(NjFunction f, int attr, int v) {
  if (!getenv("FAKE_CUDA_LOG")) return 0;
  FILE *log = fopen(getenv("FAKE_CUDA_LOG"), "a");
  fprintf(log, "setattr %d=%d\n", attr, v);
  fclose(log);
  return 0;
}
NjResult cuFuncSetCacheConfig(NjFunction f, int c) { return 0; }
NjResult cuLaunchKernelEx(const NjLaunchConfig *cfg, NjFunction f, void **params, void **extra) {
  FakeModule *fm = (FakeModule *)f;
  if (!getenv("FAKE_CUDA_LOG")) return 0; /* no log: a no-op launch (host-cost benchmarks on the CPU box) */
  FILE *log = fopen(getenv("FAKE_CUDA_LOG"), "a");
  fprintf(log, "grid=%u,%u,%u block=%u,%u,%u smem=%u stream=%llu nattrs=%u attrs=", cfg->gridDimX, cfg->gridDimY,
          cfg->gridDimZ, cfg->blockDimX, cfg->blockDimY, cfg->blockDimZ, cfg->sharedMemBytes,
          (unsigned long long)(uintptr_t)cfg->hStream, cfg->numAttrs);
  for (unsigned i = 0; i < cfg->numAttrs; i++) {
    const NjLaunchAttribute *a = &cfg->attrs[i];
    if (a->id == NJ_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
      fprintf(log, "%d:%u.%u.%u,", a->id, a->value.clusterDim.x, a->value.clusterDim.y, a->value.clusterDim.z);
    else
      fprintf(log, "%d:%d,", a->id, a->value.cooperative);
  }
  fprintf(log, " params=");
  for (int i = 0; i < fm->nsizes; i++) {
    const unsigned char *p = (const unsigned char *)params[i];
    for (int b = fm->sizes[i] - 1; b >= 0; b--) fprintf(log, "%02x", p[b]);
    fprintf(log, i + 1 < fm->nsizes ? "," : "");
  }
  fprintf(log, "\n");
  fclose(log);
  return 0;
}
