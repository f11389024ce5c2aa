/* Test harness only (LD_PRELOAD into the check's Python): counts every process a library in the process starts
   from C, and every NVRTC compile, where Python's audit hooks cannot see them. TensorRT-LLM DeepGEMM inside
   FlashInfer's fp8_blockscale_gemm_90 compiles a missing kernel with libc popen("nvcc ...") (compiler.cuh,
   "always use nvcc"); a library could also call nvrtcCompileProgram. Interposed here: fork, vfork, the exec
   family, posix_spawn(p), popen, system and nvrtcCompileProgram. Mode 0 (at load): count and pass through;
   mode 1 (nojit_guard_set_mode(1)): count and refuse (-1/EPERM, NULL, NVRTC_ERROR_COMPILATION). Each event is one
   line on stderr. Read the counts with nojit_guard_processes() / nojit_guard_nvrtc() (ctypes, global scope).
   Built on the device by tests/gpu/device_run.sh (step flashinfer-launch) and by the CPU test. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static atomic_int guard_mode;
static atomic_long processes, nvrtc_compiles;

int nojit_guard_set_mode(int mode) { return atomic_exchange(&guard_mode, mode); }
long nojit_guard_processes(void) { return atomic_load(&processes); }
long nojit_guard_nvrtc(void) { return atomic_load(&nvrtc_compiles); }

static int refused(atomic_long *counter, const char *what, const char *detail) {
  atomic_fetch_add(counter, 1);
  int refuse = atomic_load(&guard_mode) == 1;
  fprintf(stderr, "nojit-exec-guard: %s %s %.300s\n", refuse ? "REFUSED" : "counted", what, detail ? detail : "");
  return refuse;
}

static void *next(const char *name) { return dlsym(RTLD_NEXT, name); }

pid_t fork(void) {
  if (refused(&processes, "fork", NULL)) { errno = EPERM; return -1; }
  pid_t (*real)(void) = (pid_t (*)(void))next("fork");
  return real();
}

/* vfork from a wrapper frame is undefined behaviour: fork is a valid vfork */
pid_t vfork(void) {
  if (refused(&processes, "vfork", NULL)) { errno = EPERM; return -1; }
  pid_t (*real)(void) = (pid_t (*)(void))next("fork");
  return real();
}

int execve(const char *path, char *const argv[], char *const envp[]) {
  if (refused(&processes, "execve", path)) { errno = EPERM; return -1; }
  int (*real)(const char *, char *const[], char *const[]) = next("execve");
  return real(path, argv, envp);
}

int execv(const char *path, char *const argv[]) {
  if (refused(&processes, "execv", path)) { errno = EPERM; return -1; }
  int (*real)(const char *, char *const[]) = next("execv");
  return real(path, argv);
}

int execvp(const char *file, char *const argv[]) {
  if (refused(&processes, "execvp", file)) { errno = EPERM; return -1; }
  int (*real)(const char *, char *const[]) = next("execvp");
  return real(file, argv);
}

int execvpe(const char *file, char *const argv[], char *const envp[]) {
  if (refused(&processes, "execvpe", file)) { errno = EPERM; return -1; }
  int (*real)(const char *, char *const[], char *const[]) = next("execvpe");
  return real(file, argv, envp);
}

#define GATHER_ARGS(first, argv, extra)                                   \
  char *argv[256];                                                        \
  {                                                                       \
    va_list ap;                                                           \
    va_start(ap, first);                                                  \
    int i = 0;                                                            \
    argv[i++] = (char *)(first);                                          \
    while (i < 255 && (argv[i] = va_arg(ap, char *)) != NULL) i++;        \
    argv[i] = NULL;                                                       \
    extra;                                                                \
    va_end(ap);                                                           \
  }

int execl(const char *path, const char *arg, ...) {
  GATHER_ARGS(arg, argv, (void)0);
  return execv(path, argv);
}

int execlp(const char *file, const char *arg, ...) {
  GATHER_ARGS(arg, argv, (void)0);
  return execvp(file, argv);
}

int execle(const char *path, const char *arg, ...) {
  char **envp = NULL;
  GATHER_ARGS(arg, argv, envp = va_arg(ap, char **));
  return execve(path, argv, envp);
}

int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                char *const argv[], char *const envp[]) {
  if (refused(&processes, "posix_spawn", path)) return EPERM;
  int (*real)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *, char *const[],
              char *const[]) = next("posix_spawn");
  return real(pid, path, fa, attr, argv, envp);
}

int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa, const posix_spawnattr_t *attr,
                 char *const argv[], char *const envp[]) {
  if (refused(&processes, "posix_spawnp", file)) return EPERM;
  int (*real)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *, char *const[],
              char *const[]) = next("posix_spawnp");
  return real(pid, file, fa, attr, argv, envp);
}

FILE *popen(const char *command, const char *type) {
  if (refused(&processes, "popen", command)) { errno = EPERM; return NULL; }
  FILE *(*real)(const char *, const char *) = next("popen");
  return real(command, type);
}

int system(const char *command) {
  if (command == NULL) return 0; /* "is a shell available": no process */
  if (refused(&processes, "system", command)) { errno = EPERM; return -1; }
  int (*real)(const char *) = next("system");
  return real(command);
}

/* nvrtcResult nvrtcCompileProgram(nvrtcProgram, int, const char * const *): 6 = NVRTC_ERROR_COMPILATION */
int nvrtcCompileProgram(void *prog, int num_options, const char *const *options) {
  if (refused(&nvrtc_compiles, "nvrtcCompileProgram", num_options > 0 && options ? options[0] : NULL)) return 6;
  int (*real)(void *, int, const char *const *) = next("nvrtcCompileProgram");
  return real ? real(prog, num_options, options) : 6;
}
