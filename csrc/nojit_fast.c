/*
 * nojit fast path: one C call per Triton launch (nojit.loader._fastlaunch).
 *
 * A per-kernel, per-launch-options table is prepared at install from the bundle's exact
 * entries. A call hands over the bound arguments; this code computes what Triton's key
 * needs from them (tensor dtype and 16-byte alignment of data_ptr, int == 1, width and
 * divisibility by 16, None, bool, float, constexpr values), finds the entry by a hash of
 * those codes, packs the parameters and calls cuLaunchKernelEx on the given stream.
 * Anything it does not recognise is a miss (None): the Python path (loader/bundle/triton_key.py,
 * the one definition of the key) then decides, so a miss is never wrong, only slower.
 *
 * CUDA-graph safe: no allocation, no synchronisation on the launch path (stack buffers only).
 * Built against the limited API (abi3, 3.10): cffi cannot pass Python objects, and reading
 * tensors here is what removes the per-argument Python work. Tensors (data pointer, device, dtype)
 * and torch's current stream are read through torch's DLPack C exchange API where it has one
 * (csrc/nojit_dlpack.h), else through torch's Python API; a tensor read there that is not on the
 * launch's device is not launched here (the Python path decides, as for every call C declines).
 *
 * Codes (one uint32 per kernel parameter; loader/runtimes/triton/fast.py computes the same codes from
 * a bundle key, so both sides must change together):
 *   constexpr parameter     1 + index of the value among the table's candidates
 *   plain run-time param    tensor: 0x1000 + 4 * type id + attr; int: 0x20 + 4 * width + attr
 *                           (width 1 i32, 2 i64, 3 u64); int == 1 specialized: 0x10;
 *                           bool 0x40; float 0x50; None 0x60          attr: 0 None, 1 "D", 2 ""
 *   annotated int param     0x70 + (0 None, 1 "D", 2 "", 3 int 1, 4 NoneType)
 *   fixed (u1/fp) param     0x80
 */
#ifndef Py_LIMITED_API
#define Py_LIMITED_API 0x030A0000
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "nojit_cuda_abi.h"
#include "nojit_half.h"
#include "nojit_launch_config.h"

#define NJ_MAX_PARAMS 128
#define NJ_MAX_DTYPES 64
#define NJ_MAX_DEVICES 16

enum { K_CONSTEXPR = 0, K_PLAIN = 1, K_ANNOT = 2, K_FIXED = 3 };
enum { C_ONE = 0x10, C_INT = 0x20, C_BOOL = 0x40, C_FLOAT = 0x50, C_NONE = 0x60, C_ANNOT = 0x70, C_FIXED = 0x80,
       C_TENSOR = 0x1000 };

typedef NjResult (*fn_cuLaunchKernelEx)(const NjLaunchConfig *, NjFunction, void **, void **);

static PyObject *g_tensor_type;  /* torch.Tensor */
static PyObject *g_dtypes[NJ_MAX_DTYPES];
static int g_ndtypes;
static PyObject *g_s_dtype, *g_s_data_ptr;
static fn_cuLaunchKernelEx g_launch;

typedef struct {
  int kind, specialize, align;
  uint16_t dtype_code[NJ_MAX_DTYPES]; /* tensor type id per registered dtype */
  int ncand;
  PyObject **cand; /* constexpr candidates (strong refs) */
} Param;

typedef struct {
  uint64_t hash;
  uint32_t *codes;
  PyObject *variant;
  uint64_t function[NJ_MAX_DEVICES];
  int nargs;
  uint8_t *arg_index;
  char *arg_code;
  uint32_t grid_mult, block_x, shared, cx, cy, cz;
  int pdl, coop;
} Entry;

typedef struct {
  int nparams;
  Param *params;
  int nentries, capacity;
  Entry *entries;
  int nslots;
  int *slots; /* open addressing: entry index or -1 */
} Table;

/* What classification learns about one argument. */
typedef struct {
  uint64_t raw; /* data_ptr, integer bits, or double bits */
  int is_float;  /* 1: raw holds a double; 2: raw is an unsigned integer above INT64_MAX */
  int32_t dev_type, dev_id; /* a tensor read through DLPack: its device (dev_type 0: not known) */
} Value;

#include "nojit_dlpack.h"

/* 0 where every tensor whose device is known is on the launch's device (device type g_dl_launch_type, id
 * `device`); -1: one is not (a CPU tensor, another GPU): not launched here, the Python path decides. */
static int devices_ok(const Table *t, const Value *values, long device) {
  for (int i = 0; i < t->nparams; i++)
    if (values[i].dev_type && (values[i].dev_type != g_dl_launch_type || values[i].dev_id != device))
      return -1;
  return 0;
}

static uint64_t hash_codes(const uint32_t *codes, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; i++) {
    h ^= codes[i];
    h *= 1099511628211ull;
  }
  return h;
}

static void table_free(PyObject *capsule) {
  Table *t = (Table *)PyCapsule_GetPointer(capsule, "nojit.fast.table");
  if (!t)
    return;
  for (int i = 0; i < t->nparams; i++) {
    for (int c = 0; c < t->params[i].ncand; c++)
      Py_XDECREF(t->params[i].cand[c]);
    PyMem_Free(t->params[i].cand);
  }
  for (int e = 0; e < t->nentries; e++) {
    Py_XDECREF(t->entries[e].variant);
    PyMem_Free(t->entries[e].codes);
    PyMem_Free(t->entries[e].arg_index);
    PyMem_Free(t->entries[e].arg_code);
  }
  PyMem_Free(t->params);
  PyMem_Free(t->entries);
  PyMem_Free(t->slots);
  PyMem_Free(t);
}

static Table *get_table(PyObject *capsule) { return (Table *)PyCapsule_GetPointer(capsule, "nojit.fast.table"); }

/* configure(tensor_type, dtypes, cuLaunchKernelEx address) */
static PyObject *fast_configure(PyObject *self, PyObject *args) {
  PyObject *tensor_type, *dtypes;
  unsigned long long launch_addr;
  if (!PyArg_ParseTuple(args, "OOK", &tensor_type, &dtypes, &launch_addr))
    return NULL;
  Py_ssize_t n = PySequence_Size(dtypes);
  if (n < 0 || n > NJ_MAX_DTYPES) {
    PyErr_SetString(PyExc_ValueError, "too many dtypes");
    return NULL;
  }
  Py_XINCREF(tensor_type);
  Py_XDECREF(g_tensor_type);
  g_tensor_type = tensor_type;
  int same = n == g_ndtypes;
  PyObject *given[NJ_MAX_DTYPES];
  for (Py_ssize_t i = 0; i < n; i++) {
    given[i] = PySequence_GetItem(dtypes, i);
    same = same && given[i] == g_dtypes[i];
  }
  for (int i = 0; i < g_ndtypes; i++)
    Py_CLEAR(g_dtypes[i]);
  for (Py_ssize_t i = 0; i < n; i++)
    g_dtypes[i] = given[i];
  g_ndtypes = (int)n;
  if (!same) /* the DLPack dtype map was of other dtypes: read dtypes through torch until dlpack_setup again */
    memset(g_dl_dtype, 0, sizeof(g_dl_dtype));
  g_launch = (fn_cuLaunchKernelEx)(uintptr_t)launch_addr;
  Py_RETURN_NONE;
}

/* new_table(params): params = [(kind, specialize, align, dtype_codes: tuple[int] | None, candidates: tuple | None)] */
static PyObject *fast_new_table(PyObject *self, PyObject *arg) {
  Py_ssize_t n = PySequence_Size(arg);
  if (n < 0)
    return NULL;
  if (n > NJ_MAX_PARAMS) {
    PyErr_SetString(PyExc_ValueError, "too many parameters for the fast path");
    return NULL;
  }
  Table *t = (Table *)PyMem_Calloc(1, sizeof(Table));
  t->nparams = (int)n;
  t->params = (Param *)PyMem_Calloc(n ? (size_t)n : 1, sizeof(Param));
  PyObject *capsule = PyCapsule_New(t, "nojit.fast.table", table_free);
  if (!capsule) {
    PyMem_Free(t->params);
    PyMem_Free(t);
    return NULL;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *item = PySequence_GetItem(arg, i);
    PyObject *codes, *cands;
    Param *p = &t->params[i];
    int ok = item && PyArg_ParseTuple(item, "iiiOO", &p->kind, &p->specialize, &p->align, &codes, &cands);
    if (ok && codes != Py_None) {
      for (int d = 0; d < g_ndtypes && ok; d++) {
        PyObject *c = PySequence_GetItem(codes, d);
        ok = c != NULL;
        if (ok)
          p->dtype_code[d] = (uint16_t)PyLong_AsLong(c);
        Py_XDECREF(c);
      }
    }
    if (ok && cands != Py_None) {
      Py_ssize_t nc = PySequence_Size(cands);
      p->cand = (PyObject **)PyMem_Calloc(nc ? (size_t)nc : 1, sizeof(PyObject *));
      for (Py_ssize_t c = 0; c < nc; c++)
        p->cand[c] = PySequence_GetItem(cands, c);
      p->ncand = (int)nc;
    }
    Py_XDECREF(item);
    if (!ok || PyErr_Occurred()) {
      Py_DECREF(capsule);
      return NULL;
    }
  }
  return capsule;
}

static void table_insert_slot(Table *t, int idx) {
  int mask = t->nslots - 1;
  int s = (int)(t->entries[idx].hash & (uint64_t)mask);
  while (t->slots[s] >= 0)
    s = (s + 1) & mask;
  t->slots[s] = idx;
}

/* add_entry(table, codes, variant, arg_indices, arg_codes: bytes, grid_mult, block_x, shared, cx, cy, cz, pdl, coop) */
static PyObject *fast_add_entry(PyObject *self, PyObject *args) {
  PyObject *capsule, *codes, *variant, *arg_indices;
  const char *arg_codes;
  Py_ssize_t ncodes_len;
  unsigned int grid_mult, block_x, shared, cx, cy, cz;
  int pdl, coop;
  if (!PyArg_ParseTuple(args, "OOOOs#IIIIIIii", &capsule, &codes, &variant, &arg_indices, &arg_codes, &ncodes_len,
                        &grid_mult, &block_x, &shared, &cx, &cy, &cz, &pdl, &coop))
    return NULL;
  Table *t = get_table(capsule);
  if (!t)
    return NULL;
  if (PySequence_Size(codes) != t->nparams || PySequence_Size(arg_indices) != ncodes_len ||
      ncodes_len + 2 > NJ_MAX_PARAMS) {
    PyErr_SetString(PyExc_ValueError, "add_entry: codes or arguments do not match the table");
    return NULL;
  }
  if (t->nentries == t->capacity) {
    int cap = t->capacity ? 2 * t->capacity : 8;
    Entry *grown = (Entry *)PyMem_Realloc(t->entries, (size_t)cap * sizeof(Entry));
    if (!grown)
      return PyErr_NoMemory();
    t->entries = grown;
    t->capacity = cap;
  }
  Entry *e = &t->entries[t->nentries];
  memset(e, 0, sizeof(Entry));
  e->codes = (uint32_t *)PyMem_Calloc(t->nparams ? (size_t)t->nparams : 1, sizeof(uint32_t));
  for (int i = 0; i < t->nparams; i++) {
    PyObject *c = PySequence_GetItem(codes, i);
    e->codes[i] = (uint32_t)PyLong_AsUnsignedLong(c);
    Py_XDECREF(c);
  }
  e->nargs = (int)ncodes_len;
  e->arg_index = (uint8_t *)PyMem_Calloc((size_t)ncodes_len + 1, 1);
  e->arg_code = (char *)PyMem_Calloc((size_t)ncodes_len + 1, 1);
  memcpy(e->arg_code, arg_codes, (size_t)ncodes_len);
  for (Py_ssize_t i = 0; i < ncodes_len; i++) {
    PyObject *c = PySequence_GetItem(arg_indices, i);
    long v = PyLong_AsLong(c);
    Py_XDECREF(c);
    if (v < 0 || v >= t->nparams) {
      PyErr_SetString(PyExc_ValueError, "add_entry: argument index out of range");
    }
    e->arg_index[i] = (uint8_t)v;
  }
  if (PyErr_Occurred()) {
    PyMem_Free(e->codes);
    PyMem_Free(e->arg_index);
    PyMem_Free(e->arg_code);
    return NULL;
  }
  e->hash = hash_codes(e->codes, t->nparams);
  Py_INCREF(variant);
  e->variant = variant;
  e->grid_mult = grid_mult;
  e->block_x = block_x;
  e->shared = shared;
  e->cx = cx;
  e->cy = cy;
  e->cz = cz;
  e->pdl = pdl;
  e->coop = coop;
  int idx = t->nentries++;
  if (2 * t->nentries > t->nslots) {
    int ns = t->nslots ? 2 * t->nslots : 16;
    while (2 * t->nentries > ns)
      ns *= 2;
    PyMem_Free(t->slots);
    t->slots = (int *)PyMem_Malloc((size_t)ns * sizeof(int));
    t->nslots = ns;
    for (int s = 0; s < ns; s++)
      t->slots[s] = -1;
    for (int i = 0; i < t->nentries; i++)
      table_insert_slot(t, i);
  } else {
    table_insert_slot(t, idx);
  }
  return PyLong_FromLong(idx);
}

/* set_function(table, entry, device, CUfunction) */
static PyObject *fast_set_function(PyObject *self, PyObject *args) {
  PyObject *capsule;
  int idx, device;
  unsigned long long function;
  if (!PyArg_ParseTuple(args, "OiiK", &capsule, &idx, &device, &function))
    return NULL;
  Table *t = get_table(capsule);
  if (!t)
    return NULL;
  if (idx < 0 || idx >= t->nentries || device < 0 || device >= NJ_MAX_DEVICES) {
    PyErr_SetString(PyExc_ValueError, "set_function: entry or device out of range");
    return NULL;
  }
  t->entries[idx].function[device] = function;
  Py_RETURN_NONE;
}

/* Code of an int value for a plain parameter; -1: not representable (a miss). */
static int int_code(const Param *p, PyObject *v, Value *out) {
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  int width;
  if (overflow == 0) {
    if (x == -1 && PyErr_Occurred()) {
      PyErr_Clear();
      return -1;
    }
    out->raw = (uint64_t)x;
    if (p->specialize && x == 1)
      return C_ONE;
    width = (x >= INT32_MIN && x <= INT32_MAX) ? 1 : 2;
  } else if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(v);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_Clear();
      return -1;
    }
    out->raw = (uint64_t)u;
    out->is_float = 2;
    width = 3;
  } else {
    return -1;
  }
  int attr = !p->specialize ? 0 : (p->align && !(out->raw & 15)) ? 1 : 2;
  return C_INT + 4 * width + attr;
}

static int tensor_code(const Param *p, PyObject *v, Value *out) {
  int d;
  unsigned long long u;
  NjDLTensor dl;
  if (nj_dl_read(v, &dl) == 0 && (d = nj_dl_dtype_index(dl.dtype)) != -1) {
    u = (unsigned long long)((uintptr_t)dl.data + dl.byte_offset); /* = data_ptr() */
    out->dev_type = dl.device.device_type;
    out->dev_id = dl.device.device_id;
    if (d == -2 && (d = nj_torch_dtype_index(v)) < 0) /* int8 or int1..int7: torch says which */
      return -1;
  } else { /* no API, or a dtype DLPack has no code for: torch's accessors */
    if ((d = nj_torch_dtype_index(v)) < 0)
      return -1;
    PyObject *ptr = PyObject_CallMethodObjArgs(v, g_s_data_ptr, NULL);
    if (!ptr) {
      PyErr_Clear();
      return -1;
    }
    u = PyLong_AsUnsignedLongLong(ptr);
    Py_DECREF(ptr);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_Clear();
      return -1;
    }
  }
  out->raw = (uint64_t)u;
  int attr = !p->specialize ? 0 : (p->align && !(u & 15)) ? 1 : 2;
  return C_TENSOR + 4 * p->dtype_code[d] + attr;
}

/* The plain code of run-time value v (see the header comment); -1 for a miss. */
static int plain_code(const Param *p, PyObject *v, Value *out) {
  out->is_float = 0;
  out->raw = 0;
  out->dev_type = out->dev_id = 0;
  if (v == Py_None)
    return C_NONE;
  if (v == Py_True || v == Py_False) {
    out->raw = v == Py_True;
    return C_BOOL;
  }
  PyTypeObject *tp = Py_TYPE(v);
  if (tp == &PyLong_Type)
    return int_code(p, v, out);
  if (tp == &PyFloat_Type) {
    double d = PyFloat_AsDouble(v);
    memcpy(&out->raw, &d, 8);
    out->is_float = 1;
    return C_FLOAT;
  }
  if (g_tensor_type && ((PyObject *)tp == g_tensor_type || PyType_IsSubtype(tp, (PyTypeObject *)g_tensor_type)))
    return tensor_code(p, v, out);
  return -1;
}

static int annotated_code(int plain) {
  if (plain == C_ONE)
    return C_ANNOT + 3;
  if (plain == C_NONE)
    return C_ANNOT + 4;
  if (plain == C_BOOL || plain == C_FLOAT)
    return C_ANNOT + 0;
  return C_ANNOT + (plain & 3); /* ints and tensors: their attr */
}

/* Codes of every parameter (bound[i], borrowed) and the run-time values; returns 0, or -1 for a miss. */
static int classify_array(const Table *t, PyObject *const *bound, uint32_t *codes, Value *values) {
  for (int i = 0; i < t->nparams; i++) {
    const Param *p = &t->params[i];
    PyObject *v = bound[i];
    if (p->kind == K_CONSTEXPR) {
      int c = 0;
      for (; c < p->ncand; c++) {
        PyObject *k = p->cand[c];
        if (k == v)
          break;
        if (Py_TYPE(k) == Py_TYPE(v)) {
          int eq = PyObject_RichCompareBool(v, k, Py_EQ);
          if (eq < 0) {
            PyErr_Clear();
            return -1;
          }
          if (eq)
            break;
        }
      }
      if (c == p->ncand)
        return -1;
      codes[i] = 1 + (uint32_t)c;
      values[i].raw = 0;
      values[i].is_float = 0;
      values[i].dev_type = values[i].dev_id = 0;
      continue;
    }
    int code = plain_code(p, v, &values[i]);
    if (code < 0)
      return -1;
    if (p->kind == K_ANNOT)
      code = annotated_code(code);
    else if (p->kind == K_FIXED)
      code = C_FIXED;
    codes[i] = (uint32_t)code;
  }
  return 0;
}

/* The same for a bound tuple (the Python side's form). */
static int classify(const Table *t, PyObject *bound, uint32_t *codes, Value *values) {
  if (!PyTuple_Check(bound) || PyTuple_Size(bound) != t->nparams)
    return -1;
  PyObject *items[NJ_MAX_PARAMS];
  for (int i = 0; i < t->nparams; i++)
    items[i] = PyTuple_GetItem(bound, i);
  return classify_array(t, items, codes, values);
}

static int find_entry(const Table *t, const uint32_t *codes) {
  if (!t->nslots)
    return -1;
  uint64_t h = hash_codes(codes, t->nparams);
  int mask = t->nslots - 1;
  for (int s = (int)(h & (uint64_t)mask);; s = (s + 1) & mask) {
    int idx = t->slots[s];
    if (idx < 0)
      return -1;
    const Entry *e = &t->entries[idx];
    if (e->hash == h && memcmp(e->codes, codes, (size_t)t->nparams * sizeof(uint32_t)) == 0)
      return idx;
  }
}

/* Python's int(d) & (2**64 - 1) for a finite double (the Python packer's rule for a float in an int slot). */
static uint64_t float_to_int_bits(double d) {
  double a = fabs(d);
  if (a < 9223372036854775808.0)
    return (uint64_t)(int64_t)d;
  int e;
  double m = frexp(a, &e); /* a = m * 2^e, m in [0.5, 1): a is an integer, m * 2^53 exactly */
  int shift = e - 53;
  uint64_t r = shift >= 64 ? 0 : ((uint64_t)ldexp(m, 53)) << shift;
  return d < 0 ? ~r + 1 : r;
}

/* One parameter's bytes into an 8-byte slot, by the cubin's type code; -1 where Python's packer
 * would raise (a non-finite float in an integer slot): the Python path then reports it. */
static int pack_one(char code, const Value *v, uint64_t *slot) {
  double d;
  uint64_t i;
  if (v->is_float == 1) {
    memcpy(&d, &v->raw, 8);
    int int_slot = code != 'f' && code != 'd' && code != 'e' && code != 'b';
    if (int_slot && !isfinite(d))
      return -1;
    i = int_slot ? float_to_int_bits(d) : 0;
  } else {
    d = v->is_float == 2 ? (double)v->raw : (double)(int64_t)v->raw;
    i = v->raw;
  }
  *slot = 0;
  switch (code) {
  case 'i':
  case 'u': {
    uint32_t x = (uint32_t)i;
    memcpy(slot, &x, 4);
    break;
  }
  case 'h':
  case 'H': {
    uint16_t x = (uint16_t)i;
    memcpy(slot, &x, 2);
    break;
  }
  case 'c': {
    uint8_t x = (uint8_t)i;
    memcpy(slot, &x, 1);
    break;
  }
  case 'f': {
    float f = (float)d;
    memcpy(slot, &f, 4);
    break;
  }
  case 'd':
    memcpy(slot, &d, 8);
    break;
  case 'e': {
    uint16_t x = to_fp16(d);
    memcpy(slot, &x, 2);
    break;
  }
  case 'b': {
    uint16_t x = to_bf16(d);
    memcpy(slot, &x, 2);
    break;
  }
  default: /* 'p', 'l', 'L' */
    *slot = i;
  }
  return 0;
}

static int parse_grid(PyObject *grid, uint32_t g[3]) {
  g[0] = g[1] = g[2] = 1;
  if (!PyTuple_Check(grid))
    return -1;
  Py_ssize_t n = PyTuple_Size(grid);
  if (n < 1 || n > 3)
    return -1;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *x = PyTuple_GetItem(grid, i);
    if (Py_TYPE(x) != &PyLong_Type)
      return -1;
    long v = PyLong_AsLong(x);
    if (v < 0 || v > 0xFFFFFFFFL) {
      PyErr_Clear();
      return -1;
    }
    g[i] = (uint32_t)v;
  }
  return 0;
}

/* Packed parameters and launch configuration of entry e for one call; -1 where C declines to pack. */
static int prepare(const Entry *e, const Value *values, const uint32_t g[3], unsigned long long stream, uint64_t *slots,
                   void **params, NjLaunchAttribute *attrs, NjLaunchConfig *cfg) {
  int n = e->nargs;
  for (int a = 0; a < n; a++) {
    if (pack_one(e->arg_code[a], &values[e->arg_index[a]], &slots[a]))
      return -1;
    params[a] = &slots[a];
  }
  slots[n] = slots[n + 1] = 0; /* Triton's global and profile scratch pointers: unused by these entries */
  params[n] = &slots[n];
  params[n + 1] = &slots[n + 1];
  const uint32_t grid[3] = {g[0] * e->grid_mult, g[1], g[2]}, block[3] = {e->block_x, 1, 1};
  const uint32_t cluster[3] = {e->cx, e->cy, e->cz};
  nj_launch_config(cfg, attrs, grid, block, e->shared, stream, cluster, e->pdl, e->coop);
  return 0;
}

/*
 * launch(table, bound, grid, device, stream) ->
 *   the entry's variant object: launched (or the grid was empty);
 *   None: a miss (not recognised here: take the Python path);
 *   int >= 0: entry that needs its module loaded on `device` (set_function, then call again);
 *   int < 0: the driver refused the launch (-CUresult).
 */
static PyObject *fast_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "launch(table, bound, grid, device, stream)");
    return NULL;
  }
  Table *t = get_table(args[0]);
  if (!t)
    return NULL;
  uint32_t codes[NJ_MAX_PARAMS];
  Value values[NJ_MAX_PARAMS];
  uint32_t g[3];
  if (parse_grid(args[2], g) || classify(t, args[1], codes, values))
    Py_RETURN_NONE;
  int idx = find_entry(t, codes);
  if (idx < 0)
    Py_RETURN_NONE;
  Entry *e = &t->entries[idx];
  long device = PyLong_AsLong(args[3]);
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[4]);
  if (PyErr_Occurred())
    return NULL;
  if (device < 0 || device >= NJ_MAX_DEVICES || devices_ok(t, values, device))
    Py_RETURN_NONE;
  uint64_t function = e->function[device];
  if (!function || !g_launch)
    return PyLong_FromLong(idx);
  if (g[0] && g[1] && g[2]) {
    uint64_t slots[NJ_MAX_PARAMS];
    void *params[NJ_MAX_PARAMS];
    NjLaunchAttribute attrs[NJ_MAX_LAUNCH_ATTRS];
    NjLaunchConfig cfg;
    if (prepare(e, values, g, stream, slots, params, attrs, &cfg))
      Py_RETURN_NONE;
    NjResult r = g_launch(&cfg, (NjFunction)(uintptr_t)function, params, NULL);
    if (r)
      return PyLong_FromLong(-(long)r);
  }
  Py_INCREF(e->variant);
  return e->variant;
}

/* One call as the table-reading entry points (lookup, pack, floor) see it: its table, codes and values. */
typedef struct {
  Table *t;
  uint32_t codes[NJ_MAX_PARAMS];
  Value values[NJ_MAX_PARAMS];
} TableCall;

/* Their one prologue: the table from its capsule, then the bound arguments classified against it.
 * -1: not a table (exception set); 1: the table, but a call C does not classify (values unset); 0: both. */
static int read_call(PyObject *capsule, PyObject *bound, TableCall *c) {
  c->t = get_table(capsule);
  if (!c->t)
    return -1;
  return classify(c->t, bound, c->codes, c->values) ? 1 : 0;
}

/* lookup(table, bound) -> (entry index or -1, codes tuple or None): for tests and diagnostics. */
static PyObject *fast_lookup(PyObject *self, PyObject *args) {
  PyObject *capsule, *bound;
  if (!PyArg_ParseTuple(args, "OO", &capsule, &bound))
    return NULL;
  TableCall c;
  int rc = read_call(capsule, bound, &c);
  if (rc < 0)
    return NULL;
  if (rc)
    return Py_BuildValue("(iO)", -1, Py_None);
  PyObject *out = PyTuple_New(c.t->nparams);
  for (int i = 0; i < c.t->nparams; i++)
    PyTuple_SetItem(out, i, PyLong_FromUnsignedLong(c.codes[i]));
  PyObject *res = Py_BuildValue("(iN)", find_entry(c.t, c.codes), out);
  return res;
}

/* pack(table, entry, bound) -> bytes: the parameter slots (8 bytes each) the launch would hand the driver. */
static PyObject *fast_pack(PyObject *self, PyObject *args) {
  PyObject *capsule, *bound;
  int idx;
  if (!PyArg_ParseTuple(args, "OiO", &capsule, &idx, &bound))
    return NULL;
  TableCall c;
  int rc = read_call(capsule, bound, &c);
  if (rc < 0)
    return NULL;
  if (idx < 0 || idx >= c.t->nentries) {
    PyErr_SetString(PyExc_ValueError, "pack: no such entry");
    return NULL;
  }
  if (rc)
    Py_RETURN_NONE;
  Entry *e = &c.t->entries[idx];
  uint64_t slots[NJ_MAX_PARAMS];
  for (int a = 0; a < e->nargs; a++)
    if (pack_one(e->arg_code[a], &c.values[e->arg_index[a]], &slots[a]))
      Py_RETURN_NONE;
  return PyBytes_FromStringAndSize((const char *)slots, (Py_ssize_t)e->nargs * 8);
}


/* floor(table, bound, grid, device, stream, iterations) -> ns per cuLaunchKernelEx, called in a C loop with the
 * parameters packed once: the driver's own cost, the floor any launcher adds to (bench/bench_fastpath.py). */
static PyObject *fast_floor(PyObject *self, PyObject *args) {
  PyObject *capsule, *bound, *grid;
  int device, iterations;
  unsigned long long stream;
  if (!PyArg_ParseTuple(args, "OOOiKi", &capsule, &bound, &grid, &device, &stream, &iterations))
    return NULL;
  TableCall c;
  int rc = read_call(capsule, bound, &c);
  if (rc < 0)
    return NULL;
  uint32_t g[3];
  int idx;
  if (rc || parse_grid(grid, g) || (idx = find_entry(c.t, c.codes)) < 0 || device < 0 || device >= NJ_MAX_DEVICES ||
      !c.t->entries[idx].function[device] || !g_launch) {
    PyErr_SetString(PyExc_ValueError, "floor: the call is not a loaded exact entry of this table");
    return NULL;
  }
  const Entry *e = &c.t->entries[idx];
  uint64_t slots[NJ_MAX_PARAMS];
  void *params[NJ_MAX_PARAMS];
  NjLaunchAttribute attrs[NJ_MAX_LAUNCH_ATTRS];
  NjLaunchConfig cfg;
  if (prepare(e, c.values, g, stream, slots, params, attrs, &cfg)) {
    PyErr_SetString(PyExc_ValueError, "floor: arguments cannot be packed");
    return NULL;
  }
  NjFunction f = (NjFunction)(uintptr_t)e->function[device];
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < iterations; i++) {
    NjResult r = g_launch(&cfg, f, params, NULL);
    if (r) {
      PyErr_Format(PyExc_RuntimeError, "cuLaunchKernelEx failed (CUresult %d)", (int)r);
      return NULL;
    }
  }
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ns = (double)(t1.tv_sec - t0.tv_sec) * 1e9 + (double)(t1.tv_nsec - t0.tv_nsec);
  return PyFloat_FromDouble(iterations > 0 ? ns / iterations : 0.0);
}

/* ------------------------------------------------------------------------------------------------
 * The per-kernel runner: `fn.run` itself. Triton's kernel[grid](...) calls
 * run(*args, grid=grid, warmup=False, **kwargs); this binds the kernel's parameters from the
 * positional and keyword arguments (defaults filled in), picks the table of the call's launch
 * options, computes the grid (calling a grid callable with {name: value}), reads torch's device
 * and stream through the callables it was given, and launches an exact entry, all in this one C
 * call. Whatever it does not handle goes, with the call exactly as it came, to Python:
 *   general  anything about the call's shape (warmup, unknown options, a non-tuple grid, a missing
 *            or repeated argument, no device): the generated Python run (loader/runtimes/triton/fast.py);
 *   slow     a call whose key is not an exact entry of the table: TritonKernelServer.run, the one
 *            definition of the key, which serves generic entries and applies the policy to misses;
 *   after    an exact entry whose module is not loaded on this device yet, or a driver error.
 */
#define NJ_MAX_OPTIONS 8
#define NJ_OPTION_CACHE 16

typedef struct {
  int n;
  PyObject *names[NJ_MAX_OPTIONS];
  PyObject *values[NJ_MAX_OPTIONS];
  PyObject *table; /* capsule, or Py_None: these options have no exact entries */
} OptionSet;

typedef struct {
  int nparams;
  PyObject **names;    /* interned parameter names */
  PyObject **defaults; /* NULL: required */
  PyObject *table0;    /* capsule of the table without options, or Py_None */
  PyObject *get_device, *get_stream, *general, *slow, *after, *tables_by_raw;
  PyObject *device_args[NJ_MAX_DEVICES]; /* (device,) tuples for get_stream */
  int noptions;
  OptionSet options[NJ_OPTION_CACHE];
} Runner;

static PyObject *g_s_grid, *g_s_warmup;

static void runner_free(PyObject *capsule) {
  Runner *r = (Runner *)PyCapsule_GetPointer(capsule, "nojit.fast.runner");
  if (!r)
    return;
  for (int i = 0; i < r->nparams; i++) {
    Py_XDECREF(r->names[i]);
    Py_XDECREF(r->defaults[i]);
  }
  for (int d = 0; d < NJ_MAX_DEVICES; d++)
    Py_XDECREF(r->device_args[d]);
  for (int o = 0; o < r->noptions; o++) {
    for (int k = 0; k < r->options[o].n; k++) {
      Py_XDECREF(r->options[o].names[k]);
      Py_XDECREF(r->options[o].values[k]);
    }
    Py_XDECREF(r->options[o].table);
  }
  Py_XDECREF(r->table0);
  Py_XDECREF(r->get_device);
  Py_XDECREF(r->get_stream);
  Py_XDECREF(r->general);
  Py_XDECREF(r->slow);
  Py_XDECREF(r->after);
  Py_XDECREF(r->tables_by_raw);
  PyMem_Free(r->names);
  PyMem_Free(r->defaults);
  PyMem_Free(r);
}

/* One call, bound. */
typedef struct {
  PyObject *bound[NJ_MAX_PARAMS]; /* borrowed */
  PyObject *grid;
  int noptions;
  PyObject *option_names[NJ_MAX_OPTIONS], *option_values[NJ_MAX_OPTIONS];
  PyObject *table; /* borrowed capsule */
} Call;

static int same_name(PyObject *a, PyObject *b) {
  if (a == b)
    return 1;
  return PyUnicode_Check(a) && PyUnicode_Compare(a, b) == 0;
}

/* The table of this call's options (borrowed; NULL: not known here, or none). */
static PyObject *options_table(Runner *r, Call *c) {
  for (int o = 0; o < r->noptions; o++) {
    OptionSet *s = &r->options[o];
    if (s->n != c->noptions)
      continue;
    int k = 0;
    for (; k < s->n; k++) {
      if (s->names[k] != c->option_names[k] && !same_name(s->names[k], c->option_names[k]))
        break;
      PyObject *a = s->values[k], *b = c->option_values[k];
      if (a != b) {
        if (Py_TYPE(a) != Py_TYPE(b))
          break;
        int eq = PyObject_RichCompareBool(a, b, Py_EQ);
        if (eq <= 0) {
          PyErr_Clear();
          break;
        }
      }
    }
    if (k == s->n)
      return s->table == Py_None ? NULL : s->table;
  }
  /* Not cached: ask the Python side's dict (raw options items -> table), filled by the general path. */
  PyObject *items = PyTuple_New(c->noptions);
  if (!items)
    goto fail;
  for (int k = 0; k < c->noptions; k++) {
    PyObject *pair = PyTuple_Pack(2, c->option_names[k], c->option_values[k]);
    if (!pair) {
      Py_DECREF(items);
      goto fail;
    }
    PyTuple_SetItem(items, k, pair);
  }
  PyObject *table = PyDict_GetItemWithError(r->tables_by_raw, items); /* borrowed */
  Py_DECREF(items);
  if (!table)
    goto fail;
  if (r->noptions < NJ_OPTION_CACHE) {
    OptionSet *s = &r->options[r->noptions++];
    s->n = c->noptions;
    for (int k = 0; k < c->noptions; k++) {
      Py_INCREF(c->option_names[k]);
      Py_INCREF(c->option_values[k]);
      s->names[k] = c->option_names[k];
      s->values[k] = c->option_values[k];
    }
    Py_INCREF(table);
    s->table = table;
  }
  return table == Py_None ? NULL : table;
fail:
  PyErr_Clear(); /* unhashable values, or not seen yet: the general path decides */
  return NULL;
}

/* Bind a call as Triton passes it; 0: bound, with a table; 1: hand it to the general path. */
/* bgrid: the grid of kernel[grid] (bound-grid calls, which pass neither grid nor warmup), else NULL.
 * 2: a bound-grid call that names grid or warmup itself (Triton's lambda raises the TypeError). */
static int bind_call(Runner *r, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, Call *c,
                     PyObject *bgrid) {
  int n = r->nparams;
  if (nargs > n)
    return 1;
  for (int i = 0; i < n; i++)
    c->bound[i] = i < nargs ? args[i] : NULL;
  c->grid = bgrid;
  c->noptions = 0;
  PyObject *warmup = bgrid ? Py_False : NULL;
  Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
  for (Py_ssize_t k = 0; k < nkw; k++) {
    PyObject *name = PyTuple_GetItem(kwnames, k);
    PyObject *v = args[nargs + k];
    if (name == g_s_grid || name == g_s_warmup) {
      if (bgrid)
        return 2;
      if (name == g_s_grid)
        c->grid = v;
      else
        warmup = v;
      continue;
    }
    int j = 0;
    while (j < n && r->names[j] != name)
      j++;
    if (j == n) { /* not interned alike: compare the text */
      if (same_name(name, g_s_grid) || same_name(name, g_s_warmup)) {
        if (bgrid)
          return 2;
        if (same_name(name, g_s_grid))
          c->grid = v;
        else
          warmup = v;
        continue;
      }
      j = 0;
      while (j < n && !same_name(r->names[j], name))
        j++;
    }
    if (j < n) {
      if (c->bound[j])
        return 1; /* given twice: Python raises the TypeError */
      c->bound[j] = v;
    } else {
      if (c->noptions == NJ_MAX_OPTIONS)
        return 1;
      c->option_names[c->noptions] = name;
      c->option_values[c->noptions++] = v;
    }
  }
  if (!c->grid || warmup != Py_False)
    return 1;
  for (int i = 0; i < n; i++) {
    if (!c->bound[i]) {
      if (!r->defaults[i])
        return 1; /* missing: Python raises the TypeError */
      c->bound[i] = r->defaults[i];
    }
  }
  c->table = c->noptions ? options_table(r, c) : (r->table0 == Py_None ? NULL : r->table0);
  return c->table == NULL;
}

/* The call exactly as it came, handed to a Python callable (bgrid: with grid=bgrid, warmup=False added, as
 * Triton's lambda adds them). */
static PyObject *forward(PyObject *target, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                         PyObject *bgrid) {
  PyObject *pos = PyTuple_New(nargs);
  if (!pos)
    return NULL;
  for (Py_ssize_t i = 0; i < nargs; i++) {
    Py_INCREF(args[i]);
    PyTuple_SetItem(pos, i, args[i]);
  }
  PyObject *kw = NULL;
  Py_ssize_t nkw = kwnames ? PyTuple_Size(kwnames) : 0;
  if (nkw || bgrid) {
    kw = PyDict_New();
    if (kw && bgrid && (PyDict_SetItem(kw, g_s_grid, bgrid) < 0 || PyDict_SetItem(kw, g_s_warmup, Py_False) < 0))
      Py_CLEAR(kw);
    for (Py_ssize_t k = 0; kw && k < nkw; k++) {
      if (PyDict_SetItem(kw, PyTuple_GetItem(kwnames, k), args[nargs + k]) < 0)
        Py_CLEAR(kw);
    }
    if (!kw) {
      Py_DECREF(pos);
      return NULL;
    }
  }
  PyObject *res = PyObject_Call(target, pos, kw);
  Py_DECREF(pos);
  Py_XDECREF(kw);
  return res;
}

static PyObject *bound_tuple(int n, PyObject *const *bound) {
  PyObject *t = PyTuple_New(n);
  for (int i = 0; t && i < n; i++) {
    Py_INCREF(bound[i]);
    PyTuple_SetItem(t, i, bound[i]);
  }
  return t;
}

/* The grid as a tuple (new reference); NULL without an error: not one C takes (the general path). */
static PyObject *call_grid(Runner *r, Call *c) {
  PyObject *grid = c->grid;
  if (PyTuple_Check(grid)) {
    Py_INCREF(grid);
    return grid;
  }
  if (!PyCallable_Check(grid))
    return NULL;
  PyObject *meta = PyDict_New();
  for (int i = 0; meta && i < r->nparams; i++)
    if (PyDict_SetItem(meta, r->names[i], c->bound[i]) < 0)
      Py_CLEAR(meta);
  if (!meta)
    return NULL;
  PyObject *g = PyObject_CallFunctionObjArgs(grid, meta, NULL);
  Py_DECREF(meta);
  if (g && !PyTuple_Check(g))
    Py_CLEAR(g);
  return g;
}

static PyObject *runner_launch(Runner *r, Call *cp, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                               PyObject *bgrid);

static PyObject *runner_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  Runner *r = (Runner *)PyCapsule_GetPointer(self, "nojit.fast.runner");
  if (!r)
    return NULL;
  Call c;
  if (bind_call(r, args, nargs, kwnames, &c, NULL))
    return forward(r->general, args, nargs, kwnames, NULL);
  return runner_launch(r, &c, args, nargs, kwnames, NULL);
}

/* A bound call, launched (or handed to Python: bgrid as in forward). */
static PyObject *runner_launch(Runner *r, Call *cp, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                               PyObject *bgrid) {
  PyObject *grid = call_grid(r, cp);
  if (!grid) {
    if (PyErr_Occurred())
      return NULL; /* the grid callable raised: as it would on the Python path */
    return forward(r->general, args, nargs, kwnames, bgrid);
  }
  uint32_t g[3];
  if (parse_grid(grid, g)) {
    PyErr_Clear();
    Py_DECREF(grid);
    return forward(r->general, args, nargs, kwnames, bgrid);
  }
  PyObject *devobj = PyObject_CallNoArgs(r->get_device);
  long device = devobj ? PyLong_AsLong(devobj) : -1;
  PyObject *stream_obj = NULL;
  unsigned long long stream = 0;
  int have_stream = 0;
  if (devobj && !PyErr_Occurred() && device >= 0 && device < NJ_MAX_DEVICES) {
    void *s = NULL;
    if (g_dl_on && g_dl_stream && r->get_stream == g_dl_stream_accessor) {
      /* torch's current stream through DLPack: the stream torch.cuda.current_stream() names (the capture
       * stream while a graph is captured); where it fails, torch's accessor below says why */
      if (g_dl_stream(NJ_DL_CUDA, (int32_t)device, &s) == 0) {
        stream = (unsigned long long)(uintptr_t)s;
        have_stream = 1;
      } else {
        PyErr_Clear();
      }
    }
    if (!have_stream) {
      if (!r->device_args[device])
        r->device_args[device] = PyTuple_Pack(1, devobj);
      if (r->device_args[device])
        stream_obj = PyObject_Call(r->get_stream, r->device_args[device], NULL);
      stream = stream_obj ? PyLong_AsUnsignedLongLong(stream_obj) : 0;
      have_stream = stream_obj != NULL;
    }
  }
  Py_XDECREF(devobj);
  Py_XDECREF(stream_obj);
  if (!have_stream || PyErr_Occurred()) {
    Py_DECREF(grid);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_RuntimeError))
      return NULL;
    PyErr_Clear(); /* no driver / no GPU: the general path raises nojit's LaunchError */
    return forward(r->general, args, nargs, kwnames, bgrid);
  }
  Table *t = get_table(cp->table);
  uint32_t codes[NJ_MAX_PARAMS];
  Value values[NJ_MAX_PARAMS];
  int idx = -1;
  if (classify_array(t, cp->bound, codes, values) == 0 && devices_ok(t, values, device) == 0)
    idx = find_entry(t, codes);
  if (idx < 0) {
    Py_DECREF(grid);
    return forward(r->slow, args, nargs, kwnames, bgrid);
  }
  Entry *e = &t->entries[idx];
  uint64_t function = e->function[device];
  long status = idx; /* >= 0: load the module; < 0: the driver's error */
  if (function && g_launch) {
    if (g[0] && g[1] && g[2]) {
      uint64_t slots[NJ_MAX_PARAMS];
      void *params[NJ_MAX_PARAMS];
      NjLaunchAttribute attrs[NJ_MAX_LAUNCH_ATTRS];
      NjLaunchConfig cfg;
      if (prepare(e, values, g, stream, slots, params, attrs, &cfg)) {
        Py_DECREF(grid);
        return forward(r->slow, args, nargs, kwnames, bgrid);
      }
      NjResult rc = g_launch(&cfg, (NjFunction)(uintptr_t)function, params, NULL);
      if (rc)
        status = -(long)rc;
      else
        status = INT32_MAX;
    } else {
      status = INT32_MAX;
    }
  }
  if (status == INT32_MAX) {
    Py_DECREF(grid);
    Py_INCREF(e->variant);
    return e->variant;
  }
  PyObject *bound = bound_tuple(r->nparams, cp->bound);
  PyObject *options = PyDict_New();
  for (int k = 0; options && k < cp->noptions; k++)
    if (PyDict_SetItem(options, cp->option_names[k], cp->option_values[k]) < 0)
      Py_CLEAR(options);
  PyObject *res = NULL;
  if (bound && options)
    res = PyObject_CallFunction(r->after, "lOOOlO", status, cp->table, bound, grid, device, options);
  Py_XDECREF(bound);
  Py_XDECREF(options);
  Py_DECREF(grid);
  return res;
}

/* runner_reads_stream_through_dlpack(runner capsule) -> whether its launches read torch's current stream through
 * the DLPack exchange API (its get_stream is torch's accessor and the API is on) or through get_stream. */
static PyObject *fast_runner_dl_stream(PyObject *self, PyObject *capsule) {
  Runner *r = (Runner *)PyCapsule_GetPointer(capsule, "nojit.fast.runner");
  if (!r)
    return NULL;
  return PyBool_FromLong(g_dl_on && g_dl_stream && r->get_stream == g_dl_stream_accessor);
}

static PyMethodDef runner_def = {"run", (PyCFunction)(void (*)(void))runner_call, METH_FASTCALL | METH_KEYWORDS,
                                 "run(*args, grid, warmup, **kwargs): nojit's one-call launch of this kernel"};

/* new_runner(table0, names, defaults, missing, get_device, get_stream, general, slow, after, tables_by_raw)
 *   -> (runner capsule, run callable). defaults[i] is `missing` where parameter i has no default. */
static PyObject *fast_new_runner(PyObject *self, PyObject *args) {
  PyObject *table0, *names, *defaults, *missing, *get_device, *get_stream, *general, *slow, *after, *tables_by_raw;
  if (!PyArg_ParseTuple(args, "OOOOOOOOOO", &table0, &names, &defaults, &missing, &get_device, &get_stream, &general,
                        &slow, &after, &tables_by_raw))
    return NULL;
  Py_ssize_t n = PySequence_Size(names);
  if (n < 0)
    return NULL;
  if (n > NJ_MAX_PARAMS || PySequence_Size(defaults) != n || !PyDict_Check(tables_by_raw) ||
      (table0 != Py_None && !get_table(table0))) {
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "new_runner: names, defaults or tables do not fit");
    return NULL;
  }
  Runner *r = (Runner *)PyMem_Calloc(1, sizeof(Runner));
  if (!r)
    return PyErr_NoMemory();
  r->names = (PyObject **)PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *));
  r->defaults = (PyObject **)PyMem_Calloc(n ? (size_t)n : 1, sizeof(PyObject *));
  PyObject *capsule = PyCapsule_New(r, "nojit.fast.runner", runner_free);
  if (!capsule) {
    PyMem_Free(r->names);
    PyMem_Free(r->defaults);
    PyMem_Free(r);
    return NULL;
  }
  r->nparams = (int)n;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *name = PySequence_GetItem(names, i);
    PyObject *dflt = PySequence_GetItem(defaults, i);
    if (!name || !dflt || !PyUnicode_Check(name)) {
      Py_XDECREF(name);
      Py_XDECREF(dflt);
      Py_DECREF(capsule);
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "new_runner: parameter names must be str");
      return NULL;
    }
    PyUnicode_InternInPlace(&name);
    r->names[i] = name;
    if (dflt == missing)
      Py_DECREF(dflt);
    else
      r->defaults[i] = dflt;
  }
  Py_INCREF(table0);
  r->table0 = table0;
  PyObject **slots[] = {&r->get_device, &r->get_stream, &r->general, &r->slow, &r->after, &r->tables_by_raw};
  PyObject *given[] = {get_device, get_stream, general, slow, after, tables_by_raw};
  for (int i = 0; i < 6; i++) {
    Py_INCREF(given[i]);
    *slots[i] = given[i];
  }
  PyObject *run = PyCFunction_NewEx(&runner_def, capsule, NULL);
  if (!run) {
    Py_DECREF(capsule);
    return NULL;
  }
  return Py_BuildValue("(NN)", capsule, run);
}

/* ------------------------------------------------------------------------------------------------
 * kernel[grid] bound in C (loader/runtimes/triton/fast.py serve_getitem). bind_grid(fn, grid, fallback) is
 * what a served JITFunction's __getitem__ returns: where fn's instance `run` is a C runner, a C callable
 * holding (run, fn.__dict__, grid, fn, fallback) whose call binds the call's arguments straight into
 * the runner, as run(*args, grid=grid, warmup=False, **kwargs) would be bound, without Triton's lambda
 * and its re-packing of keywords; else fallback(fn, grid), Triton's own __getitem__. A call the runner
 * does not take goes where it goes today: to the generated Python run or the server's run with grid and
 * warmup=False added; and where fn's `run` is no longer that runner (uninstalled, replaced) or the call
 * names grid or warmup itself, through Triton's own fallback(fn, grid)(*args, **kwargs).
 */
enum { BG_RUN, BG_DICT, BG_GRID, BG_FN, BG_FALLBACK, BG_N };
static PyObject *g_s_run;

static PyObject *bound_grid_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  PyObject *run = PyTuple_GetItem(self, BG_RUN); /* borrowed, all of them */
  PyObject *grid = PyTuple_GetItem(self, BG_GRID);
  PyObject *now = PyDict_GetItemWithError(PyTuple_GetItem(self, BG_DICT), g_s_run);
  if (now == run) {
    Runner *r = (Runner *)PyCapsule_GetPointer(PyCFunction_GetSelf(run), "nojit.fast.runner");
    if (!r)
      return NULL;
    Call c;
    int how = bind_call(r, args, nargs, kwnames, &c, grid);
    if (how == 0)
      return runner_launch(r, &c, args, nargs, kwnames, grid);
    if (how == 1)
      return forward(r->general, args, nargs, kwnames, grid);
  } else if (PyErr_Occurred()) {
    return NULL;
  }
  PyObject *triton_call = PyObject_CallFunctionObjArgs(PyTuple_GetItem(self, BG_FALLBACK),
                                                       PyTuple_GetItem(self, BG_FN), grid, NULL);
  if (!triton_call)
    return NULL;
  PyObject *res = forward(triton_call, args, nargs, kwnames, NULL);
  Py_DECREF(triton_call);
  return res;
}

static PyMethodDef bound_grid_def = {"kernel_grid", (PyCFunction)(void (*)(void))bound_grid_call,
                                     METH_FASTCALL | METH_KEYWORDS,
                                     "kernel[grid](*args, **kwargs): nojit's one-call launch with this grid"};

static int is_runner(PyObject *run) {
  return run && PyCFunction_Check(run) &&
         PyCFunction_GetFunction(run) == (PyCFunction)(void (*)(void))runner_call;
}

static PyObject *fast_bind_grid(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "bind_grid(fn, grid, fallback)");
    return NULL;
  }
  PyObject *fn = args[0], *grid = args[1], *fallback = args[2];
  PyObject *dict = PyObject_GenericGetDict(fn, NULL);
  if (!dict)
    return NULL;
  PyObject *run = PyDict_GetItemWithError(dict, g_s_run);
  if (!is_runner(run)) {
    Py_DECREF(dict);
    if (PyErr_Occurred())
      return NULL;
    return PyObject_CallFunctionObjArgs(fallback, fn, grid, NULL);
  }
  PyObject *state = PyTuple_Pack(BG_N, run, dict, grid, fn, fallback);
  Py_DECREF(dict);
  if (!state)
    return NULL;
  PyObject *out = PyCFunction_NewEx(&bound_grid_def, state, NULL);
  Py_DECREF(state);
  return out;
}
/* ---- end of kernel[grid] bound in C ---------------------------------------------------------- */

/* probe(runner, *args, grid=..., warmup=..., **kwargs) -> ("general", None, -1, None) or
 * ("table", codes, entry index or -1, packed bytes or None): what run would do with this call,
 * without launching (tests: the C binding against the Python binder and key). */
static PyObject *fast_probe(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "probe(runner, *args, **kwargs)");
    return NULL;
  }
  Runner *r = (Runner *)PyCapsule_GetPointer(args[0], "nojit.fast.runner");
  if (!r)
    return NULL;
  Call c;
  if (bind_call(r, args + 1, nargs - 1, kwnames, &c, NULL))
    return Py_BuildValue("(sOiO)", "general", Py_None, -1, Py_None);
  Table *t = get_table(c.table);
  uint32_t codes[NJ_MAX_PARAMS];
  Value values[NJ_MAX_PARAMS];
  if (classify_array(t, c.bound, codes, values))
    return Py_BuildValue("(sOiO)", "table", Py_None, -1, Py_None);
  PyObject *out = PyTuple_New(t->nparams);
  for (int i = 0; out && i < t->nparams; i++)
    PyTuple_SetItem(out, i, PyLong_FromUnsignedLong(codes[i]));
  int idx = find_entry(t, codes);
  PyObject *packed = Py_None;
  Py_INCREF(packed);
  if (idx >= 0) {
    Entry *e = &t->entries[idx];
    uint64_t slots[NJ_MAX_PARAMS];
    int ok = 1;
    for (int a = 0; a < e->nargs && ok; a++)
      ok = pack_one(e->arg_code[a], &values[e->arg_index[a]], &slots[a]) == 0;
    if (ok) {
      Py_DECREF(packed);
      packed = PyBytes_FromStringAndSize((const char *)slots, (Py_ssize_t)e->nargs * 8);
    }
  }
  return Py_BuildValue("(sNiN)", "table", out, idx, packed);
}

/* ---- TileLang launches: their own section (csrc/nojit_fast_tilelang.h) ---- */
#ifndef NOJIT_MAX_CLUSTER_BLOCKS
#define NOJIT_MAX_CLUSTER_BLOCKS 16 /* as csrc/nojit_cuda.h */
#endif
#include "nojit_fast_tilelang.h"

static PyMethodDef methods[] = {
    {"configure", fast_configure, METH_VARARGS, "configure(tensor_type, dtypes, cuLaunchKernelEx address)"},
    {"new_table", fast_new_table, METH_O, "new_table(params) -> table"},
    {"add_entry", fast_add_entry, METH_VARARGS, "add_entry(table, codes, variant, ...) -> index"},
    {"set_function", fast_set_function, METH_VARARGS, "set_function(table, entry, device, function)"},
    {"launch", (PyCFunction)(void (*)(void))fast_launch, METH_FASTCALL, "launch(table, bound, grid, device, stream)"},
    {"lookup", fast_lookup, METH_VARARGS, "lookup(table, bound) -> (entry index or -1, codes)"},
    {"pack", fast_pack, METH_VARARGS, "pack(table, entry, bound) -> bytes"},
    {"new_runner", fast_new_runner, METH_VARARGS, "new_runner(table0, names, defaults, missing, ...) -> (runner, run)"},
    {"probe", (PyCFunction)(void (*)(void))fast_probe, METH_FASTCALL | METH_KEYWORDS,
     "probe(runner, *args, **kwargs) -> (how, codes, entry, packed bytes)"},
    {"bind_grid", (PyCFunction)(void (*)(void))fast_bind_grid, METH_FASTCALL,
     "bind_grid(fn, grid, fallback) -> kernel[grid] bound in C (or fallback(fn, grid))"},
    {"floor", fast_floor, METH_VARARGS, "floor(table, bound, grid, device, stream, iterations) -> ns per launch"},
    NJ_TILELANG_METHODS
    NJ_DLPACK_METHODS
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastlaunch", "nojit's one-call Triton launch path", -1,
                                    methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__fastlaunch(void) {
  g_s_dtype = PyUnicode_InternFromString("dtype");
  g_s_data_ptr = PyUnicode_InternFromString("data_ptr");
  g_s_grid = PyUnicode_InternFromString("grid");
  g_s_warmup = PyUnicode_InternFromString("warmup");
  NJ_TILELANG_INIT();
  g_s_dl_attr = PyUnicode_InternFromString("__dlpack_c_exchange_api__");
  g_s_run = PyUnicode_InternFromString("run");
  return PyModule_Create(&module);
}
