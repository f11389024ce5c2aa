/*
 * Reading tensors through the DLPack C exchange API (DLPack >= 1.3; included by nojit_fast.c).
 *
 * A tensor type that implements it holds, as the class attribute `__dlpack_c_exchange_api__`, a
 * PyCapsule named "dlpack_exchange_api" whose pointer is a static table of C functions. Two of them
 * are used here: `dltensor_from_py_object_no_sync` fills a caller-owned DLTensor (data pointer, byte
 * offset, device, dtype, shape, strides) with no allocation and no Python call, and
 * `current_work_stream` gives the framework's current stream of a device (torch: the stream
 * `torch.cuda.current_stream()` names, the capture stream while a CUDA graph is captured).
 *
 * The declarations below are nojit's own, of just the parts of the published DLPack ABI used here
 * (the standard's struct layouts; a major version other than NJ_DL_MAJOR means other layouts, so an
 * API table is used only where its header, or one on its prev_api chain, says NJ_DL_MAJOR).
 * Anything not read here (no capsule, another major, an export that fails, a dtype not registered)
 * is read as before, through torch's Python API: the DLPack read is an acceleration, never a second
 * definition of what a tensor is.
 */

#define NJ_DL_MAJOR 1u
#define NJ_DL_CPU 1
#define NJ_DL_CUDA 2
#define NJ_DL_MAX_TYPES 8 /* tensor types whose API is cached (torch.Tensor, Parameter, a few subclasses) */

typedef struct {
  uint32_t major, minor;
} NjDLVersion;

typedef struct NjDLApiHeader {
  NjDLVersion version;
  struct NjDLApiHeader *prev_api;
} NjDLApiHeader;

typedef struct {
  int32_t device_type; /* DLDeviceType: an int32 enum */
  int32_t device_id;
} NjDLDevice;

typedef struct {
  uint8_t code, bits;
  uint16_t lanes;
} NjDLDataType;

typedef struct {
  void *data;
  NjDLDevice device;
  int32_t ndim;
  NjDLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* in elements; never NULL for ndim > 0 since DLPack 1.2 */
  uint64_t byte_offset;
} NjDLTensor;

typedef int (*NjDLFromPy)(void *py_object, NjDLTensor *out);
typedef int (*NjDLStream)(int32_t device_type, int32_t device_id, void **out_stream);

typedef struct {
  NjDLApiHeader header;
  void *managed_tensor_allocator;              /* not used here */
  void *managed_tensor_from_py_object_no_sync; /* not used here */
  void *managed_tensor_to_py_object_no_sync;   /* not used here */
  NjDLFromPy dltensor_from_py_object_no_sync;  /* may be NULL */
  NjDLStream current_work_stream;
} NjDLApi;

static int g_dl_on;                    /* 1: read tensors through the API (dlpack_setup found a usable one) */
static NjDLStream g_dl_stream;         /* torch.Tensor's current_work_stream, NULL: not used */
static PyObject *g_dl_stream_accessor; /* the torch accessor the API stream replaces (runner's get_stream) */
static int32_t g_dl_launch_type = NJ_DL_CUDA; /* device type a launch's tensors must be on */
static PyObject *g_s_dl_attr;
static struct {
  PyObject *type; /* strong ref: the pointer cannot be reused by another type while cached */
  NjDLFromPy read;
} g_dl_types[NJ_DL_MAX_TYPES];
static int g_dl_ntypes;
/* DLDataType (code | bits << 8 | lanes << 16) of each registered torch dtype; 0: none (read through torch) */
static uint32_t g_dl_dtype[NJ_MAX_DTYPES];

static uint32_t nj_dl_dtype_word(NjDLDataType t) {
  return (uint32_t)t.code | (uint32_t)t.bits << 8 | (uint32_t)t.lanes << 16;
}

/* The table of major NJ_DL_MAJOR in the chain starting at h (NULL: none). */
static const NjDLApi *nj_dl_find(const NjDLApiHeader *h) {
  for (int depth = 0; h && depth < 16; depth++, h = h->prev_api)
    if (h->version.major == NJ_DL_MAJOR)
      return (const NjDLApi *)h;
  return NULL;
}

/* The API table of type tp's capsule; NULL without an error set: none usable. why (may be NULL) gets a reason. */
static const NjDLApi *nj_dl_api_of_type(PyObject *tp, const char **why) {
  PyObject *cap = PyObject_GetAttr(tp, g_s_dl_attr);
  if (!cap) {
    PyErr_Clear();
    if (why)
      *why = "no __dlpack_c_exchange_api__ on the tensor type";
    return NULL;
  }
  const NjDLApiHeader *h = (const NjDLApiHeader *)PyCapsule_GetPointer(cap, "dlpack_exchange_api");
  Py_DECREF(cap); /* the table is static in the producer: it outlives the capsule object */
  if (!h) {
    PyErr_Clear();
    if (why)
      *why = "__dlpack_c_exchange_api__ is not a \"dlpack_exchange_api\" capsule";
    return NULL;
  }
  const NjDLApi *api = nj_dl_find(h);
  if (!api && why)
    *why = "the DLPack exchange API's major version is not 1 (none on its prev_api chain)";
  return api;
}

/* The reader of v's exact type (cached per type; NULL: read through torch). */
static NjDLFromPy nj_dl_reader(PyObject *v) {
  PyObject *tp = (PyObject *)Py_TYPE(v);
  for (int i = 0; i < g_dl_ntypes; i++)
    if (g_dl_types[i].type == tp)
      return g_dl_types[i].read;
  const NjDLApi *api = nj_dl_api_of_type(tp, NULL);
  NjDLFromPy read = api ? api->dltensor_from_py_object_no_sync : NULL;
  if (g_dl_ntypes < NJ_DL_MAX_TYPES) {
    Py_INCREF(tp);
    g_dl_types[g_dl_ntypes].type = tp;
    g_dl_types[g_dl_ntypes].read = read;
    g_dl_ntypes++;
  }
  return read;
}

/* Fill *out for tensor v; 0: done, -1: not read here (no exception left set). */
static int nj_dl_read(PyObject *v, NjDLTensor *out) {
  if (!g_dl_on)
    return -1;
  NjDLFromPy read = nj_dl_reader(v);
  if (!read)
    return -1;
  if (read(v, out) != 0) {
    PyErr_Clear(); /* e.g. a conjugated tensor, a dtype DLPack has no code for: torch's accessors decide */
    return -1;
  }
  return 0;
}

#define NJ_DL_KNOWN 0x80000000u
#define NJ_DL_SHARED 0x40000000u /* more than one registered dtype has this DLDataType (torch.int8, int1..int7) */
#define NJ_DL_WORD 0x3FFFFFFFu

/* Index of the registered torch dtype of a DLDataType; -1: none; -2: shared by several (ask torch). */
static int nj_dl_dtype_index(NjDLDataType t) {
  uint32_t w = nj_dl_dtype_word(t) | NJ_DL_KNOWN;
  for (int d = 0; d < g_ndtypes; d++)
    if ((g_dl_dtype[d] & ~NJ_DL_SHARED) == w)
      return g_dl_dtype[d] & NJ_DL_SHARED ? -2 : d;
  return -1;
}

/* Index of tensor v's dtype among the registered dtypes, read through torch (identity); -1: none. */
static int nj_torch_dtype_index(PyObject *v) {
  PyObject *dtype = PyObject_GetAttr(v, g_s_dtype);
  if (!dtype) {
    PyErr_Clear();
    return -1;
  }
  int d = 0;
  while (d < g_ndtypes && g_dtypes[d] != dtype)
    d++;
  Py_DECREF(dtype); /* the registered dtypes keep it alive; only identity was needed */
  return d < g_ndtypes ? d : -1;
}

static void nj_dl_forget_types(void) {
  for (int i = 0; i < g_dl_ntypes; i++)
    Py_CLEAR(g_dl_types[i].type);
  g_dl_ntypes = 0;
}

/*
 * dlpack_setup(tensor_type, samples, stream_accessor, enable) -> "on 1.3" or "off: why".
 * samples: one tensor per registered dtype (or None): their DLDataType is read here, so the dtype map is the
 * producer's own; a DLDataType two dtypes share is dropped (read through torch). stream_accessor: the torch
 * callable whose calls the API's current_work_stream replaces in runners given it as get_stream (None: keep).
 */
static PyObject *fast_dlpack_setup(PyObject *self, PyObject *args) {
  PyObject *tensor_type, *samples, *accessor;
  int enable;
  if (!PyArg_ParseTuple(args, "OOOp", &tensor_type, &samples, &accessor, &enable))
    return NULL;
  g_dl_on = 0;
  g_dl_stream = NULL;
  Py_CLEAR(g_dl_stream_accessor);
  nj_dl_forget_types();
  memset(g_dl_dtype, 0, sizeof(g_dl_dtype));
  if (!enable)
    return PyUnicode_FromString("off: disabled");
  const char *why = NULL;
  const NjDLApi *api = nj_dl_api_of_type(tensor_type, &why);
  if (!api)
    return PyUnicode_FromFormat("off: %s", why);
  if (!api->dltensor_from_py_object_no_sync || !api->current_work_stream)
    return PyUnicode_FromString("off: the DLPack exchange API has no dltensor_from_py_object_no_sync");
  Py_ssize_t n = PySequence_Size(samples);
  if (n < 0)
    return NULL;
  for (Py_ssize_t d = 0; d < n && d < g_ndtypes; d++) {
    PyObject *s = PySequence_GetItem(samples, d);
    if (!s)
      return NULL;
    NjDLTensor t;
    if (s != Py_None && PyObject_TypeCheck(s, (PyTypeObject *)tensor_type) &&
        api->dltensor_from_py_object_no_sync(s, &t) == 0 && (nj_dl_dtype_word(t.dtype) & ~NJ_DL_WORD) == 0)
      g_dl_dtype[d] = nj_dl_dtype_word(t.dtype) | NJ_DL_KNOWN;
    PyErr_Clear();
    Py_DECREF(s);
  }
  for (int a = 0; a < g_ndtypes; a++) /* a DLDataType of several dtypes: their tensors' dtype is asked of torch */
    for (int b = a + 1; g_dl_dtype[a] && b < g_ndtypes; b++)
      if ((g_dl_dtype[b] & ~NJ_DL_SHARED) == (g_dl_dtype[a] & ~NJ_DL_SHARED)) {
        g_dl_dtype[a] |= NJ_DL_SHARED;
        g_dl_dtype[b] |= NJ_DL_SHARED;
      }
  g_dl_stream = api->current_work_stream;
  if (accessor != Py_None) {
    Py_INCREF(accessor);
    g_dl_stream_accessor = accessor;
  }
  g_dl_on = 1;
  return PyUnicode_FromFormat("on %u.%u", api->header.version.major, api->header.version.minor);
}

/* dlpack_enable(flag) -> previous flag: the benchmark's switch between the two reads (same process). */
static PyObject *fast_dlpack_enable(PyObject *self, PyObject *arg) {
  int prev = g_dl_on, want = PyObject_IsTrue(arg);
  if (want < 0)
    return NULL;
  if (want && !g_dl_stream) {
    PyErr_SetString(PyExc_RuntimeError, "dlpack_enable: no usable DLPack exchange API (dlpack_setup said off)");
    return NULL;
  }
  g_dl_on = want;
  return PyBool_FromLong(prev);
}

/* dlpack_read(tensor) -> None (read through torch) or (data + byte_offset, (device type, id), (code, bits, lanes),
 * dtype index or -1, shape, strides): what the launch path reads, for the parity tests. */
static PyObject *fast_dlpack_read(PyObject *self, PyObject *v) {
  NjDLTensor t;
  if (nj_dl_read(v, &t))
    Py_RETURN_NONE;
  PyObject *shape = PyTuple_New(t.ndim), *strides = PyTuple_New(t.ndim);
  for (int i = 0; shape && strides && i < t.ndim; i++) {
    PyTuple_SetItem(shape, i, PyLong_FromLongLong(t.shape[i]));
    PyTuple_SetItem(strides, i, t.strides ? PyLong_FromLongLong(t.strides[i]) : (Py_INCREF(Py_None), Py_None));
  }
  return Py_BuildValue("(K(ii)(iii)iNN)", (unsigned long long)((uintptr_t)t.data + t.byte_offset),
                       (int)t.device.device_type, (int)t.device.device_id, (int)t.dtype.code, (int)t.dtype.bits,
                       (int)t.dtype.lanes, nj_dl_dtype_index(t.dtype), shape, strides);
}

/* dlpack_api_of(type) -> "on M.m" or "off: why": what dlpack_setup would find on a type (tests: fake capsules). */
static PyObject *fast_dlpack_api_of(PyObject *self, PyObject *tp) {
  const char *why = NULL;
  const NjDLApi *api = nj_dl_api_of_type(tp, &why);
  if (!api)
    return PyUnicode_FromFormat("off: %s", why);
  return PyUnicode_FromFormat("on %u.%u", api->header.version.major, api->header.version.minor);
}

/* dlpack_launch_device_type(type) -> previous: the DLPack device type a launch's tensors must be on (kDLCUDA;
 * the CPU tests and benchmark, whose no-op driver takes CPU tensors, set kDLCPU). */
static PyObject *fast_dlpack_launch_device_type(PyObject *self, PyObject *arg) {
  long t = PyLong_AsLong(arg);
  if (t == -1 && PyErr_Occurred())
    return NULL;
  long prev = g_dl_launch_type;
  g_dl_launch_type = (int32_t)t;
  return PyLong_FromLong(prev);
}

/* dlpack_current_stream(device) -> the stream torch's current_work_stream gives for (kDLCUDA, device), as an int:
 * what a runner launches on (GPU checks: it is torch.cuda.current_stream(), the capture stream under capture). */
static PyObject *fast_dlpack_current_stream(PyObject *self, PyObject *arg) {
  long device = PyLong_AsLong(arg);
  if (device == -1 && PyErr_Occurred())
    return NULL;
  if (!g_dl_stream) {
    PyErr_SetString(PyExc_RuntimeError, "dlpack_current_stream: no usable DLPack exchange API");
    return NULL;
  }
  void *s = NULL;
  if (g_dl_stream(NJ_DL_CUDA, (int32_t)device, &s) != 0)
    return NULL; /* torch's error (no driver, bad device) */
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)s);
}

#define NJ_DLPACK_METHODS                                                                                              \
  {"dlpack_setup", fast_dlpack_setup, METH_VARARGS, "dlpack_setup(tensor_type, samples, stream_accessor, enable)"},  \
      {"dlpack_enable", fast_dlpack_enable, METH_O, "dlpack_enable(flag) -> previous"},                                \
      {"dlpack_read", fast_dlpack_read, METH_O, "dlpack_read(tensor) -> None | (ptr, device, dtype, index, ...)"},     \
      {"dlpack_api_of", fast_dlpack_api_of, METH_O, "dlpack_api_of(type) -> 'on M.m' | 'off: why'"},                   \
      {"dlpack_launch_device_type", fast_dlpack_launch_device_type, METH_O,                                            \
       "dlpack_launch_device_type(type) -> previous"},                                                                 \
      {"dlpack_current_stream", fast_dlpack_current_stream, METH_O, "dlpack_current_stream(device) -> stream"},        \
      {"runner_reads_stream_through_dlpack", fast_runner_dl_stream, METH_O,                                            \
       "runner_reads_stream_through_dlpack(runner) -> bool"},
