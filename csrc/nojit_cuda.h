/*
 * nojit C launcher: load a cubin, pack arguments from a compact type string, launch.
 *
 * Nothing else. libcuda is opened at run time (dlopen "libcuda.so.1"), so building this
 * needs neither the CUDA toolkit nor cuda.h, and using it needs neither a compiler nor
 * the toolkit: only the driver that any CUDA machine has.
 *
 * Argument type codes (one char per kernel parameter, values passed as 64-bit slots):
 *   'p' pointer (8 bytes)   'l' int64   'L' uint64   'i' int32   'u' uint32
 *   'h' int16   'H' uint16  'c' int8 / uint8 / bool (1 byte)
 *   'f' fp32, 'd' fp64, 'e' fp16, 'b' bf16: the slot holds the bits of a C double
 * Every function returns 0 on success, or a CUresult / negative nojit code and writes a
 * message into err (always NUL-terminated).
 */
#ifndef NOJIT_CUDA_H
#define NOJIT_CUDA_H

#include <stddef.h>
#include <stdint.h>

#define NOJIT_MAX_FAST_ARGS 128
/* Hopper: at most 16 blocks per cluster (8 portable); the launcher refuses anything larger. */
#define NOJIT_MAX_CLUSTER_BLOCKS 16

/* nojit's own failure codes (CUresult values are >= 0). */
#define NOJIT_ERR_NO_DRIVER (-1)
#define NOJIT_ERR_BAD_ARGUMENT (-2)
#define NOJIT_ERR_OUT_OF_MEMORY (-3)

/* cdef-begin: csrc/build_ffi.py hands the text up to cdef-end to cffi as the Python-visible API */

/* Open libcuda.so.1, resolve the driver entry points, cuInit(0). Idempotent. */
int nojit_init(char *err, size_t errlen);

/* Driver version (e.g. 13000), or a negative code. */
int nojit_driver_version(int *version, char *err, size_t errlen);

/* Make the primary context of `device` current on this thread if none is current. */
int nojit_ensure_context(int device, char *err, size_t errlen);

/*
 * Load a cubin into the current context and look up `symbol`.
 * dynamic_smem: bytes of dynamic shared memory the kernel is launched with; above 48 KiB
 * the function's limit is raised to it (and the carveout set to prefer shared memory).
 * Outputs: module and function handles, registers per thread, max threads per block.
 */
int nojit_load(const void *image, size_t image_size, const char *symbol, uint32_t dynamic_smem,
               uint64_t *module_out, uint64_t *function_out, int *num_regs_out,
               int *max_threads_out, char *err, size_t errlen);

int nojit_unload(uint64_t module, char *err, size_t errlen);

/*
 * Launch `function` on `stream` (a CUstream, 0 for the legacy default stream).
 * grid: CTAs per axis (already multiplied by the cluster size along x where applicable);
 * cluster_*: 0 or 1 for no cluster; pdl: set programmatic stream serialization;
 * cooperative: cooperative launch. A grid with a zero axis launches nothing.
 */
int nojit_launch(uint64_t function, uint32_t grid_x, uint32_t grid_y, uint32_t grid_z,
                 uint32_t block_x, uint32_t block_y, uint32_t block_z, uint32_t shared_bytes,
                 uint64_t stream, const char *arg_types, const uint64_t *arg_values, int num_args,
                 uint32_t cluster_x, uint32_t cluster_y, uint32_t cluster_z, int pdl,
                 int cooperative, char *err, size_t errlen);

/* The driver's cuLaunchKernelEx (after nojit_init), for the one-call fast path (csrc/nojit_fast.c). */
int nojit_launch_entry(uint64_t *address, char *err, size_t errlen);
/* cdef-end */

#endif /* NOJIT_CUDA_H */
