/*
 * nojit in-process compiler guard (nojit.loader._inproc): refusing stubs for the entry points of
 * NVRTC, nvJitLink and NVVM, and the x86-64 hot patch that routes a loaded library's exported function
 * to them.
 *
 * NVRTC and nvJitLink compile inside the calling process, with no process for the firewall to
 * refuse, and are called from C (torch links libnvrtc, cuda.bindings dlopens it) as well as from
 * Python. So strict mode (loader/strict/inprocess_guard.py) overwrites the first 14 bytes of each
 * exported compile entry of every loaded copy with `jmp [rip+0]; .quad stub`: whoever calls it,
 * through whatever pointer (dlsym, a GOT slot, a ctypes handle), lands here. A compiler's stub never
 * calls the original (nothing it refuses has a legitimate caller in the serving process). It returns
 * the library's own error code, writes one JSON line to the event log descriptor opened at install,
 * and counts the refusal. The driver's image loaders are the exception: their stubs check the image
 * and pass a cubin or a fatbin on to the original (below).
 *
 * `patch` keeps the original bytes; `unpatch` puts them back (uninstall, tests). The page is made
 * writable only for the copy (RWX where allowed, else RW, then R-X again).
 * Built against the limited API (abi3, 3.10), like nojit_fast.c.
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define _GNU_SOURCE
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fcntl.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PATCH_LEN 14

static atomic_int log_fd = -1;
static atomic_long refusals = 0;

/* One JSON line, the shape of firewall.log_event's ("event", "what", "symbol", "via", "pid", "time"). */
static void refuse(const char *symbol, const char *what) {
  atomic_fetch_add(&refusals, 1);
  int fd = atomic_load(&log_fd);
  if (fd < 0) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char line[640];
  int n = snprintf(line, sizeof line,
                   "{\"event\": \"compile_forbidden\", \"pid\": %d, \"symbol\": \"%s\", \"time\": %ld.%03ld, "
                   "\"via\": \"in-process\", \"what\": \"%s\"}\n",
                   (int)getpid(), symbol, (long)ts.tv_sec, ts.tv_nsec / 1000000L, what);
  if (n > 0) {
    ssize_t w = write(fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
    (void)w;
  }
}

/* nvrtcResult NVRTC_ERROR_COMPILATION (nvrtc.h); nvJitLinkResult values from nvJitLink.h. */
enum { NVRTC_ERROR_COMPILATION = 6, NVJITLINK_ERROR_INVALID_INPUT = 3, NVJITLINK_ERROR_PTX_COMPILE = 4,
       NVVM_ERROR_COMPILATION = 9 /* nvvm.h */, CUDA_ERROR_JIT_COMPILATION_DISABLED = 223 /* cuda.h */ };

static int stub_nvrtcCompileProgram(void *prog, int n, const char *const *options) {
  refuse("nvrtcCompileProgram", "NVRTC (nvrtcCompileProgram) was about to compile CUDA C++ in this process");
  return NVRTC_ERROR_COMPILATION;
}

static int stub_nvJitLinkAddData(void *handle, int type, const void *data, size_t size, const char *name) {
  refuse("nvJitLinkAddData", "nvJitLink (nvJitLinkAddData) was about to take input to compile or link in this process");
  return NVJITLINK_ERROR_INVALID_INPUT;
}

static int stub_nvJitLinkAddFile(void *handle, int type, const char *path) {
  refuse("nvJitLinkAddFile", "nvJitLink (nvJitLinkAddFile) was about to take input to compile or link in this process");
  return NVJITLINK_ERROR_INVALID_INPUT;
}

static int stub_nvJitLinkComplete(void *handle) {
  refuse("nvJitLinkComplete", "nvJitLink (nvJitLinkComplete) was about to compile or link in this process");
  return NVJITLINK_ERROR_PTX_COMPILE;
}

static int stub_nvvmCompileProgram(void *prog, int n, const char **options) {
  refuse("nvvmCompileProgram", "NVVM (nvvmCompileProgram) was about to compile NVVM IR in this process");
  return NVVM_ERROR_COMPILATION;
}

/* The driver's linker JIT-compiles PTX and links: nothing in the serving process links with the driver
 * (bundled cubins are loaded whole), so every input is refused, not only PTX. */
static int stub_cuLinkAddData(void *state, int type, void *data, size_t size, const char *name, unsigned n,
                              void *options, void **values) {
  refuse("cuLinkAddData", "the CUDA driver's linker (cuLinkAddData) was about to compile or link in this process");
  return CUDA_ERROR_JIT_COMPILATION_DISABLED;
}

static int stub_cuLinkAddFile(void *state, int type, const char *path, unsigned n, void *options, void **values) {
  refuse("cuLinkAddFile", "the CUDA driver's linker (cuLinkAddFile) was about to compile or link in this process");
  return CUDA_ERROR_JIT_COMPILATION_DISABLED;
}

/* ---- The driver's image loaders: a cubin (ELF) goes on to the driver, and a fatbin (or a fatbin wrapper pointing at
 * one) goes on when the driver has no PTX to JIT-compile in it: it holds an ELF (SASS) entry for every visible GPU's
 * SM, or no entry but ELF ones. Anything else (PTX text, NVVM IR, Tile IR, a fatbin whose PTX the driver would have
 * to compile, a malformed one) is refused. CUDA_DISABLE_PTX_JIT=1 stops neither: the H200 (driver 580) JIT-compiled
 * raw PTX given to cuModuleLoadData and a PTX-only fatbin with it set before cuInit. The loaders that take data call
 * the original through a trampoline (its first instructions moved by loader/strict/x86_relocate.py); those that take
 * a path read the file once, check those bytes and hand them to the data loader, so the file cannot change between
 * the check and the load. Each loader has SLOTS stubs, one per patched copy of the entry (another libcuda copy, or a
 * different function cuGetProcAddress hands out), each with its own original. */
#define SLOTS 4
#define CU_LIBRARY_BINARY_IS_PRESERVED 1
enum { CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2, CUDA_ERROR_FILE_NOT_FOUND = 301 };
typedef int (*load_data_t)(void **, const void *);
typedef int (*load_data_ex_t)(void **, const void *, unsigned, void *, void **);
typedef int (*library_load_data_t)(void **, const void *, void *, void **, unsigned, int *, void **, unsigned);
enum { K_LOAD_DATA, K_LOAD_DATA_EX, K_LOAD_FATBINARY, K_LIBRARY_LOAD_DATA, K_LOAD_FILE, K_LIBRARY_LOAD_FILE, K_COUNT };
static void *volatile target[K_COUNT][SLOTS]; /* the original (data loaders) or the data loader to hand bytes to */

/* The SM of each visible GPU, asked of the driver (cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute of the
 * patched libcuda, set by set_device_query) the first time a fatbin with PTX in it arrives, then kept (the devices
 * of a process do not change after cuInit). The driver's answer, not the bundle's target: it is the GPU whose SASS
 * the driver looks for, with or without a bundle. Before cuInit there is no answer and such a fatbin is refused (the
 * driver would refuse that load too, CUDA_ERROR_NOT_INITIALIZED). */
#define MAX_DEVICES 64
enum { CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76 };
typedef int (*device_count_t)(int *);
typedef int (*device_get_t)(int *, int);
typedef int (*device_attribute_t)(int *, int, int);
static void *volatile device_query[3];
static atomic_int sm_count = -1; /* -1: not read yet */
static int sm_list[MAX_DEVICES];

static int device_sms(void) {
  int n = atomic_load(&sm_count);
  if (n >= 0) return n;
  device_count_t count = (device_count_t)device_query[0];
  device_get_t get = (device_get_t)device_query[1];
  device_attribute_t attr = (device_attribute_t)device_query[2];
  if (count == NULL || get == NULL || attr == NULL || count(&n) != 0 || n <= 0 || n > MAX_DEVICES) return -1;
  for (int i = 0; i < n; i++) {
    int dev = 0, major = 0, minor = 0;
    if (get(&dev, i) != 0 || attr(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev) != 0 ||
        attr(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev) != 0)
      return -1;
    sm_list[i] = major * 10 + minor;
  }
  atomic_store(&sm_count, n);
  return n;
}

/* The fatbin container (fatbinary's output; the CUDA toolkit ships no header for it, the layout is the one read from
 * real fatbins in tests/loader/strict/test_fatbin_guard.py): a 16-byte header (magic 0xBA55ED50, u16 version, u16 header size, u64
 * size of what follows the header), then entries, each a header (u16 kind: 1 PTX, 2 ELF; u32 header size at 4; u64
 * payload size at 8; u32 SM at 28; compression is a flag, the header is never compressed) and its payload. */
#define FATBIN_MAGIC 0xBA55ED50u
#define FATBINC_MAGIC 0x466243B1u /* __fatBinC_Wrapper_t (fatbinary_section.h): magic, version, data, filename */
enum { FATBIN_KIND_ELF = 2, FATBIN_ENTRY_MIN = 32 };

static uint32_t u32_at(const unsigned char *p) { uint32_t v; memcpy(&v, p, sizeof v); return v; }
static uint64_t u64_at(const unsigned char *p) { uint64_t v; memcpy(&v, p, sizeof v); return v; }

static _Thread_local char reason_buf[160]; /* a refusal's reason with a number in it */

/* NULL if the driver gets no PTX to compile from this fatbin, else why it is refused. `avail` is how many bytes
 * there are (a file, a Python bytes); 0 when only a pointer is known: then the header's own size is what there is. */
static const char *fatbin_refusal(const unsigned char *p, size_t avail) {
  if (avail != 0 && avail < 16) return "a truncated fatbin";
  uint16_t header;
  memcpy(&header, p + 6, sizeof header);
  uint64_t body = u64_at(p + 8);
  if (header < 16 || body > ((uint64_t)1 << 40)) return "a malformed fatbin (its header's sizes)";
  uint64_t total = header + body;
  if (avail != 0 && total > avail) return "a truncated fatbin (shorter than its header says)";
  int others = 0;
  for (uint64_t off = header; off < total;) { /* every entry within the fatbin, and is there any but ELF */
    if (total - off < FATBIN_ENTRY_MIN) return "a malformed fatbin (an entry past its end)";
    uint16_t kind;
    memcpy(&kind, p + off, sizeof kind);
    uint64_t size = u32_at(p + off + 4), payload = u64_at(p + off + 8);
    if (size < FATBIN_ENTRY_MIN || size > total - off || payload > total - off - size)
      return "a malformed fatbin (an entry past its end)";
    others |= kind != FATBIN_KIND_ELF;
    off += size + payload;
  }
  if (!others) return NULL; /* SASS only: the driver takes one or answers that none fits, compiling nothing */
  int n = device_sms();
  if (n < 0) return "a fatbin with PTX in it, the serving GPU's SM not known (no cuInit yet)";
  for (int d = 0; d < n; d++) {
    int matched = 0;
    for (uint64_t off = header; off < total && total - off >= FATBIN_ENTRY_MIN && !matched;) {
      uint16_t kind; /* checked again: another thread may write the caller's memory (then at worst refused) */
      memcpy(&kind, p + off, sizeof kind);
      uint64_t size = u32_at(p + off + 4), payload = u64_at(p + off + 8);
      if (size < FATBIN_ENTRY_MIN || size > total - off || payload > total - off - size) break;
      matched = kind == FATBIN_KIND_ELF && (int)u32_at(p + off + 28) == sm_list[d];
      off += size + payload;
    }
    if (!matched) {
      snprintf(reason_buf, sizeof reason_buf, "the PTX of a fatbin that has no sm_%d cubin for the GPU", sm_list[d]);
      return reason_buf;
    }
  }
  return NULL;
}

/* NULL if the image goes on to the driver, else why not. `avail` as for fatbin_refusal; `from_file`: bytes read from
 * a file, where a fatbin wrapper's pointer means nothing (refused, never followed). */
static const char *image_refusal(const void *image, size_t avail, int from_file) {
  if (image == NULL) return NULL; /* the driver answers CUDA_ERROR_INVALID_VALUE */
  const unsigned char *p = image;
  const char *neither = "an image that is neither a cubin nor a fatbin (PTX, NVVM IR or Tile IR)";
  if (avail != 0 && avail < 4) return neither;
  if (memcmp(p, "\x7f" "ELF", 4) == 0) return NULL;
  uint32_t magic = u32_at(p);
  if (magic == FATBIN_MAGIC) return fatbin_refusal(p, avail);
  if (magic == FATBINC_MAGIC) { /* a fatbin wrapper: its data points at a fatbin */
    if (from_file || (avail != 0 && avail < 16)) return "a fatbin wrapper that is not in memory";
    const unsigned char *data = (const unsigned char *)(uintptr_t)u64_at(p + 8);
    if (data == NULL || u32_at(data) != FATBIN_MAGIC) return "a fatbin wrapper around something else than a fatbin";
    return fatbin_refusal(data, 0);
  }
  return neither;
}

static int refuse_image(const char *symbol, const char *reason) {
  char what[384];
  snprintf(what, sizeof what, "the CUDA driver (%s) was about to JIT-compile %s in this process", symbol, reason);
  refuse(symbol, what);
  return CUDA_ERROR_JIT_COMPILATION_DISABLED;
}

/* The whole of a regular file, read through one descriptor, its size in *size (NULL with *rc set on failure). */
static unsigned char *read_whole(const char *path, size_t *size, int *rc) {
  if (path == NULL) { *rc = CUDA_ERROR_INVALID_VALUE; return NULL; }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 4 || st.st_size > (1LL << 31)) {
    if (fd >= 0) close(fd);
    *rc = CUDA_ERROR_FILE_NOT_FOUND;
    return NULL;
  }
  unsigned char *buf = malloc((size_t)st.st_size + 1);
  size_t got = 0;
  while (buf != NULL && got < (size_t)st.st_size) {
    ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  if (buf == NULL || got != (size_t)st.st_size) {
    free(buf);
    *rc = buf == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_FILE_NOT_FOUND;
    return NULL;
  }
  buf[got] = 0; /* PTX text is read as a C string by the driver */
  *size = got;
  return buf;
}

static int load_data(int slot, void **module, const void *image) {
  const char *why = image_refusal(image, 0, 0);
  if (why != NULL) return refuse_image("cuModuleLoadData", why);
  return ((load_data_t)target[K_LOAD_DATA][slot])(module, image);
}
static int load_data_ex(int slot, void **module, const void *image, unsigned n, void *options, void **values) {
  const char *why = image_refusal(image, 0, 0);
  if (why != NULL) return refuse_image("cuModuleLoadDataEx", why);
  return ((load_data_ex_t)target[K_LOAD_DATA_EX][slot])(module, image, n, options, values);
}
static int load_fatbinary(int slot, void **module, const void *image) {
  const char *why = image_refusal(image, 0, 0);
  if (why != NULL) return refuse_image("cuModuleLoadFatBinary", why);
  return ((load_data_t)target[K_LOAD_FATBINARY][slot])(module, image);
}
static int library_load_data(int slot, void **library, const void *code, void *jo, void **jv, unsigned nj, int *lo,
                             void **lv, unsigned nl) {
  const char *why = image_refusal(code, 0, 0);
  if (why != NULL) return refuse_image("cuLibraryLoadData", why);
  return ((library_load_data_t)target[K_LIBRARY_LOAD_DATA][slot])(library, code, jo, jv, nj, lo, lv, nl);
}
static int load_file(int slot, void **module, const char *path) {
  int rc = 0;
  size_t size = 0;
  unsigned char *image = read_whole(path, &size, &rc);
  if (image == NULL) return rc;
  const char *why = image_refusal(image, size, 1);
  rc = why == NULL ? ((load_data_t)target[K_LOAD_FILE][slot])(module, image) : refuse_image("cuModuleLoad", why);
  free(image); /* the driver keeps its own copy of a loaded image */
  return rc;
}
static int library_load_file(int slot, void **library, const char *path, void *jo, void **jv, unsigned nj, int *lo,
                             void **lv, unsigned nl) {
  for (unsigned i = 0; lo != NULL && i < nl; i++)
    if (lo[i] == CU_LIBRARY_BINARY_IS_PRESERVED) return CUDA_ERROR_INVALID_VALUE; /* invalid with a file (cuda.h) */
  int rc = 0;
  size_t size = 0;
  unsigned char *code = read_whole(path, &size, &rc);
  if (code == NULL) return rc;
  const char *why = image_refusal(code, size, 1);
  rc = why == NULL ? ((library_load_data_t)target[K_LIBRARY_LOAD_FILE][slot])(library, code, jo, jv, nj, lo, lv, nl)
                   : refuse_image("cuLibraryLoadFromFile", why);
  free(code);
  return rc;
}

#define LOADER_STUBS(S)                                                                                         \
  static int stub_load_data_##S(void **m, const void *i) { return load_data(S, m, i); }                        \
  static int stub_load_data_ex_##S(void **m, const void *i, unsigned n, void *o, void **v) {                   \
    return load_data_ex(S, m, i, n, o, v);                                                                      \
  }                                                                                                             \
  static int stub_load_fatbinary_##S(void **m, const void *i) { return load_fatbinary(S, m, i); }              \
  static int stub_library_load_data_##S(void **l, const void *c, void *jo, void **jv, unsigned nj, int *lo,    \
                                        void **lv, unsigned nl) {                                               \
    return library_load_data(S, l, c, jo, jv, nj, lo, lv, nl);                                                  \
  }                                                                                                             \
  static int stub_load_file_##S(void **m, const char *p) { return load_file(S, m, p); }                        \
  static int stub_library_load_file_##S(void **l, const char *p, void *jo, void **jv, unsigned nj, int *lo,    \
                                        void **lv, unsigned nl) {                                               \
    return library_load_file(S, l, p, jo, jv, nj, lo, lv, nl);                                                  \
  }
LOADER_STUBS(0)
LOADER_STUBS(1)
LOADER_STUBS(2)
LOADER_STUBS(3)
#define LOADER_ROW(S)                                                                                           \
  {(void *)stub_load_data_##S, (void *)stub_load_data_ex_##S, (void *)stub_load_fatbinary_##S,                  \
   (void *)stub_library_load_data_##S, (void *)stub_load_file_##S, (void *)stub_library_load_file_##S}
static void *const loader_stubs[SLOTS][K_COUNT] = {LOADER_ROW(0), LOADER_ROW(1), LOADER_ROW(2), LOADER_ROW(3)};
static const char *const loader_names[K_COUNT] = {"cuModuleLoadData", "cuModuleLoadDataEx", "cuModuleLoadFatBinary",
                                                  "cuLibraryLoadData", "cuModuleLoad", "cuLibraryLoadFromFile"};

/* ---- Exec guard (loader/strict/exec_guard.py), only where Landlock's exec allow-list is not applied: libc's own
 * execve, execveat and fexecve bodies jump here. glibc's system(), popen(), posix_spawn(p), the exec*() family and
 * Python's subprocess all reach execve through libc's internal alias, the same address, also in the child after
 * fork/vfork/clone (the patched text is inherited). Their first instructions (`mov $nr,%eax; syscall; cmp; jae`) are
 * not movable (x86_relocate.py refuses the syscall and the branch), so the stub never returns into them: the bodies are
 * plain syscall wrappers, and an allowed exec is made here by libc's syscall(). What runs here must be
 * async-signal-safe (a vfork child runs it): stat/open/read and table lookups on static memory, no malloc, no stdio.
 * A target is refused when it, or a path-like word of its argv (a shell's `-c` command, `env gcc`, `ld.so cc1`), is
 * a compiler: its (dev, inode) is one of the compilers', or its size is one's and its bytes are the same. */
#include <errno.h>
#include <sys/syscall.h>
#define EG_MAX_IDS 8192
#define EG_MAX_SIZED 1024
#define EG_POOL (256 * 1024)
static struct { unsigned long long dev, ino; } eg_ids[EG_MAX_IDS];
static int eg_nids;
static struct { long long size; int path; } eg_sized[EG_MAX_SIZED]; /* a compiler's size and its path in eg_pool */
static int eg_nsized;
static char eg_pool[EG_POOL];
static atomic_int eg_log_fd = -1;
static char eg_log_path[PATH_MAX]; /* opened again where the descriptor is gone (a child that closed its fds) */
static unsigned long long eg_log_id[2]; /* the (dev, inode) the descriptor was opened on */
static atomic_long eg_refusals = 0;

static int eg_same_bytes(int fd, const char *other) {
  int ofd = open(other, O_RDONLY | O_CLOEXEC);
  if (ofd < 0) return 0;
  char a[1024], b[1024];
  off_t at = 0;
  int same = 1;
  for (;;) {
    ssize_t n = pread(fd, a, sizeof a, at), m = pread(ofd, b, sizeof b, at);
    if (n != m || n < 0 || memcmp(a, b, (size_t)n) != 0) { same = 0; break; }
    if (n == 0) break;
    at += n;
  }
  close(ofd);
  return same;
}

/* Whether the file (dirfd, path, fstatat flags) is a compiler: by inode, or by size and content. */
static int eg_is_compiler(int dirfd, const char *path, int flags) {
  struct stat st;
  if (path == NULL || fstatat(dirfd, path, &st, flags) != 0 || !S_ISREG(st.st_mode)) return 0;
  for (int i = 0; i < eg_nids; i++)
    if (eg_ids[i].dev == (unsigned long long)st.st_dev && eg_ids[i].ino == (unsigned long long)st.st_ino) return 1;
  for (int i = 0; i < eg_nsized; i++) {
    if (eg_sized[i].size != (long long)st.st_size) continue;
    int fd = (flags & AT_EMPTY_PATH) && path[0] == '\0' ? dup(dirfd) : openat(dirfd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    struct stat again;
    int same = fstat(fd, &again) == 0 && again.st_size == st.st_size && eg_same_bytes(fd, eg_pool + eg_sized[i].path);
    close(fd);
    if (same) return 1;
  }
  return 0;
}

/* The first path-like word (one with a '/') of argv[1..] that is a compiler, copied into `out`, else 0. Words are
 * split at blanks and the shell's quoting and operator characters, and at '=' (`x=/usr/bin/gcc; $x`). */
static int eg_compiler_in_argv(char *const argv[], char *out, size_t cap) {
  if (argv == NULL || argv[0] == NULL) return 0;
  for (int a = 1; argv[a] != NULL && a < 4096; a++) {
    const char *s = argv[a];
    while (*s) {
      while (*s && strchr(" \t\n;&|()<>`$'\"={}", *s)) s++;
      size_t n = 0;
      int slash = 0;
      while (s[n] && !strchr(" \t\n;&|()<>`$'\"={}", s[n])) slash |= s[n++] == '/';
      if (slash && n < cap) {
        memcpy(out, s, n);
        out[n] = '\0';
        if (eg_is_compiler(AT_FDCWD, out, 0)) return 1;
      }
      s += n;
    }
  }
  return 0;
}

static size_t eg_put(char *line, size_t at, size_t cap, const char *text, int escape) {
  for (; text && *text && at + 1 < cap; text++) {
    char c = *text;
    line[at++] = escape && (c == '"' || c == '\\' || (unsigned char)c < 0x20) ? '?' : c;
  }
  return at;
}

static size_t eg_put_long(char *line, size_t at, size_t cap, long v, int width) {
  char digits[24];
  int n = 0;
  if (v < 0) { at = eg_put(line, at, cap, "-", 0); v = -v; }
  do { digits[n++] = (char)('0' + v % 10); v /= 10; } while (v && n < 20);
  while (n < width) digits[n++] = '0';
  while (n && at + 1 < cap) line[at++] = digits[--n];
  return at;
}

/* The firewall's event line, built by hand (no stdio in a vfork child). */
static void eg_refuse(const char *symbol, const char *target, const char *word) {
  atomic_fetch_add(&eg_refusals, 1);
  int fd = atomic_load(&eg_log_fd);
  if (fd < 0) return;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  char line[PATH_MAX + 512];
  size_t n = 0, cap = sizeof line - 2;
  n = eg_put(line, n, cap, "{\"event\": \"compile_forbidden\", \"pid\": ", 0);
  n = eg_put_long(line, n, cap, (long)syscall(SYS_getpid), 1);
  n = eg_put(line, n, cap, ", \"symbol\": \"", 0);
  n = eg_put(line, n, cap, symbol, 0);
  n = eg_put(line, n, cap, "\", \"time\": ", 0);
  n = eg_put_long(line, n, cap, (long)ts.tv_sec, 1);
  n = eg_put(line, n, cap, ".", 0);
  n = eg_put_long(line, n, cap, ts.tv_nsec / 1000000L, 3);
  n = eg_put(line, n, cap, ", \"via\": \"exec-guard\", \"what\": \"", 0);
  n = eg_put(line, n, cap, word ? "a command naming the compiler " : "the compiler ", 0);
  n = eg_put(line, n, cap, word ? word : target, 1);
  n = eg_put(line, n, cap, word ? " was about to run (" : " was about to run", 0);
  if (word) n = eg_put(line, n, cap, target, 1);
  n = eg_put(line, n, cap, word ? ") without Landlock\"}" : " without Landlock\"}", 0);
  line[n++] = '\n';
  struct stat st; /* the descriptor may be closed, or its number reused by a child for another file */
  int ours = fstat(fd, &st) == 0 && (unsigned long long)st.st_dev == eg_log_id[0] &&
             (unsigned long long)st.st_ino == eg_log_id[1];
  if ((!ours || write(fd, line, n) < 0) && eg_log_path[0] != '\0') {
    int again = open(eg_log_path, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
    if (again >= 0) {
      ssize_t w = write(again, line, n);
      (void)w;
      close(again);
    }
  }
}

static int eg_check(const char *symbol, int dirfd, const char *path, char *const argv[], int flags) {
  char word[PATH_MAX];
  int empty = (flags & AT_EMPTY_PATH) && path != NULL && path[0] == '\0';
  if (eg_is_compiler(dirfd, path, flags & AT_EMPTY_PATH)) {
    eg_refuse(symbol, empty ? "(an open descriptor)" : path, NULL);
    return -1;
  }
  if (eg_compiler_in_argv(argv, word, sizeof word)) {
    eg_refuse(symbol, empty ? "(an open descriptor)" : path, word);
    return -1;
  }
  return 0;
}

static int eg_execve(const char *path, char *const argv[], char *const envp[]) {
  if (eg_check("execve", AT_FDCWD, path, argv, 0) != 0) { errno = EACCES; return -1; }
  return (int)syscall(SYS_execve, path, argv, envp);
}
static int eg_execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags) {
  if (eg_check("execveat", dirfd, path, argv, flags) != 0) { errno = EACCES; return -1; }
  return (int)syscall(SYS_execveat, dirfd, path, argv, envp, flags);
}
static int eg_fexecve(int fd, char *const argv[], char *const envp[]) {
  if (eg_check("fexecve", fd, "", argv, AT_EMPTY_PATH) != 0) { errno = EACCES; return -1; }
  return (int)syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH);
}

/* exec_guard_set(ids, sized, fd): the compilers' (dev, inode) pairs, their (size, path) for the content check, the
 * event log descriptor (-1: none) and its path (opened again in a child that closed the descriptor). */
static PyObject *py_exec_guard_set(PyObject *self, PyObject *args) {
  PyObject *ids, *sized;
  int fd;
  const char *log_path = "";
  if (!PyArg_ParseTuple(args, "OOi|s", &ids, &sized, &fd, &log_path)) return NULL;
  if (strlen(log_path) >= sizeof eg_log_path) {
    PyErr_SetString(PyExc_ValueError, "the event log's path is too long");
    return NULL;
  }
  Py_ssize_t ni = PyList_Size(ids), ns = PyList_Size(sized);
  if (ni < 0 || ns < 0) return NULL;
  if (ni > EG_MAX_IDS || ns > EG_MAX_SIZED) {
    PyErr_Format(PyExc_ValueError, "at most %d compiler inodes and %d sizes", EG_MAX_IDS, EG_MAX_SIZED);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < ni; i++) {
    unsigned long long dev, ino;
    if (!PyArg_ParseTuple(PyList_GetItem(ids, i), "KK", &dev, &ino)) return NULL;
    eg_ids[i].dev = dev;
    eg_ids[i].ino = ino;
  }
  size_t used = 0;
  for (Py_ssize_t i = 0; i < ns; i++) {
    long long size;
    const char *path;
    if (!PyArg_ParseTuple(PyList_GetItem(sized, i), "Ls", &size, &path)) return NULL;
    size_t len = strlen(path) + 1;
    if (used + len > EG_POOL) {
      PyErr_SetString(PyExc_ValueError, "the compilers' paths do not fit the exec guard's table");
      return NULL;
    }
    memcpy(eg_pool + used, path, len);
    eg_sized[i].size = size;
    eg_sized[i].path = (int)used;
    used += len;
  }
  eg_nids = (int)ni;
  eg_nsized = (int)ns;
  memcpy(eg_log_path, log_path, strlen(log_path) + 1);
  struct stat st;
  eg_log_id[0] = eg_log_id[1] = 0;
  if (fd >= 0 && fstat(fd, &st) == 0) {
    eg_log_id[0] = (unsigned long long)st.st_dev;
    eg_log_id[1] = (unsigned long long)st.st_ino;
  }
  atomic_store(&eg_log_fd, fd);
  Py_RETURN_NONE;
}

/* exec_guard_check(path[, argv]) -> the compiler it would refuse for (the path or an argv word), or None. */
static PyObject *py_exec_guard_check(PyObject *self, PyObject *args) {
  const char *path;
  PyObject *words = NULL;
  if (!PyArg_ParseTuple(args, "s|O", &path, &words)) return NULL;
  if (eg_is_compiler(AT_FDCWD, path, 0)) return PyUnicode_FromString(path);
  if (words == NULL) Py_RETURN_NONE;
  Py_ssize_t n = PyList_Size(words);
  if (n < 0 || n > 4000) return n < 0 ? NULL : PyErr_Format(PyExc_ValueError, "too many words");
  char *argv[4002];
  argv[0] = (char *)path;
  for (Py_ssize_t i = 0; i < n; i++) {
    argv[i + 1] = (char *)PyUnicode_AsUTF8AndSize(PyList_GetItem(words, i), NULL);
    if (argv[i + 1] == NULL) return NULL;
  }
  argv[n + 1] = NULL;
  char word[PATH_MAX];
  if (eg_compiler_in_argv(argv, word, sizeof word)) return PyUnicode_FromString(word);
  Py_RETURN_NONE;
}

static PyObject *py_exec_guard_refusals(PyObject *self, PyObject *noargs) {
  return PyLong_FromLong(atomic_load(&eg_refusals));
}

static const struct {
  const char *name;
  void *address;
} stubs[] = {
    {"nvrtcCompileProgram", (void *)stub_nvrtcCompileProgram},
    {"nvJitLinkAddData", (void *)stub_nvJitLinkAddData},
    {"nvJitLinkAddFile", (void *)stub_nvJitLinkAddFile},
    {"nvJitLinkComplete", (void *)stub_nvJitLinkComplete},
    {"nvvmCompileProgram", (void *)stub_nvvmCompileProgram},
    {"cuLinkAddData", (void *)stub_cuLinkAddData},
    {"cuLinkAddFile", (void *)stub_cuLinkAddFile},
    {"execve", (void *)eg_execve},
    {"execveat", (void *)eg_execveat},
    {"fexecve", (void *)eg_fexecve},
};

static int write_code(unsigned char *at, const unsigned char *code, size_t len) {
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t lo = (uintptr_t)at & ~(uintptr_t)(page - 1);
  uintptr_t hi = ((uintptr_t)at + len + (uintptr_t)page - 1) & ~(uintptr_t)(page - 1);
  if (mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE | PROT_EXEC) != 0 &&
      mprotect((void *)lo, hi - lo, PROT_READ | PROT_WRITE) != 0)
    return -1;
  memcpy(at, code, len);
  __builtin___clear_cache((char *)at, (char *)at + len);
  return mprotect((void *)lo, hi - lo, PROT_READ | PROT_EXEC);
}

/* patch(address, stub[, slot, target, thunk]): jump from `address` to a refusing stub by name, or to a loader stub
 * (loader_names) in `slot` whose `target` is the original's trampoline (data loaders) or the data loader to hand
 * file bytes to. With a `thunk` page (from trampoline_alloc, near `address`) only 5 bytes are written, `jmp rel32`
 * to the thunk, which jumps on to the stub: for an entry that is itself only a 5-byte jump. Returns the bytes
 * overwritten (14 or 5). */
static PyObject *py_patch(PyObject *self, PyObject *args) {
  unsigned long long address, to = 0, thunk = 0;
  const char *stub;
  int slot = -1;
  if (!PyArg_ParseTuple(args, "Ks|iKK", &address, &stub, &slot, &to, &thunk)) return NULL;
  void *dest = NULL;
  for (size_t i = 0; i < sizeof stubs / sizeof stubs[0]; i++)
    if (strcmp(stubs[i].name, stub) == 0) dest = stubs[i].address;
  for (int k = 0; dest == NULL && k < K_COUNT; k++) {
    if (strcmp(loader_names[k], stub) != 0) continue;
    if (slot < 0 || slot >= SLOTS || to == 0) {
      PyErr_Format(PyExc_ValueError, "loader stub %s needs a slot in 0..%d and a target", stub, SLOTS - 1);
      return NULL;
    }
    target[k][slot] = (void *)(uintptr_t)to;
    dest = loader_stubs[slot][k];
  }
  if (dest == NULL) {
    PyErr_Format(PyExc_ValueError, "no refusing stub named %s", stub);
    return NULL;
  }
  unsigned char *at = (unsigned char *)(uintptr_t)address;
  unsigned char code[PATCH_LEN] = {0xff, 0x25, 0, 0, 0, 0}; /* jmp qword ptr [rip+0] */
  uint64_t jump_to = (uint64_t)(uintptr_t)dest;
  memcpy(code + 6, &jump_to, sizeof jump_to);
  size_t len = PATCH_LEN;
  if (thunk != 0) {
    long long rel = (long long)thunk - (long long)(address + 5);
    long page = sysconf(_SC_PAGESIZE);
    if (rel < INT32_MIN || rel > INT32_MAX || (thunk & (unsigned long long)(page - 1)) != 0) {
      PyErr_SetString(PyExc_ValueError, "the thunk must be a page of its own within rel32 reach");
      return NULL;
    }
    memcpy((void *)(uintptr_t)thunk, code, PATCH_LEN);
    __builtin___clear_cache((char *)(uintptr_t)thunk, (char *)(uintptr_t)thunk + PATCH_LEN);
    if (mprotect((void *)(uintptr_t)thunk, (size_t)page, PROT_READ | PROT_EXEC) != 0)
      return PyErr_SetFromErrno(PyExc_OSError);
    int32_t rel32 = (int32_t)rel;
    code[0] = 0xe9;
    memcpy(code + 1, &rel32, sizeof rel32);
    len = 5;
  }
  PyObject *original = PyBytes_FromStringAndSize((const char *)at, (Py_ssize_t)len);
  if (original == NULL) return NULL;
  if (write_code(at, code, len) != 0) {
    Py_DECREF(original);
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return original;
}

/* A page for a trampoline within +-1.5 GiB of `near`, so that the moved instructions' 32-bit RIP-relative
 * operands still reach (0 if none could be mapped there). */
static PyObject *py_trampoline_alloc(PyObject *self, PyObject *args) {
  unsigned long long near;
  if (!PyArg_ParseTuple(args, "K", &near)) return NULL;
  long page = sysconf(_SC_PAGESIZE);
  uintptr_t base = (uintptr_t)near & ~(uintptr_t)(page - 1);
  for (uintptr_t step = 1; step <= 1536; step++) {
    for (int side = 0; side < 2; side++) {
      uintptr_t delta = step << 20;
      if (side == 0 && base < delta + (1u << 20)) continue;
      uintptr_t hint = side == 0 ? base - delta : base + delta;
      void *p = mmap((void *)hint, (size_t)page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
                     -1, 0);
      if (p == MAP_FAILED) continue;
      if ((uintptr_t)p == hint) return PyLong_FromUnsignedLongLong((unsigned long long)hint);
      munmap(p, (size_t)page); /* a kernel without MAP_FIXED_NOREPLACE took it as a hint */
    }
  }
  return PyLong_FromLong(0);
}

/* trampoline_write(address, code): the moved instructions into the page trampoline_alloc gave, then R-X. */
static PyObject *py_trampoline_write(PyObject *self, PyObject *args) {
  unsigned long long address;
  const char *code;
  Py_ssize_t len;
  if (!PyArg_ParseTuple(args, "Ky#", &address, &code, &len)) return NULL;
  long page = sysconf(_SC_PAGESIZE);
  if (len <= 0 || len > page || (address & (unsigned long long)(page - 1)) != 0) {
    PyErr_SetString(PyExc_ValueError, "a trampoline is at most one page, at the start of a page of its own");
    return NULL;
  }
  memcpy((void *)(uintptr_t)address, code, (size_t)len);
  __builtin___clear_cache((char *)(uintptr_t)address, (char *)(uintptr_t)address + len);
  if (mprotect((void *)(uintptr_t)address, (size_t)page, PROT_READ | PROT_EXEC) != 0)
    return PyErr_SetFromErrno(PyExc_OSError);
  Py_RETURN_NONE;
}

static PyObject *py_unpatch(PyObject *self, PyObject *args) {
  unsigned long long address;
  const char *original;
  Py_ssize_t len;
  if (!PyArg_ParseTuple(args, "Ky#", &address, &original, &len)) return NULL;
  if (len != PATCH_LEN && len != 5) {
    PyErr_SetString(PyExc_ValueError, "original code must be the bytes patch() returned (14 or 5)");
    return NULL;
  }
  if (write_code((unsigned char *)(uintptr_t)address, (const unsigned char *)original, (size_t)len) != 0)
    return PyErr_SetFromErrno(PyExc_OSError);
  Py_RETURN_NONE;
}

static PyObject *py_set_log_fd(PyObject *self, PyObject *args) {
  int fd;
  if (!PyArg_ParseTuple(args, "i", &fd)) return NULL;
  atomic_store(&log_fd, fd);
  Py_RETURN_NONE;
}

/* set_device_query(cuDeviceGetCount, cuDeviceGet, cuDeviceGetAttribute): the driver entries the fatbin check asks
 * for the GPUs' SMs (0, 0, 0: none; either way the SMs read so far are forgotten). */
static PyObject *py_set_device_query(PyObject *self, PyObject *args) {
  unsigned long long count, get, attr;
  if (!PyArg_ParseTuple(args, "KKK", &count, &get, &attr)) return NULL;
  device_query[0] = (void *)(uintptr_t)count;
  device_query[1] = (void *)(uintptr_t)get;
  device_query[2] = (void *)(uintptr_t)attr;
  atomic_store(&sm_count, -1);
  Py_RETURN_NONE;
}

/* image_refusal(image[, from_file]) -> None if the image goes on to the driver, else why not: the check the C stubs
 * make, for the Python wrappers. `image` is bytes (sized) or an address (unsized: a fatbin's header says its size). */
static PyObject *py_image_refusal(PyObject *self, PyObject *args) {
  PyObject *image;
  int from_file = 0;
  if (!PyArg_ParseTuple(args, "O|p", &image, &from_file)) return NULL;
  const char *why;
  if (PyBytes_Check(image)) {
    char *data;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(image, &data, &len) != 0) return NULL;
    why = len == 0 ? "an empty image" : image_refusal(data, (size_t)len, from_file);
  } else {
    unsigned long long address = PyLong_AsUnsignedLongLong(image);
    if (PyErr_Occurred()) return NULL;
    why = image_refusal((const void *)(uintptr_t)address, 0, 0);
  }
  if (why == NULL) Py_RETURN_NONE;
  return PyUnicode_FromString(why);
}

static PyObject *py_refusals(PyObject *self, PyObject *noargs) { return PyLong_FromLong(atomic_load(&refusals)); }

struct collect {
  PyObject *list;
  unsigned long long adds;
  int failed;
};

static int collect_one(struct dl_phdr_info *info, size_t size, void *data) {
  struct collect *c = data;
  c->adds = info->dlpi_adds;
  if (c->failed || info->dlpi_name == NULL || info->dlpi_name[0] == '\0') return 0;
  PyObject *item = Py_BuildValue("(sK)", info->dlpi_name, (unsigned long long)info->dlpi_addr);
  if (item == NULL || PyList_Append(c->list, item) != 0) c->failed = 1;
  Py_XDECREF(item);
  return 0;
}

/* (loads so far, [(path, load bias)]) of every object the dynamic loader has mapped. */
static PyObject *py_loaded(PyObject *self, PyObject *noargs) {
  struct collect c = {PyList_New(0), 0, 0};
  if (c.list == NULL) return NULL;
  dl_iterate_phdr(collect_one, &c);
  if (c.failed) {
    Py_DECREF(c.list);
    return NULL;
  }
  return Py_BuildValue("(KN)", c.adds, c.list);
}

static int count_adds(struct dl_phdr_info *info, size_t size, void *data) {
  *(unsigned long long *)data = info->dlpi_adds;
  return 1;
}

/* How many objects the dynamic loader has loaded so far (a cheap "did anything load?" test). */
static PyObject *py_adds(PyObject *self, PyObject *noargs) {
  unsigned long long adds = 0;
  dl_iterate_phdr(count_adds, &adds);
  return PyLong_FromUnsignedLongLong(adds);
}

static PyMethodDef methods[] = {
    {"patch", py_patch, METH_VARARGS,
     "patch(address, stub[, slot, target]) -> original bytes: jump from address to the named stub"},
    {"trampoline_alloc", py_trampoline_alloc, METH_VARARGS, "trampoline_alloc(near) -> a page near `near` (0: none)"},
    {"trampoline_write", py_trampoline_write, METH_VARARGS, "trampoline_write(page, code): write, then make R-X"},
    {"unpatch", py_unpatch, METH_VARARGS, "unpatch(address, original): put the original code back"},
    {"set_log_fd", py_set_log_fd, METH_VARARGS, "set_log_fd(fd): where refusals append their event line (-1: none)"},
    {"set_device_query", py_set_device_query, METH_VARARGS,
     "set_device_query(count, get, attribute): the driver entries that give the GPUs' SMs (0, 0, 0: none)"},
    {"image_refusal", py_image_refusal, METH_VARARGS,
     "image_refusal(bytes or address[, from_file]) -> None if the image may go on to the driver, else why not"},
    {"refusals", py_refusals, METH_NOARGS, "refusals() -> how many calls the stubs refused"},
    {"loaded", py_loaded, METH_NOARGS, "loaded() -> (adds, [(path, load bias)]) of the loaded objects"},
    {"adds", py_adds, METH_NOARGS, "adds() -> objects loaded so far by the dynamic loader"},
    {"exec_guard_set", py_exec_guard_set, METH_VARARGS,
     "exec_guard_set(ids, sized, fd[, log_path]): the compilers' (dev, inode) and (size, path), the event log"},
    {"exec_guard_check", py_exec_guard_check, METH_VARARGS,
     "exec_guard_check(path[, words]) -> the compiler the exec guard would refuse for, or None"},
    {"exec_guard_refusals", py_exec_guard_refusals, METH_NOARGS, "exec_guard_refusals() -> execs refused"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_inproc", "nojit's refusing stubs for in-process compilers",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__inproc(void) {
  PyObject *m = PyModule_Create(&module);
  if (m != NULL) PyModule_AddIntConstant(m, "PATCH_LEN", PATCH_LEN);
  if (m != NULL) PyModule_AddIntConstant(m, "SLOTS", SLOTS);
  return m;
}
