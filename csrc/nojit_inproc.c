/*
 * nojit in-process compiler guard (nojit.loader._inproc): refusing stubs for the entry points of
 * NVRTC, nvJitLink and NVVM, and the x86-64 hot patch that routes a loaded library's exported function
 * to them.
 *
 * NVRTC and nvJitLink compile inside the calling process, with no process for the firewall to
 * refuse, and are called from C (torch links libnvrtc, cuda.bindings dlopens it) as well as from
 * Python. So strict mode (loader/strict/inprocess_guard.py) overwrites the first 14 bytes of each
 * exported compile entry of every loaded copy with `jmp [rip+0]; .quad stub`: whoever calls it,
 * through whatever pointer (dlsym, a GOT slot, a ctypes handle), lands here. A stub never calls
 * the original (nothing it refuses has a legitimate caller in the serving process), so no
 * instruction of the library needs relocating. It returns the library's own error code, writes one
 * JSON line to the event log descriptor opened at install, and counts the refusal.
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
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
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

static PyObject *py_patch(PyObject *self, PyObject *args) {
  unsigned long long address;
  const char *stub;
  if (!PyArg_ParseTuple(args, "Ks", &address, &stub)) return NULL;
  void *target = NULL;
  for (size_t i = 0; i < sizeof stubs / sizeof stubs[0]; i++)
    if (strcmp(stubs[i].name, stub) == 0) target = stubs[i].address;
  if (target == NULL) {
    PyErr_Format(PyExc_ValueError, "no refusing stub named %s", stub);
    return NULL;
  }
  unsigned char *at = (unsigned char *)(uintptr_t)address;
  PyObject *original = PyBytes_FromStringAndSize((const char *)at, PATCH_LEN);
  if (original == NULL) return NULL;
  unsigned char code[PATCH_LEN] = {0xff, 0x25, 0, 0, 0, 0}; /* jmp qword ptr [rip+0] */
  uint64_t dest = (uint64_t)(uintptr_t)target;
  memcpy(code + 6, &dest, sizeof dest);
  if (write_code(at, code, PATCH_LEN) != 0) {
    Py_DECREF(original);
    return PyErr_SetFromErrno(PyExc_OSError);
  }
  return original;
}

static PyObject *py_unpatch(PyObject *self, PyObject *args) {
  unsigned long long address;
  const char *original;
  Py_ssize_t len;
  if (!PyArg_ParseTuple(args, "Ky#", &address, &original, &len)) return NULL;
  if (len != PATCH_LEN) {
    PyErr_SetString(PyExc_ValueError, "original code must be the 14 bytes patch() returned");
    return NULL;
  }
  if (write_code((unsigned char *)(uintptr_t)address, (const unsigned char *)original, PATCH_LEN) != 0)
    return PyErr_SetFromErrno(PyExc_OSError);
  Py_RETURN_NONE;
}

static PyObject *py_set_log_fd(PyObject *self, PyObject *args) {
  int fd;
  if (!PyArg_ParseTuple(args, "i", &fd)) return NULL;
  atomic_store(&log_fd, fd);
  Py_RETURN_NONE;
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
    {"patch", py_patch, METH_VARARGS, "patch(address, stub) -> original bytes: jump from address to the named stub"},
    {"unpatch", py_unpatch, METH_VARARGS, "unpatch(address, original): put the original code back"},
    {"set_log_fd", py_set_log_fd, METH_VARARGS, "set_log_fd(fd): where refusals append their event line (-1: none)"},
    {"refusals", py_refusals, METH_NOARGS, "refusals() -> how many calls the stubs refused"},
    {"loaded", py_loaded, METH_NOARGS, "loaded() -> (adds, [(path, load bias)]) of the loaded objects"},
    {"adds", py_adds, METH_NOARGS, "adds() -> objects loaded so far by the dynamic loader"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_inproc", "nojit's refusing stubs for in-process compilers",
                                    -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__inproc(void) {
  PyObject *m = PyModule_Create(&module);
  if (m != NULL) PyModule_AddIntConstant(m, "PATCH_LEN", PATCH_LEN);
  return m;
}
