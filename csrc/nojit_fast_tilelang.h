/*
 * nojit fast path for TileLang launches (included by nojit_fast.c; its own section of _fastlaunch).
 *
 * A plan per bundled TileLang variant (loader/runtimes/tilelang/serving.py TileLangVariant) is prepared at
 * first use from the entry's launch plan: the tensor checks (dtype, rank, contiguity), where each
 * dynamic variable is read (tensor, axis), the grid and block expressions compiled to postfix
 * programs over those variables, and the device parameters with their C types. One call then
 * checks the tensors, reads the shapes and data pointers, evaluates the geometry, packs and calls
 * cuLaunchKernelEx. Whatever it does not accept (a failed check, a non-tensor, a value out of range,
 * an overflow, a division by zero, a grid or block past CUDA's limits) it declines: the Python path (TileLangVariant._launch_python,
 * the one definition) then launches or raises its typed error, so C can be slower to say no, never
 * different. CUDA-graph safe: stack buffers only, no synchronisation.
 *
 * Program ops (loader/runtimes/tilelang/serving.py compiles launch_expr trees to these, postfix):
 *   0 literal v, 1 variable v, 2 +, 3 -, 4 *, 5 // (floor), 6 % (floor), 7 min, 8 max, 9 <, 10 <=, 11 ==, 12 select
 */

#define TL_MAX_TENSORS 64
#define TL_MAX_VARS 32
#define TL_STACK 96
/* CUDA's launch limits, as loader/bundle/launch_expr.py (GRID_LIMITS, BLOCK_LIMITS, MAX_BLOCK_THREADS) states them */
#define TL_GRID_X_MAX 0x7FFFFFFFu
#define TL_GRID_YZ_MAX 65535u
#define TL_BLOCK_XY_MAX 1024u
#define TL_BLOCK_Z_MAX 64u
#define TL_BLOCK_THREADS_MAX 1024u

enum { TL_LIT, TL_VAR, TL_ADD, TL_SUB, TL_MUL, TL_FDIV, TL_MOD, TL_MIN, TL_MAX, TL_LT, TL_LE, TL_EQ, TL_SEL, TL_NOPS };

typedef struct {
  int ntensors;
  int nchecks;
  int check_index[TL_MAX_TENSORS], check_ndim[TL_MAX_TENSORS];
  PyObject *check_dtype[TL_MAX_TENSORS];
  int check_dtype_index[TL_MAX_TENSORS]; /* its index among the registered dtypes (-1: none) */
  int nvars;
  int var_tensor[TL_MAX_VARS], var_dim[TL_MAX_VARS];
  int prog_len[6];
  int64_t *prog[6]; /* pairs (op, value) */
  int nparams;
  int param_kind[NJ_MAX_PARAMS], param_ref[NJ_MAX_PARAMS]; /* kind 0: tensor index, 1: variable index */
  char param_code[NJ_MAX_PARAMS];                          /* 'p', 'i' or 'l' */
  uint32_t smem, cx, cy, cz;
  int pdl, coop;
  PyObject *missing;
  uint64_t function[NJ_MAX_DEVICES];
} TlPlan;

static PyObject *g_s_shape, *g_s_ndim, *g_s_is_contiguous;

/* A torch.Tensor (or subclass), by type: isinstance would run torch's metaclass hook on every call. */
static int tl_is_tensor(PyObject *x) {
  return g_tensor_type && PyType_Check(g_tensor_type) && PyType_IsSubtype(Py_TYPE(x), (PyTypeObject *)g_tensor_type);
}

static void tl_free(PyObject *capsule) {
  TlPlan *p = (TlPlan *)PyCapsule_GetPointer(capsule, "nojit.fast.tilelang");
  if (!p)
    return;
  for (int i = 0; i < p->nchecks; i++)
    Py_XDECREF(p->check_dtype[i]);
  for (int i = 0; i < 6; i++)
    PyMem_Free(p->prog[i]);
  Py_XDECREF(p->missing);
  PyMem_Free(p);
}

static TlPlan *tl_get(PyObject *capsule) { return (TlPlan *)PyCapsule_GetPointer(capsule, "nojit.fast.tilelang"); }

static int tl_bad(const char *what) {
  PyErr_Format(PyExc_ValueError, "tl_new: %s", what);
  return -1;
}

/* One postfix program; checked here so evaluation never reads outside its stack or variables. */
static int tl_read_prog(TlPlan *p, int slot, PyObject *seq) {
  Py_ssize_t n = PySequence_Size(seq);
  if (n < 2 || n % 2 || n > 4 * 256)
    return tl_bad("program length");
  p->prog[slot] = (int64_t *)PyMem_Calloc((size_t)n, sizeof(int64_t));
  if (!p->prog[slot])
    return -1;
  int depth = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *x = PySequence_GetItem(seq, i);
    if (!x)
      return -1;
    long long v = PyLong_AsLongLong(x);
    Py_DECREF(x);
    if (v == -1 && PyErr_Occurred())
      return -1;
    p->prog[slot][i] = v;
    if (i % 2 == 0) {
      if (v < 0 || v >= TL_NOPS)
        return tl_bad("unknown op");
      depth += v <= TL_VAR ? 1 : v == TL_SEL ? -2 : -1;
      if (depth < 1 || depth > TL_STACK)
        return tl_bad("program stack");
    } else if (p->prog[slot][i - 1] == TL_VAR && (v < 0 || v >= p->nvars)) {
      return tl_bad("variable index");
    }
  }
  if (depth != 1)
    return tl_bad("program leaves more than one value");
  p->prog_len[slot] = (int)(n / 2);
  return 0;
}

/* tl_new(ntensors, checks, vars, programs, params, smem, cluster, pdl, coop, missing) -> plan
 *   checks: ((tensor index, dtype, ndim), ...); vars: ((tensor index, axis), ...);
 *   programs: 6 flat (op, value, ...) tuples (grid x y z, block x y z); params: ((kind, ref, code), ...) */
static PyObject *fast_tl_new(PyObject *self, PyObject *args) {
  int ntensors, pdl, coop;
  PyObject *checks, *vars, *progs, *params, *missing;
  unsigned long smem;
  unsigned int cx, cy, cz;
  if (!PyArg_ParseTuple(args, "iOOOOk(III)iiO", &ntensors, &checks, &vars, &progs, &params, &smem, &cx, &cy, &cz, &pdl,
                        &coop, &missing))
    return NULL;
  TlPlan *p = (TlPlan *)PyMem_Calloc(1, sizeof(TlPlan));
  if (!p)
    return PyErr_NoMemory();
  PyObject *capsule = PyCapsule_New(p, "nojit.fast.tilelang", tl_free);
  if (!capsule) {
    PyMem_Free(p);
    return NULL;
  }
  Py_INCREF(missing);
  p->missing = missing;
  p->smem = (uint32_t)smem;
  p->cx = cx, p->cy = cy, p->cz = cz, p->pdl = pdl, p->coop = coop;
  uint64_t cluster = (uint64_t)cx * cy * cz;
  Py_ssize_t nc = PySequence_Size(checks), nv = PySequence_Size(vars), np = PySequence_Size(params);
  if (ntensors < 0 || ntensors > TL_MAX_TENSORS || nc < 0 || nc > TL_MAX_TENSORS || nv < 0 || nv > TL_MAX_VARS ||
      np < 0 || np > NJ_MAX_PARAMS || PySequence_Size(progs) != 6 || cluster == 0 || cluster > NOJIT_MAX_CLUSTER_BLOCKS) {
    if (!PyErr_Occurred())
      tl_bad("sizes");
    goto fail;
  }
  p->ntensors = ntensors;
  for (Py_ssize_t i = 0; i < nc; i++) {
    PyObject *c = PySequence_GetItem(checks, i);
    int idx, ndim;
    PyObject *dtype;
    int ok = c && PyArg_ParseTuple(c, "iOi", &idx, &dtype, &ndim);
    Py_XDECREF(c);
    if (!ok)
      goto fail;
    if (idx < 0 || idx >= ntensors) {
      tl_bad("check index");
      goto fail;
    }
    Py_INCREF(dtype);
    p->check_index[i] = idx, p->check_dtype[i] = dtype, p->check_ndim[i] = ndim;
    p->check_dtype_index[i] = -1;
    for (int d = 0; d < g_ndtypes; d++)
      if (g_dtypes[d] == dtype)
        p->check_dtype_index[i] = d;
    p->nchecks = (int)i + 1;
  }
  for (Py_ssize_t i = 0; i < nv; i++) {
    PyObject *c = PySequence_GetItem(vars, i);
    int ok = c && PyArg_ParseTuple(c, "ii", &p->var_tensor[i], &p->var_dim[i]);
    Py_XDECREF(c);
    if (!ok)
      goto fail;
    if (p->var_tensor[i] < 0 || p->var_tensor[i] >= ntensors || p->var_dim[i] < 0) {
      tl_bad("variable source");
      goto fail;
    }
  }
  p->nvars = (int)nv;
  for (int s = 0; s < 6; s++) {
    PyObject *prog = PySequence_GetItem(progs, s);
    int rc = prog ? tl_read_prog(p, s, prog) : -1;
    Py_XDECREF(prog);
    if (rc)
      goto fail;
  }
  for (Py_ssize_t i = 0; i < np; i++) {
    PyObject *c = PySequence_GetItem(params, i);
    int kind, ref, code;
    int ok = c && PyArg_ParseTuple(c, "iiC", &kind, &ref, &code);
    Py_XDECREF(c);
    if (!ok)
      goto fail;
    if (!((kind == 0 && ref >= 0 && ref < ntensors && code == 'p') ||
          (kind == 1 && ref >= 0 && ref < nv && (code == 'i' || code == 'l')))) {
      tl_bad("parameter");
      goto fail;
    }
    p->param_kind[i] = kind, p->param_ref[i] = ref, p->param_code[i] = (char)code;
  }
  p->nparams = (int)np;
  return capsule;
fail:
  Py_DECREF(capsule);
  return NULL;
}

static int64_t tl_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0)))
    q--;
  return q;
}

/* Value of one program; -1: declined (overflow, division by zero, outside [0, 2^32)). */
static int tl_eval(const TlPlan *p, int slot, const int64_t *vals, uint32_t *out) {
  int64_t st[TL_STACK];
  int sp = 0;
  const int64_t *ops = p->prog[slot];
  for (int k = 0; k < p->prog_len[slot]; k++) {
    int64_t op = ops[2 * k], v = ops[2 * k + 1];
    if (op == TL_LIT) {
      st[sp++] = v;
      continue;
    }
    if (op == TL_VAR) {
      st[sp++] = vals[v];
      continue;
    }
    if (op == TL_SEL) {
      sp -= 2;
      st[sp - 1] = st[sp - 1] ? st[sp] : st[sp + 1];
      continue;
    }
    int64_t b = st[--sp], a = st[sp - 1], r;
    switch (op) {
    case TL_ADD:
      if (__builtin_add_overflow(a, b, &r))
        return -1;
      break;
    case TL_SUB:
      if (__builtin_sub_overflow(a, b, &r))
        return -1;
      break;
    case TL_MUL:
      if (__builtin_mul_overflow(a, b, &r))
        return -1;
      break;
    case TL_FDIV:
      if (b == 0 || (a == INT64_MIN && b == -1))
        return -1;
      r = tl_floordiv(a, b);
      break;
    case TL_MOD:
      if (b == 0 || (a == INT64_MIN && b == -1))
        return -1;
      r = a % b;
      if (r != 0 && ((r < 0) != (b < 0)))
        r += b;
      break;
    case TL_MIN:
      r = a < b ? a : b;
      break;
    case TL_MAX:
      r = a > b ? a : b;
      break;
    case TL_LT:
      r = a < b;
      break;
    case TL_LE:
      r = a <= b;
      break;
    default: /* TL_EQ */
      r = a == b;
    }
    st[sp - 1] = r;
  }
  if (st[0] < 0 || st[0] > (int64_t)0xFFFFFFFF)
    return -1;
  *out = (uint32_t)st[0];
  return 0;
}

#define TL_MAX_DIMS 16

/* One tensor of a call as read through DLPack (state 1), or to be read through torch (state 2); 0: not read yet.
 * The DLTensor's shape and strides are the producer's and valid only until Python runs: copied here at once. */
typedef struct {
  int state, dtype_index, ndim, contiguous;
  uint64_t ptr;
  int32_t dev_type, dev_id;
  int64_t shape[TL_MAX_DIMS];
} TlRead;

static TlRead *tl_read(PyObject *x, TlRead *r) {
  if (r->state)
    return r;
  NjDLTensor dl;
  r->state = 2;
  if (nj_dl_read(x, &dl) || dl.ndim < 0 || dl.ndim > TL_MAX_DIMS || (dl.ndim && (!dl.shape || !dl.strides)) ||
      (r->dtype_index = nj_dl_dtype_index(dl.dtype)) == -1)
    return r;
  r->state = 1;
  r->ndim = dl.ndim;
  r->ptr = (uint64_t)((uintptr_t)dl.data + dl.byte_offset);
  r->dev_type = dl.device.device_type, r->dev_id = dl.device.device_id;
  int64_t numel = 1;
  for (int d = 0; d < dl.ndim; d++) {
    r->shape[d] = dl.shape[d];
    numel = dl.shape[d] ? numel : 0;
  }
  /* torch's is_contiguous(): every size-1 dimension's stride ignored, an empty tensor contiguous */
  int64_t expected = 1;
  r->contiguous = 1;
  for (int d = dl.ndim - 1; numel && d >= 0; d--) {
    if (dl.shape[d] == 1)
      continue;
    if (dl.strides[d] != expected) {
      r->contiguous = 0;
      break;
    }
    expected *= dl.shape[d];
  }
  if (r->dtype_index == -2 && (r->dtype_index = nj_torch_dtype_index(x)) < 0) /* int8 or int1..int7: ask torch */
    r->state = 2;
  return r;
}

/* Checks, shapes, pointers, geometry and packed parameters of one call.
 * 0: ready; 1: declined (the Python path decides); 2: an empty grid (nothing to launch). No exception is left set. */
static int tl_prepare(const TlPlan *p, PyObject *tensors, long device, uint32_t dims[6], uint64_t *slots) {
  if (!PyTuple_Check(tensors) || PyTuple_Size(tensors) != p->ntensors)
    return 1;
  PyObject *const *t = NULL;
  PyObject *items[TL_MAX_TENSORS];
  TlRead rd[TL_MAX_TENSORS];
  for (int i = 0; i < p->ntensors; i++) {
    items[i] = PyTuple_GetItem(tensors, i);
    rd[i].state = 0;
  }
  t = items;
  int rc = 1;
  for (int c = 0; c < p->nchecks; c++) {
    PyObject *x = t[p->check_index[c]];
    if (!tl_is_tensor(x))
      goto out;
    TlRead *r = tl_read(x, &rd[p->check_index[c]]);
    if (r->state == 1) {
      if (r->dtype_index != p->check_dtype_index[c] || r->ndim != p->check_ndim[c] || !r->contiguous)
        goto out;
      continue;
    }
    PyObject *dtype = PyObject_GetAttr(x, g_s_dtype);
    Py_XDECREF(dtype);
    if (dtype != p->check_dtype[c])
      goto out;
    PyObject *ndim = PyObject_GetAttr(x, g_s_ndim);
    long nd = ndim && PyLong_Check(ndim) ? PyLong_AsLong(ndim) : -1;
    Py_XDECREF(ndim);
    if (nd != p->check_ndim[c])
      goto out;
    PyObject *contig = PyObject_CallMethodObjArgs(x, g_s_is_contiguous, NULL);
    int is_contig = contig == Py_True;
    Py_XDECREF(contig);
    if (!is_contig)
      goto out;
  }
  int64_t vals[TL_MAX_VARS];
  PyObject *shape = NULL; /* one torch.Size per source tensor: the variables of a tensor are read together */
  int shape_of = -1;
  for (int v = 0; v < p->nvars; v++) {
    PyObject *x = t[p->var_tensor[v]];
    if (!tl_is_tensor(x))
      goto out_shape;
    TlRead *r = tl_read(x, &rd[p->var_tensor[v]]);
    if (r->state == 1) {
      if (r->ndim <= p->var_dim[v] || r->shape[p->var_dim[v]] < 0)
        goto out_shape;
      vals[v] = r->shape[p->var_dim[v]];
      continue;
    }
    if (shape_of != p->var_tensor[v]) {
      Py_XDECREF(shape);
      shape = PyObject_GetAttr(x, g_s_shape);
      shape_of = p->var_tensor[v];
      if (!shape || !PyTuple_Check(shape))
        goto out_shape;
    }
    if (PyTuple_Size(shape) <= p->var_dim[v])
      goto out_shape;
    PyObject *size = PyTuple_GetItem(shape, p->var_dim[v]); /* borrowed */
    long long s = size && PyLong_Check(size) ? PyLong_AsLongLong(size) : -1;
    if (s < 0)
      goto out_shape;
    vals[v] = s;
  }
  Py_XDECREF(shape);
  for (int d = 0; d < 3; d++)
    if (tl_eval(p, d, vals, &dims[d]))
      goto out;
  if (dims[0] > TL_GRID_X_MAX || dims[1] > TL_GRID_YZ_MAX || dims[2] > TL_GRID_YZ_MAX)
    goto out; /* past CUDA's grid limits: the Python path raises LaunchError */
  if (!(dims[0] && dims[1] && dims[2])) {
    rc = 2;
    goto out;
  }
  for (int d = 3; d < 6; d++)
    if (tl_eval(p, d, vals, &dims[d]))
      goto out;
  if (!dims[3] || !dims[4] || !dims[5] || dims[3] > TL_BLOCK_XY_MAX || dims[4] > TL_BLOCK_XY_MAX ||
      dims[5] > TL_BLOCK_Z_MAX || (uint64_t)dims[3] * dims[4] * dims[5] > TL_BLOCK_THREADS_MAX)
    goto out; /* an empty block or one past CUDA's limits: the Python path raises LaunchError */
  for (int a = 0; a < p->nparams; a++) {
    if (p->param_kind[a] == 0) {
      PyObject *x = t[p->param_ref[a]];
      TlRead *r = tl_is_tensor(x) ? tl_read(x, &rd[p->param_ref[a]]) : NULL;
      if (r && r->state == 1) {
        slots[a] = r->ptr;
        continue;
      }
      PyObject *ptr = PyObject_CallMethodObjArgs(x, g_s_data_ptr, NULL);
      if (!ptr)
        goto out;
      unsigned long long u = PyLong_Check(ptr) ? PyLong_AsUnsignedLongLong(ptr) : (unsigned long long)-1;
      Py_DECREF(ptr);
      if (PyErr_Occurred())
        goto out;
      slots[a] = u;
    } else {
      int64_t v = vals[p->param_ref[a]];
      slots[a] = 0;
      if (p->param_code[a] == 'i') {
        uint32_t x = (uint32_t)v;
        memcpy(&slots[a], &x, 4);
      } else {
        slots[a] = (uint64_t)v;
      }
    }
  }
  /* every tensor read through DLPack is on the launch's device (a CPU tensor, another GPU: the Python path) */
  for (int i = 0; device >= 0 && i < p->ntensors; i++)
    if (rd[i].state == 1 && (rd[i].dev_type != g_dl_launch_type || rd[i].dev_id != device))
      goto out;
  rc = 0;
  goto out;
out_shape:
  Py_XDECREF(shape);
out:
  if (PyErr_Occurred())
    PyErr_Clear();
  return rc;
}

static void tl_config(const TlPlan *p, const uint32_t dims[6], unsigned long long stream, uint64_t *slots,
                      void **params, NjLaunchAttribute *attrs, NjLaunchConfig *cfg) {
  for (int a = 0; a < p->nparams; a++)
    params[a] = &slots[a];
  const uint32_t cluster[3] = {p->cx, p->cy, p->cz};
  nj_launch_config(cfg, attrs, dims, dims + 3, p->smem, stream, cluster, p->pdl, p->coop);
}

/* tl_launch(plan, tensors, device, stream) -> 0 launched (or an empty grid); 1 declined: take the Python path;
 * 2 the module is not loaded on `device` (or the driver entry not set): tl_set_function, then call again;
 * < 0 the driver refused the launch (-CUresult). */
static PyObject *fast_tl_launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "tl_launch(plan, tensors, device, stream)");
    return NULL;
  }
  TlPlan *p = tl_get(args[0]);
  if (!p)
    return NULL;
  long device = PyLong_AsLong(args[2]);
  unsigned long long stream = PyLong_AsUnsignedLongLong(args[3]);
  if (PyErr_Occurred())
    return NULL;
  if (device < 0 || device >= NJ_MAX_DEVICES)
    return PyLong_FromLong(1);
  uint32_t dims[6];
  uint64_t slots[NJ_MAX_PARAMS];
  int rc = tl_prepare(p, args[1], device, dims, slots);
  if (rc)
    return PyLong_FromLong(rc == 2 ? 0 : 1);
  uint64_t function = p->function[device];
  if (!function || !g_launch)
    return PyLong_FromLong(2);
  void *params[NJ_MAX_PARAMS];
  NjLaunchAttribute attrs[NJ_MAX_LAUNCH_ATTRS];
  NjLaunchConfig cfg;
  tl_config(p, dims, stream, slots, params, attrs, &cfg);
  NjResult r = g_launch(&cfg, (NjFunction)(uintptr_t)function, params, NULL);
  return PyLong_FromLong(r ? -(long)r : 0);
}

/* tl_set_function(plan, device, function) */
static PyObject *fast_tl_set_function(PyObject *self, PyObject *args) {
  PyObject *capsule;
  int device;
  unsigned long long function;
  if (!PyArg_ParseTuple(args, "OiK", &capsule, &device, &function))
    return NULL;
  TlPlan *p = tl_get(capsule);
  if (!p)
    return NULL;
  if (device < 0 || device >= NJ_MAX_DEVICES) {
    PyErr_SetString(PyExc_ValueError, "tl_set_function: device out of range");
    return NULL;
  }
  p->function[device] = function;
  Py_RETURN_NONE;
}

/* tl_pack(plan, tensors) -> None (declined) | 0 (empty grid) | (grid, block, shared, packed bytes): for tests. */
static PyObject *fast_tl_pack(PyObject *self, PyObject *args) {
  PyObject *capsule, *tensors;
  if (!PyArg_ParseTuple(args, "OO", &capsule, &tensors))
    return NULL;
  TlPlan *p = tl_get(capsule);
  if (!p)
    return NULL;
  uint32_t d[6];
  uint64_t slots[NJ_MAX_PARAMS];
  int rc = tl_prepare(p, tensors, -1, d, slots);
  if (rc == 1)
    Py_RETURN_NONE;
  if (rc == 2)
    return PyLong_FromLong(0);
  return Py_BuildValue("((III)(III)IN)", d[0], d[1], d[2], d[3], d[4], d[5], p->smem,
                       PyBytes_FromStringAndSize((const char *)slots, (Py_ssize_t)p->nparams * 8));
}

/* tl_floor(plan, tensors, device, stream, iterations) -> ns per cuLaunchKernelEx of this launch, parameters packed
 * once, called in a C loop: the driver's own cost (bench/bench_fastpath.py). */
static PyObject *fast_tl_floor(PyObject *self, PyObject *args) {
  PyObject *capsule, *tensors;
  int device, iterations;
  unsigned long long stream;
  if (!PyArg_ParseTuple(args, "OOiKi", &capsule, &tensors, &device, &stream, &iterations))
    return NULL;
  TlPlan *p = tl_get(capsule);
  if (!p)
    return NULL;
  uint32_t dims[6];
  uint64_t slots[NJ_MAX_PARAMS];
  if (device < 0 || device >= NJ_MAX_DEVICES || iterations < 1 || tl_prepare(p, tensors, device, dims, slots) ||
      !p->function[device] || !g_launch) {
    PyErr_SetString(PyExc_ValueError, "tl_floor: the call is not launchable by the C path");
    return NULL;
  }
  void *params[NJ_MAX_PARAMS];
  NjLaunchAttribute attrs[NJ_MAX_LAUNCH_ATTRS];
  NjLaunchConfig cfg;
  tl_config(p, dims, stream, slots, params, attrs, &cfg);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < iterations; i++)
    if (g_launch(&cfg, (NjFunction)(uintptr_t)p->function[device], params, NULL)) {
      PyErr_SetString(PyExc_RuntimeError, "tl_floor: cuLaunchKernelEx failed");
      return NULL;
    }
  clock_gettime(CLOCK_MONOTONIC, &b);
  double ns = ((double)(b.tv_sec - a.tv_sec) * 1e9 + (double)(b.tv_nsec - a.tv_nsec)) / iterations;
  return PyFloat_FromDouble(ns);
}

#define NJ_TILELANG_METHODS                                                                                            \
  {"tl_new", fast_tl_new, METH_VARARGS, "tl_new(ntensors, checks, vars, programs, params, smem, cluster, pdl, coop, " \
                                        "missing) -> plan"},                                                          \
      {"tl_launch", (PyCFunction)(void (*)(void))fast_tl_launch, METH_FASTCALL,                                        \
       "tl_launch(plan, tensors, device, stream) -> 0 done, 1 declined, 2 load first, <0 -CUresult"},                  \
      {"tl_set_function", fast_tl_set_function, METH_VARARGS, "tl_set_function(plan, device, function)"},              \
      {"tl_pack", fast_tl_pack, METH_VARARGS, "tl_pack(plan, tensors) -> None | 0 | (grid, block, shared, bytes)"},    \
      {"tl_floor", fast_tl_floor, METH_VARARGS, "tl_floor(plan, tensors, device, stream, iterations) -> ns"},

#define NJ_TILELANG_INIT()                                                                                             \
  do {                                                                                                                 \
    g_s_shape = PyUnicode_InternFromString("shape");                                                                   \
    g_s_ndim = PyUnicode_InternFromString("ndim");                                                                     \
    g_s_is_contiguous = PyUnicode_InternFromString("is_contiguous");                                                   \
  } while (0)
