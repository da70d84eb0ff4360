// ge2's compiled helpers for the repeated-call path of an op (ge2/backend/call_plans.py):
//
// * call_key: the call key of an op call, the same tuple call_plans.key builds in Python, without
//   the interpreter's per-item overhead (it runs on every op call);
// * Launch / launch: one CUDA launch of a compiled Triton kernel whose parameters were packed once,
//   with only the device addresses that change between calls passed in. Triton's own launcher
//   parses every kernel argument (constexprs included) from a Python tuple on every call;
// * call / Replay: the registry's entry point. A call whose key has a plan whose launches are all
//   packed runs it here (allocate the outputs through torch, launch, return), with no Python frame
//   between the caller and torch's allocator; other calls go to the registry's Python;
// * apply: Function.apply (ge2/autograd/function.py) when nothing is recorded (no_grad, or no input
//   requires grad): forward on the raw tensors, outputs wrapped as Tensors, no Python frame of ge2's
//   between the user's operator and the op's forward.
//
// Built at first use with Triton's module builder (ge2/kernels/native.py), against Triton's CUDA
// headers, like Triton's launchers; libcuda is opened at the first Launch, so the key works without a GPU.
#include "cuda.h"
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#define MAX_PARAMS 256
#define MAX_STORAGE 4096

typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*ctx_get_t)(CUcontext *);
typedef CUresult (*error_string_t)(CUresult, const char **);
typedef CUresult (*encode_tiled_t)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                   const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
typedef CUresult (*replace_address_t)(CUtensorMap *, void *);
static launch_ex_t launch_ex = NULL;
static ctx_get_t ctx_get_current = NULL;
static error_string_t error_string = NULL;
static encode_tiled_t encode_tiled = NULL;         // NULL on drivers without TMA: Launch refuses tensor maps
static replace_address_t replace_address = NULL;

static int open_libcuda(void) {
  if (launch_ex != NULL) return 0;
  void *cuda = dlopen("libcuda.so.1", RTLD_LAZY);
  if (cuda == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ge2_native: cannot open libcuda.so.1");
    return -1;
  }
  ctx_get_current = (ctx_get_t)dlsym(cuda, "cuCtxGetCurrent");
  error_string = (error_string_t)dlsym(cuda, "cuGetErrorString");
  launch_ex = (launch_ex_t)dlsym(cuda, "cuLaunchKernelEx");
  encode_tiled = (encode_tiled_t)dlsym(cuda, "cuTensorMapEncodeTiled");
  replace_address = (replace_address_t)dlsym(cuda, "cuTensorMapReplaceAddress");
  if (!launch_ex || !ctx_get_current || !error_string) {
    launch_ex = NULL;
    PyErr_SetString(PyExc_RuntimeError, "ge2_native: libcuda.so.1 lacks cuLaunchKernelEx");
    return -1;
  }
  return 0;
}

// A launch with its parameter block: every kernel parameter packed at its offset in `storage`;
// the `n_slots` addresses passed per call go to the offsets in `slots`.
typedef struct {
  PyObject_HEAD
  CUfunction function;
  unsigned grid[3], block, shared;
  int cooperative, pdl;
  Py_ssize_t n_params, n_slots, storage_size;
  Py_ssize_t param_offsets[MAX_PARAMS];
  Py_ssize_t *slots;
  char *slot_is_map;  // slot i holds a CUtensorMap (its global address replaced per call), else an address
  char *storage;
} Launch;

static void Launch_dealloc(Launch *self) {
  PyMem_Free(self->slots);
  PyMem_Free(self->slot_is_map);
  PyMem_Free(self->storage);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

// Encodes the tensor map of a TMA descriptor argument into `map`, as Triton's launcher does per launch
// (driver.c fillTMADescriptor): spec = (address, swizzle, element bytes, CUtensorMapDataType,
// block shape, shape, strides in elements, NaN padding?), shapes outermost first. 0, or -1 (error set).
static int encode_map(CUtensorMap *map, PyObject *spec) {
  unsigned long long address;
  int swizzle, elem_size, elem_type, nan_padding;
  PyObject *block, *shape, *strides;
  if (!PyArg_ParseTuple(spec, "KiiiO!O!O!p", &address, &swizzle, &elem_size, &elem_type, &PyTuple_Type, &block,
                        &PyTuple_Type, &shape, &PyTuple_Type, &strides, &nan_padding))
    return -1;
  Py_ssize_t rank = PyTuple_GET_SIZE(block);
  if (encode_tiled == NULL || replace_address == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "ge2_native: this driver has no cuTensorMapEncodeTiled/ReplaceAddress");
    return -1;
  }
  if (rank < 1 || rank > 5 || PyTuple_GET_SIZE(shape) != rank || PyTuple_GET_SIZE(strides) != rank) {
    PyErr_SetString(PyExc_ValueError, "Launch: a tensor map of rank 1-5 with a shape and a stride per dimension");
    return -1;
  }
  cuuint32_t box[5], element_strides[5] = {1, 1, 1, 1, 1};
  cuuint64_t dims[5], byte_strides[5];
  for (Py_ssize_t i = 0; i < rank; i++) {  // the driver's order is innermost first
    box[rank - 1 - i] = (cuuint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(block, i));
    dims[rank - 1 - i] = (cuuint64_t)PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shape, i));
    if (i + 1 < rank)
      byte_strides[rank - 2 - i] = (cuuint64_t)elem_size * PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(strides, i));
  }
  if (PyErr_Occurred()) return -1;
  CUresult status = encode_tiled(map, (CUtensorMapDataType)elem_type, (cuuint32_t)rank, (void *)(uintptr_t)address,
                                 dims, byte_strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 (CUtensorMapSwizzle)swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                 nan_padding ? CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA
                                             : CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (status != CUDA_SUCCESS) {
    const char *message = "unknown error";
    error_string(status, &message);
    PyErr_Format(PyExc_RuntimeError, "ge2_native: cuTensorMapEncodeTiled failed: %s", message);
    return -1;
  }
  return 0;
}

// Launch(function, (grid x, y, z), threads per block, shared bytes, cooperative, pdl,
//        storage: bytes, param offsets: tuple, slot offsets: tuple, maps: tuple = ())
// maps: (slot index, encode_map spec) per slot that holds a tensor map (at a 128-byte aligned offset).
static int Launch_init(Launch *self, PyObject *args, PyObject *kwargs) {
  unsigned long long function;
  PyObject *offsets, *slots, *maps = NULL;
  const char *storage;
  Py_ssize_t storage_size;
  if (open_libcuda() < 0) return -1;
  if (!PyArg_ParseTuple(args, "K(III)IIppy#O!O!|O!", &function, &self->grid[0], &self->grid[1], &self->grid[2],
                        &self->block, &self->shared, &self->cooperative, &self->pdl, &storage, &storage_size,
                        &PyTuple_Type, &offsets, &PyTuple_Type, &slots, &PyTuple_Type, &maps))
    return -1;
  self->function = (CUfunction)(uintptr_t)function;
  self->n_params = PyTuple_GET_SIZE(offsets);
  self->n_slots = PyTuple_GET_SIZE(slots);
  if (self->n_params > MAX_PARAMS || self->n_slots > self->n_params || storage_size > MAX_STORAGE) {
    PyErr_Format(PyExc_ValueError, "Launch: %zd parameters in %zd bytes (at most %d in %d)", self->n_params,
                 storage_size, MAX_PARAMS, MAX_STORAGE);
    return -1;
  }
  PyMem_Free(self->storage);
  PyMem_Free(self->slots);
  PyMem_Free(self->slot_is_map);
  self->storage = PyMem_Malloc(storage_size ? storage_size : 1);
  self->slots = PyMem_Malloc(sizeof(Py_ssize_t) * (self->n_slots ? self->n_slots : 1));
  self->slot_is_map = PyMem_Calloc(self->n_slots ? self->n_slots : 1, 1);
  if (!self->storage || !self->slots || !self->slot_is_map) {
    PyErr_NoMemory();
    return -1;
  }
  memcpy(self->storage, storage, storage_size);
  self->storage_size = storage_size;
  for (Py_ssize_t i = 0; i < self->n_params; i++) {
    self->param_offsets[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(offsets, i));
    if (self->param_offsets[i] < 0 || self->param_offsets[i] >= storage_size) goto bad_offset;
  }
  for (Py_ssize_t i = 0; i < self->n_slots; i++) {
    self->slots[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(slots, i));
    if (self->slots[i] < 0 || self->slots[i] + 8 > storage_size) goto bad_offset;
  }
  for (Py_ssize_t m = 0; maps != NULL && m < PyTuple_GET_SIZE(maps); m++) {
    PyObject *entry = PyTuple_GET_ITEM(maps, m);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(entry, 1))) {
      PyErr_SetString(PyExc_TypeError, "Launch: maps are (slot index, spec) pairs");
      return -1;
    }
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 0));
    if (i < 0 || i >= self->n_slots || self->slots[i] % 128 || self->slots[i] + (Py_ssize_t)sizeof(CUtensorMap) > storage_size)
      goto bad_offset;
    _Alignas(128) CUtensorMap map;
    if (encode_map(&map, PyTuple_GET_ITEM(entry, 1)) < 0) return -1;
    memcpy(self->storage + self->slots[i], &map, sizeof(CUtensorMap));
    self->slot_is_map[i] = 1;
  }
  return 0;
bad_offset:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Launch: an offset outside the parameter storage");
  return -1;
}

static PyTypeObject LaunchType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ge2_native.Launch",
    .tp_basicsize = sizeof(Launch),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A packed kernel launch: function, grid, block, shared memory and parameter block.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Launch_init,
    .tp_dealloc = (destructor)Launch_dealloc,
};

// One cuLaunchKernelEx of `plan` with these addresses in its slots: 1 launched, 0 nothing launched
// (this thread never touched CUDA: the caller takes Triton's launcher instead), -1 error (set).
static int launch_addresses(Launch *plan, CUstream stream, const uint64_t *addresses) {
  // A copy of the block per call: another thread may launch the same plan while the GIL is released.
  _Alignas(128) char storage[MAX_STORAGE];
  void *params[MAX_PARAMS];
  memcpy(storage, plan->storage, plan->storage_size);
  for (Py_ssize_t i = 0; i < plan->n_slots; i++) {
    if (!plan->slot_is_map[i]) {
      memcpy(storage + plan->slots[i], &addresses[i], 8);
    } else if (replace_address((CUtensorMap *)(storage + plan->slots[i]), (void *)(uintptr_t)addresses[i]) !=
               CUDA_SUCCESS) {  // the address is not 16-byte aligned
      PyErr_Format(PyExc_ValueError, "ge2_native: a TMA descriptor's base address 0x%llx is not 16-byte aligned",
                   (unsigned long long)addresses[i]);
      return -1;
    }
  }
  for (Py_ssize_t i = 0; i < plan->n_params; i++) params[i] = storage + plan->param_offsets[i];

  CUcontext context = NULL;
  ctx_get_current(&context);
  if (context == NULL) return 0;
  CUlaunchAttribute attrs[2];
  CUlaunchConfig config = {0};
  config.gridDimX = plan->grid[0];
  config.gridDimY = plan->grid[1];
  config.gridDimZ = plan->grid[2];
  config.blockDimX = plan->block;
  config.blockDimY = 1;
  config.blockDimZ = 1;
  config.sharedMemBytes = plan->shared;
  config.hStream = stream;
  config.attrs = attrs;
  if (plan->pdl) {
    attrs[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[config.numAttrs++].value.programmaticStreamSerializationAllowed = 1;
  }
  if (plan->cooperative) {
    attrs[config.numAttrs].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[config.numAttrs++].value.cooperative = 1;
  }
  CUresult status;
  // The driver may block when its launch queue is full: let other Python threads run meanwhile.
  Py_BEGIN_ALLOW_THREADS;
  status = launch_ex(&config, plan->function, params, NULL);
  Py_END_ALLOW_THREADS;
  if (status != CUDA_SUCCESS) {
    const char *message = "unknown error";
    error_string(status, &message);
    PyErr_Format(PyExc_RuntimeError, "ge2_native: cuLaunchKernelEx failed: %s", message);
    return -1;
  }
  return 1;
}

// launch(plan, stream, *addresses) -> True, or False when this thread has no CUDA context.
static PyObject *launch(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs < 2 || Py_TYPE(args[0]) != &LaunchType) {
    PyErr_SetString(PyExc_TypeError, "launch(plan: Launch, stream: int, *addresses: int)");
    return NULL;
  }
  Launch *plan = (Launch *)args[0];
  if (nargs - 2 != plan->n_slots) {
    PyErr_Format(PyExc_TypeError, "launch: the plan takes %zd addresses, got %zd", plan->n_slots, nargs - 2);
    return NULL;
  }
  CUstream stream = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(args[1]);
  uint64_t addresses[MAX_PARAMS];
  for (Py_ssize_t i = 0; i < plan->n_slots; i++) addresses[i] = PyLong_AsUnsignedLongLong(args[i + 2]);
  if (PyErr_Occurred()) return NULL;
  int launched = launch_addresses(plan, stream, addresses);
  if (launched < 0) return NULL;
  return PyBool_FromLong(launched);
}

// ---- call keys ---------------------------------------------------------------------------------

static PyObject *tensor_type = NULL, *dtype_type = NULL;  // torch.Tensor, torch.dtype (set_types)
static PyObject *s_shape, *s_stride, *s_dtype, *s_device, *s_data_ptr;

static PyObject *set_types(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyType_Check(args[0]) || !PyType_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "set_types(torch.Tensor, torch.dtype)");
    return NULL;
  }
  Py_XSETREF(tensor_type, Py_NewRef(args[0]));
  Py_XSETREF(dtype_type, Py_NewRef(args[1]));
  Py_RETURN_NONE;
}

static int is_plain_scalar(PyObject *v) {  // int, bool, str, None: keyed as (type, value)
  PyTypeObject *t = Py_TYPE(v);
  return t == &PyLong_Type || t == &PyBool_Type || t == &PyUnicode_Type || v == Py_None;
}

// The key item of attribute `name` = v (a new reference), or Py_None (new) when v cannot be keyed.
static PyObject *attr_item(PyObject *name, PyObject *v) {
  if (is_plain_scalar(v) || Py_TYPE(v) == &PyTuple_Type) return PyTuple_Pack(3, name, (PyObject *)Py_TYPE(v), v);
  if (Py_TYPE(v) == &PyFloat_Type) {
    PyObject *sign = PyFloat_FromDouble(copysign(1.0, PyFloat_AS_DOUBLE(v)));
    PyObject *item = sign ? PyTuple_Pack(4, name, (PyObject *)&PyFloat_Type, v, sign) : NULL;
    Py_XDECREF(sign);
    return item;
  }
  if ((PyObject *)Py_TYPE(v) == dtype_type) return PyTuple_Pack(2, name, v);
  return Py_NewRef(Py_None);
}

// The call key of op(*inputs, **attrs), item for item the tuple call_plans.python_key builds (see there
// for what each part is): a new tuple, Py_None (new) when something cannot be keyed, NULL on error.
// The attributes come as a dict, or (attrs NULL) as vectorcall keywords. `ptrs` (room for n) receives
// the tensor inputs' addresses in order, which a replay launches with.
static PyObject *build_key(PyObject *op, PyObject *precision, PyObject *const *inputs, Py_ssize_t n,
                           PyObject *attrs, PyObject *kwnames, PyObject *const *kwvalues, uint64_t *ptrs) {
  Py_ssize_t n_attrs = attrs ? PyDict_GET_SIZE(attrs) : (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
  Py_ssize_t capacity = 2 + 6 * n + n_attrs, count = 0, n_ptrs = 0;
  PyObject *stack_items[64];
  PyObject **items = capacity <= 64 ? stack_items : PyMem_Malloc(sizeof(PyObject *) * capacity);
  PyObject *result = NULL;
  if (!items) return PyErr_NoMemory();
  items[count++] = Py_NewRef(op);
  items[count++] = Py_NewRef(precision);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *v = inputs[i];
    if ((PyObject *)Py_TYPE(v) == tensor_type) {
      PyObject *address = PyObject_CallMethodNoArgs(v, s_data_ptr);
      if (address == NULL) goto done;
      uint64_t ptr = PyLong_AsUnsignedLongLong(address);
      Py_DECREF(address);
      if (PyErr_Occurred()) goto done;
      long alias = -1;
      for (Py_ssize_t j = 0; j < n_ptrs; j++) {
        if (ptrs[j] == ptr) {
          alias = (long)j;
          break;
        }
      }
      ptrs[n_ptrs++] = ptr;
      PyObject *shape = PyObject_GetAttr(v, s_shape);
      if (shape == NULL) goto done;
      items[count++] = shape;
      PyObject *stride = PyObject_CallMethodNoArgs(v, s_stride);
      if (stride == NULL) goto done;
      items[count++] = stride;
      PyObject *dtype = PyObject_GetAttr(v, s_dtype);
      if (dtype == NULL) goto done;
      items[count++] = dtype;
      PyObject *device = PyObject_GetAttr(v, s_device);
      if (device == NULL) goto done;
      items[count++] = device;
      items[count++] = PyLong_FromLong((long)(ptr & 15));
      items[count++] = PyLong_FromLong(alias);
    } else if (is_plain_scalar(v)) {
      items[count++] = Py_NewRef((PyObject *)Py_TYPE(v));
      items[count++] = Py_NewRef(v);
    } else if (Py_TYPE(v) == &PyFloat_Type) {
      items[count++] = Py_NewRef((PyObject *)&PyFloat_Type);
      items[count++] = Py_NewRef(v);
      items[count++] = PyFloat_FromDouble(copysign(1.0, PyFloat_AS_DOUBLE(v)));
    } else {
      result = Py_NewRef(Py_None);
      goto done;
    }
  }
  Py_ssize_t pos = 0;
  for (Py_ssize_t i = 0; i < n_attrs; i++) {
    PyObject *name, *v;
    if (attrs) {
      PyDict_Next(attrs, &pos, &name, &v);
    } else {
      name = PyTuple_GET_ITEM(kwnames, i);
      v = kwvalues[i];
    }
    PyObject *item = attr_item(name, v);
    if (item == NULL) goto done;
    if (item == Py_None) {
      result = item;
      goto done;
    }
    items[count++] = item;
  }
  result = PyTuple_New(count);
  if (result != NULL) {
    for (Py_ssize_t i = 0; i < count; i++) PyTuple_SET_ITEM(result, i, items[i]);  // steals the references
    count = 0;
  }
done:
  for (Py_ssize_t i = 0; i < count; i++) Py_XDECREF(items[i]);
  if (items != stack_items) PyMem_Free(items);
  return result;
}

// call_key(op, precision, inputs: tuple, attrs: dict) -> tuple, or None when something cannot be keyed.
static PyObject *call_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyTuple_Check(args[2]) || !PyDict_Check(args[3]) || tensor_type == NULL) {
    PyErr_SetString(PyExc_TypeError, "call_key(op, precision, inputs: tuple, attrs: dict), after set_types");
    return NULL;
  }
  Py_ssize_t n = PyTuple_GET_SIZE(args[2]);
  uint64_t stack_ptrs[16];
  uint64_t *ptrs = n <= 16 ? stack_ptrs : PyMem_Malloc(sizeof(uint64_t) * n);
  if (!ptrs) return PyErr_NoMemory();
  PyObject *key = build_key(args[0], args[1], &PyTuple_GET_ITEM(args[2], 0), n, args[3], NULL, NULL, ptrs);
  if (ptrs != stack_ptrs) PyMem_Free(ptrs);
  return key;
}

// ---- replays: a recorded call plan run without Python --------------------------------------------

#define MAX_SOURCES 32

// A call plan (call_plans.CallPlan) whose every launch is a packed Launch and whose outputs are fresh
// tensors: allocate the outputs, launch with the sources' addresses, return the recorded result.
// Sources are the tensor inputs (0 .. n_in-1), then the outputs.
typedef struct {
  PyObject_HEAD
  Py_ssize_t n_in, n_out, n_launch;
  Py_ssize_t in_index[MAX_SOURCES];  // position of tensor input k among the call's inputs
  Py_ssize_t out_like[MAX_SOURCES];  // output j: empty_like(source out_like[j]), or -1: empty_strided(out_args[j])
  PyObject *out_args;                // per output: None or (shape, stride, dtype, device)
  PyObject *launches;                // Launch per launch
  Py_ssize_t *first;                 // launch i's addresses are address_src/delta[first[i] .. first[i + 1])
  Py_ssize_t *address_src;
  long long *address_delta;
  PyObject *result;                  // int: that source; else (is_list, ((is_source, source or value), ...))
} Replay;

static void Replay_dealloc(Replay *self) {
  Py_XDECREF(self->out_args);
  Py_XDECREF(self->launches);
  Py_XDECREF(self->result);
  PyMem_Free(self->first);
  PyMem_Free(self->address_src);
  PyMem_Free(self->address_delta);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

// Replay(in_index: tuple, outputs: tuple of (source | (shape, stride, dtype, device)),
//        launches: tuple of (Launch, ((source, byte offset), ...)), result)
static int Replay_init(Replay *self, PyObject *args, PyObject *kwargs) {
  PyObject *in_index, *outputs, *launches, *result;
  if (open_libcuda() < 0) return -1;
  if (!PyArg_ParseTuple(args, "O!O!O!O", &PyTuple_Type, &in_index, &PyTuple_Type, &outputs, &PyTuple_Type,
                        &launches, &result))
    return -1;
  self->n_in = PyTuple_GET_SIZE(in_index);
  self->n_out = PyTuple_GET_SIZE(outputs);
  self->n_launch = PyTuple_GET_SIZE(launches);
  Py_ssize_t n_sources = self->n_in + self->n_out;
  if (n_sources > MAX_SOURCES) {
    PyErr_Format(PyExc_ValueError, "Replay: %zd sources (at most %d)", n_sources, MAX_SOURCES);
    return -1;
  }
  for (Py_ssize_t k = 0; k < self->n_in; k++) {
    self->in_index[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(in_index, k));
    if (self->in_index[k] < 0) goto bad;
  }
  Py_XSETREF(self->out_args, PyTuple_New(self->n_out));
  if (self->out_args == NULL) return -1;
  for (Py_ssize_t j = 0; j < self->n_out; j++) {
    PyObject *spec = PyTuple_GET_ITEM(outputs, j);
    if (PyLong_Check(spec)) {
      self->out_like[j] = PyLong_AsSsize_t(spec);
      if (self->out_like[j] < 0 || self->out_like[j] >= self->n_in + j) goto bad;
      PyTuple_SET_ITEM(self->out_args, j, Py_NewRef(Py_None));
    } else if (PyTuple_Check(spec) && PyTuple_GET_SIZE(spec) == 4) {
      self->out_like[j] = -1;
      PyTuple_SET_ITEM(self->out_args, j, Py_NewRef(spec));
    } else {
      goto bad;
    }
  }
  Py_ssize_t total = 0;
  for (Py_ssize_t i = 0; i < self->n_launch; i++) {
    PyObject *entry = PyTuple_GET_ITEM(launches, i);
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 || Py_TYPE(PyTuple_GET_ITEM(entry, 0)) != &LaunchType ||
        !PyTuple_Check(PyTuple_GET_ITEM(entry, 1)) ||
        PyTuple_GET_SIZE(PyTuple_GET_ITEM(entry, 1)) != ((Launch *)PyTuple_GET_ITEM(entry, 0))->n_slots)
      goto bad;
    total += PyTuple_GET_SIZE(PyTuple_GET_ITEM(entry, 1));
  }
  PyMem_Free(self->first);
  PyMem_Free(self->address_src);
  PyMem_Free(self->address_delta);
  self->first = PyMem_Malloc(sizeof(Py_ssize_t) * (self->n_launch + 1));
  self->address_src = PyMem_Malloc(sizeof(Py_ssize_t) * (total ? total : 1));
  self->address_delta = PyMem_Malloc(sizeof(long long) * (total ? total : 1));
  if (!self->first || !self->address_src || !self->address_delta) {
    PyErr_NoMemory();
    return -1;
  }
  Py_XSETREF(self->launches, PyTuple_New(self->n_launch));
  if (self->launches == NULL) return -1;
  Py_ssize_t at = 0;
  for (Py_ssize_t i = 0; i < self->n_launch; i++) {
    PyObject *entry = PyTuple_GET_ITEM(launches, i), *addresses = PyTuple_GET_ITEM(entry, 1);
    PyTuple_SET_ITEM(self->launches, i, Py_NewRef(PyTuple_GET_ITEM(entry, 0)));
    self->first[i] = at;
    for (Py_ssize_t a = 0; a < PyTuple_GET_SIZE(addresses); a++, at++) {
      PyObject *pair = PyTuple_GET_ITEM(addresses, a);
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) goto bad;
      self->address_src[at] = PyLong_AsSsize_t(PyTuple_GET_ITEM(pair, 0));
      self->address_delta[at] = PyLong_AsLongLong(PyTuple_GET_ITEM(pair, 1));
      if (PyErr_Occurred() || self->address_src[at] < 0 || self->address_src[at] >= n_sources) goto bad;
    }
  }
  self->first[self->n_launch] = at;
  if (PyLong_Check(result)) {
    Py_ssize_t k = PyLong_AsSsize_t(result);
    if (k < 0 || k >= n_sources) goto bad;
  } else {
    if (!PyTuple_Check(result) || PyTuple_GET_SIZE(result) != 2 || !PyTuple_Check(PyTuple_GET_ITEM(result, 1))) goto bad;
    PyObject *items = PyTuple_GET_ITEM(result, 1);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); i++) {
      PyObject *item = PyTuple_GET_ITEM(items, i);
      if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) goto bad;
      if (PyObject_IsTrue(PyTuple_GET_ITEM(item, 0))) {
        Py_ssize_t k = PyLong_AsSsize_t(PyTuple_GET_ITEM(item, 1));
        if (k < 0 || k >= n_sources) goto bad;
      }
    }
  }
  Py_XSETREF(self->result, Py_NewRef(result));
  return 0;
bad:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Replay: a malformed plan");
  return -1;
}

static PyTypeObject ReplayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ge2_native.Replay",
    .tp_basicsize = sizeof(Replay),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A call plan's outputs, launches and result, replayed by ge2_native.call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Replay_init,
    .tp_dealloc = (destructor)Replay_dealloc,
};

// What the dispatch reads (set_dispatch): the plan table, the slow path, and the Python state that
// decides whether a plan may run here (see call_plans._compile: recorders and launch hooks).
static PyObject *d_plans, *d_slow, *d_stats, *d_recorders, *d_knobs, *d_hookchain, *d_get_device, *d_get_stream,
    *d_empty_like, *d_empty_strided, *d_registry_globals, *d_plans_globals, *d_launch_globals, *d_runtime_globals;
static PyObject *s_backend, *s_enabled, *s_precision, *s_triton, *s_native, *s_replay, *s_hits, *s_native_hits,
    *s_enter_hook, *s_exit_hook, *s_calls, *s_empty_kwnames, *one;

static PyObject *set_dispatch(PyObject *self, PyObject *args) {
  PyObject *v[14];
  if (!PyArg_ParseTuple(args, "O!OO!O!OOOOOOO!O!O!O!", &PyDict_Type, &v[0], &v[1], &PyDict_Type, &v[2], &PyList_Type,
                        &v[3], &v[4], &v[5], &v[6], &v[7], &v[8], &v[9], &PyDict_Type, &v[10], &PyDict_Type, &v[11],
                        &PyDict_Type, &v[12], &PyDict_Type, &v[13]))
    return NULL;
  PyObject **slots[14] = {&d_plans, &d_slow, &d_stats, &d_recorders, &d_knobs, &d_hookchain, &d_get_device,
                          &d_get_stream, &d_empty_like, &d_empty_strided, &d_registry_globals, &d_plans_globals,
                          &d_launch_globals, &d_runtime_globals};
  for (int i = 0; i < 14; i++) Py_XSETREF(*slots[i], Py_NewRef(v[i]));
  Py_RETURN_NONE;
}

// 1 when the call plans are on (registry._backend == "triton", call_plans.ENABLED, launch.ENABLED), 0 off, -1 error.
static int plans_enabled(void) {
  PyObject *backend = PyDict_GetItemWithError(d_registry_globals, s_backend);
  if (backend == NULL) goto missing;
  int on = PyObject_RichCompareBool(backend, s_triton, Py_EQ);
  if (on <= 0) return on;
  PyObject *flags[2] = {d_plans_globals, d_launch_globals};
  for (int i = 0; i < 2; i++) {
    PyObject *flag = PyDict_GetItemWithError(flags[i], s_enabled);
    if (flag == NULL) goto missing;
    on = PyObject_IsTrue(flag);
    if (on <= 0) return on;
  }
  return 1;
missing:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "ge2_native: a dispatch flag is missing");
  return -1;
}

// 1 when a plan may launch from here: no recorder is listening and no launch hook is set; else 0 (-1 error).
static int launches_unobserved(void) {
  if (PyList_GET_SIZE(d_recorders) != 0) return 0;
  PyObject *names[2] = {s_enter_hook, s_exit_hook};
  for (int i = 0; i < 2; i++) {
    PyObject *hook = PyObject_GetAttr(d_knobs, names[i]);
    if (hook == NULL) return -1;
    int quiet = hook == Py_None;
    if (!quiet && (PyObject *)Py_TYPE(hook) == d_hookchain) {
      PyObject *calls = PyObject_GetAttr(hook, s_calls);
      Py_ssize_t n = calls ? PyObject_Length(calls) : -1;
      Py_XDECREF(calls);
      if (n < 0) {
        Py_DECREF(hook);
        return -1;
      }
      quiet = n == 0;
    }
    Py_DECREF(hook);
    if (!quiet) return 0;
  }
  return 1;
}

static int count_hit(PyObject *name) {
  PyObject *hits = PyDict_GetItemWithError(d_stats, name);
  if (hits == NULL) return PyErr_Occurred() ? -1 : 0;
  PyObject *more = PyNumber_Add(hits, one);
  if (more == NULL) return -1;
  int status = PyDict_SetItem(d_stats, name, more);
  Py_DECREF(more);
  return status;
}

static PyObject *data_address(PyObject *t, uint64_t *address) {
  PyObject *value = PyObject_CallMethodNoArgs(t, s_data_ptr);
  if (value == NULL) return NULL;
  *address = PyLong_AsUnsignedLongLong(value);
  Py_DECREF(value);
  return PyErr_Occurred() ? NULL : t;
}

// Run `r` on these inputs (their tensors' addresses in `in_ptrs`): 1 with *out set, 0 when this
// thread has no CUDA context (nothing done: the plan's Python replay runs), -1 on error.
static int run_replay(Replay *r, PyObject *const *inputs, const uint64_t *in_ptrs, PyObject **out) {
  CUcontext context = NULL;
  ctx_get_current(&context);
  if (context == NULL) return 0;
  PyObject *sources[MAX_SOURCES];
  uint64_t addresses[MAX_SOURCES], launch_args[MAX_PARAMS];
  Py_ssize_t made = 0;
  int status = -1;
  for (Py_ssize_t k = 0; k < r->n_in; k++) {
    sources[k] = inputs[r->in_index[k]];
    addresses[k] = in_ptrs[k];
  }
  for (Py_ssize_t j = 0; j < r->n_out; j++, made++) {
    PyObject *t;
    if (r->out_like[j] >= 0) {
      t = PyObject_CallOneArg(d_empty_like, sources[r->out_like[j]]);
    } else {
      PyObject *spec = PyTuple_GET_ITEM(r->out_args, j);
      PyObject *argv[4] = {PyTuple_GET_ITEM(spec, 0), PyTuple_GET_ITEM(spec, 1), PyTuple_GET_ITEM(spec, 2),
                           PyTuple_GET_ITEM(spec, 3)};
      t = PyObject_Vectorcall(d_empty_strided, argv, 2, s_empty_kwnames);
    }
    if (t == NULL) goto done;
    sources[r->n_in + j] = t;
    if (data_address(t, &addresses[r->n_in + j]) == NULL) {
      made++;
      goto done;
    }
  }
  PyObject *device = PyObject_CallNoArgs(d_get_device);
  if (device == NULL) goto done;
  PyObject *stream_value = PyObject_CallOneArg(d_get_stream, device);
  Py_DECREF(device);
  if (stream_value == NULL) goto done;
  CUstream stream = (CUstream)(uintptr_t)PyLong_AsUnsignedLongLong(stream_value);
  Py_DECREF(stream_value);
  if (PyErr_Occurred()) goto done;
  for (Py_ssize_t i = 0; i < r->n_launch; i++) {
    Py_ssize_t n = 0;
    for (Py_ssize_t a = r->first[i]; a < r->first[i + 1]; a++)
      launch_args[n++] = addresses[r->address_src[a]] + (uint64_t)r->address_delta[a];
    int launched = launch_addresses((Launch *)PyTuple_GET_ITEM(r->launches, i), stream, launch_args);
    if (launched < 0) goto done;
    if (launched == 0) {
      PyErr_SetString(PyExc_RuntimeError, "ge2_native: the CUDA context went away during a replay");
      goto done;
    }
  }
  if (PyLong_Check(r->result)) {
    *out = Py_NewRef(sources[PyLong_AsSsize_t(r->result)]);
  } else {
    PyObject *items = PyTuple_GET_ITEM(r->result, 1);
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    int is_list = PyObject_IsTrue(PyTuple_GET_ITEM(r->result, 0));
    PyObject *built = is_list ? PyList_New(n) : PyTuple_New(n);
    if (built == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject *item = PyTuple_GET_ITEM(items, i), *value = PyTuple_GET_ITEM(item, 1);
      if (PyObject_IsTrue(PyTuple_GET_ITEM(item, 0))) value = sources[PyLong_AsSsize_t(value)];
      if (is_list)
        PyList_SET_ITEM(built, i, Py_NewRef(value));
      else
        PyTuple_SET_ITEM(built, i, Py_NewRef(value));
    }
    *out = built;
  }
  if (count_hit(s_hits) < 0 || count_hit(s_native_hits) < 0) {
    Py_CLEAR(*out);
    goto done;
  }
  status = 1;
done:
  for (Py_ssize_t j = 0; j < made; j++) Py_DECREF(sources[r->n_in + j]);
  return status;
}

static PyObject *tuple_of(PyObject *const *items, Py_ssize_t n) {
  PyObject *t = PyTuple_New(n);
  if (t != NULL)
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(t, i, Py_NewRef(items[i]));
  return t;
}

// A recorded call: its Replay when nothing observes launches and the thread has a CUDA context,
// else the plan's generated Python replay.
static PyObject *replay_plan(PyObject *plan, PyObject *const *inputs, Py_ssize_t n, const uint64_t *ptrs) {
  PyObject *native = PyObject_GetAttr(plan, s_native), *result = NULL;
  if (native == NULL) return NULL;
  if (Py_TYPE(native) == &ReplayType) {
    int open = launches_unobserved();
    int ran = open > 0 ? run_replay((Replay *)native, inputs, ptrs, &result) : open;
    if (ran != 0) {
      Py_DECREF(native);
      return result;
    }
  }
  Py_DECREF(native);
  PyObject *replay = PyObject_GetAttr(plan, s_replay), *args = replay ? tuple_of(inputs, n) : NULL;
  if (args != NULL) result = PyObject_CallOneArg(replay, args);
  Py_XDECREF(replay);
  Py_XDECREF(args);
  return result;
}

// call(op, *inputs, **attrs): the registry's entry (ge2.backend.registry.call). A call whose key has a
// plan replays it; any other call goes to the registry's Python (schema check, dispatch, recording).
static PyObject *dispatch_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), n = nargs - 1;
  if (nargs < 1 || d_plans == NULL) {
    PyErr_SetString(PyExc_TypeError, "call(op, *inputs, **attrs), after set_dispatch");
    return NULL;
  }
  PyObject *const *inputs = args + 1;
  uint64_t stack_ptrs[16];
  uint64_t *ptrs = n <= 16 ? stack_ptrs : PyMem_Malloc(sizeof(uint64_t) * n);
  PyObject *key = NULL, *result = NULL;
  if (!ptrs) return PyErr_NoMemory();
  int on = plans_enabled();
  if (on < 0) goto done;
  if (on) {
    PyObject *precision = PyDict_GetItemWithError(d_runtime_globals, s_precision);
    if (precision == NULL) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "ge2_native: runtime._matmul_precision is missing");
      goto done;
    }
    key = build_key(args[0], precision, inputs, n, NULL, kwnames, args + nargs, ptrs);
    if (key == NULL) goto done;
    if (key != Py_None) {
      PyObject *plan = PyDict_GetItemWithError(d_plans, key);
      if (plan != NULL) {
        Py_INCREF(plan);  // a replay may clear the table
        result = replay_plan(plan, inputs, n, ptrs);
        Py_DECREF(plan);
        goto done;
      }
      if (PyErr_Occurred()) goto done;
    }
  } else {
    key = Py_NewRef(Py_None);
  }
  PyObject *tuple = tuple_of(inputs, n), *attrs = tuple ? PyDict_New() : NULL;
  if (attrs != NULL) {
    Py_ssize_t n_kw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < n_kw; i++) {
      if (PyDict_SetItem(attrs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
        Py_CLEAR(attrs);
        break;
      }
    }
    if (attrs != NULL) {
      PyObject *argv[4] = {args[0], tuple, attrs, key};
      result = PyObject_Vectorcall(d_slow, argv, 4, NULL);
    }
  }
  Py_XDECREF(tuple);
  Py_XDECREF(attrs);
done:
  Py_XDECREF(key);
  if (ptrs != stack_ptrs) PyMem_Free(ptrs);
  return result;
}

// ---- Function.apply without recording -----------------------------------------------------------

// set_autograd: ge2 Tensor, Context, Version, grad mode's thread-local state, the Python apply (which
// records), torch.Tensor; the byte offsets of Tensor's slots.
static PyTypeObject *a_tensor = NULL;
static PyObject *a_context, *a_version, *a_grad_state, *a_python_apply, *a_torch_tensor;
static PyObject *s_forward, *s_base, *s_grad_enabled, *zero;
enum { SLOT_DATA, SLOT_REQUIRES_GRAD, SLOT_GRAD, SLOT_GRAD_FN, SLOT_OUT_IDX, SLOT_VERSION, N_SLOTS };
static const char *slot_names[N_SLOTS] = {"data", "_requires_grad", "grad", "grad_fn", "_out_idx", "_version_counter"};
static Py_ssize_t slot_offset[N_SLOTS];
#define MAX_APPLY_ARGS 16  // more arguments: the Python apply
static PyObject *no_grad_needs[MAX_APPLY_ARGS];  // (False,) * n

static PyObject *set_autograd(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyType_Check(args[0]) || !PyType_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError, "set_autograd(Tensor, Context, Version, grad_state, python_apply, torch.Tensor)");
    return NULL;
  }
  PyTypeObject *tensor = (PyTypeObject *)args[0];
  for (int i = 0; i < N_SLOTS; i++) {  // each must be a __slots__ member holding an object
    PyObject *member = PyObject_GetAttrString(args[0], slot_names[i]);
    if (member == NULL) return NULL;
    int ok = Py_TYPE(member) == &PyMemberDescr_Type &&
             ((PyMemberDescrObject *)member)->d_member->type == T_OBJECT_EX;
    if (ok) slot_offset[i] = ((PyMemberDescrObject *)member)->d_member->offset;
    Py_DECREF(member);
    if (!ok) {
      PyErr_Format(PyExc_TypeError, "set_autograd: %s.%s is not a __slots__ member", tensor->tp_name, slot_names[i]);
      return NULL;
    }
  }
  for (Py_ssize_t n = 0; n < MAX_APPLY_ARGS; n++) {
    if (no_grad_needs[n] != NULL) continue;
    no_grad_needs[n] = PyTuple_New(n);
    if (no_grad_needs[n] == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) PyTuple_SET_ITEM(no_grad_needs[n], i, Py_NewRef(Py_False));
  }
  Py_XSETREF(a_tensor, (PyTypeObject *)Py_NewRef(args[0]));
  Py_XSETREF(a_context, Py_NewRef(args[1]));
  Py_XSETREF(a_version, Py_NewRef(args[2]));
  Py_XSETREF(a_grad_state, Py_NewRef(args[3]));
  Py_XSETREF(a_python_apply, Py_NewRef(args[4]));
  Py_XSETREF(a_torch_tensor, Py_NewRef(args[5]));
  Py_RETURN_NONE;
}

#define SLOT(obj, i) (*(PyObject **)((char *)(obj) + slot_offset[i]))

// A Tensor slot's value (borrowed), or NULL with AttributeError when it was never set.
static PyObject *get_slot(PyObject *t, int i) {
  PyObject *v = SLOT(t, i);
  if (v == NULL) PyErr_Format(PyExc_AttributeError, "Tensor has no attribute '%s'", slot_names[i]);
  return v;
}

// The tensor owning `t`'s memory: t._base, or t itself (a new reference).
static PyObject *root_of(PyObject *t) {
  PyObject *base = PyObject_GetAttr(t, s_base);
  if (base == Py_None) {
    Py_DECREF(base);
    return Py_NewRef(t);
  }
  return base;
}

// tensor._wrap: `data` as a Tensor without a grad_fn, sharing the version counter of the input whose
// memory it is (the input itself, a view of it, or the base of an input that is a view).
static PyObject *wrap(PyObject *data, PyObject *const *inputs, Py_ssize_t n) {
  if (!PyObject_TypeCheck(data, (PyTypeObject *)a_torch_tensor)) {
    PyErr_Format(PyExc_TypeError, "Function.apply: forward returned %.100s where a torch.Tensor was expected",
                 Py_TYPE(data)->tp_name);
    return NULL;
  }
  PyObject *base = PyObject_GetAttr(data, s_base), *version = NULL;
  if (base == NULL) return NULL;
  for (Py_ssize_t i = 0; i < n && version == NULL; i++) {
    PyObject *x = get_slot(inputs[i], SLOT_DATA);
    if (x == NULL) goto fail;
    int shares;
    if (base == Py_None) {  // not a view: only an input that is this very tensor or a view of it shares memory
      shares = x == data;
      if (!shares) {
        PyObject *x_base = PyObject_GetAttr(x, s_base);
        if (x_base == NULL) goto fail;
        shares = x_base == data;
        Py_DECREF(x_base);
      }
    } else {
      PyObject *root = root_of(x);
      if (root == NULL) goto fail;
      shares = root == base;
      Py_DECREF(root);
    }
    if (shares && (version = get_slot(inputs[i], SLOT_VERSION)) == NULL) goto fail;
  }
  version = version ? Py_NewRef(version) : PyObject_CallNoArgs(a_version);
  if (version == NULL) goto fail;
  Py_DECREF(base);
  PyObject *t = a_tensor->tp_alloc(a_tensor, 0);
  if (t == NULL) {
    Py_DECREF(version);
    return NULL;
  }
  SLOT(t, SLOT_DATA) = Py_NewRef(data);
  SLOT(t, SLOT_REQUIRES_GRAD) = Py_NewRef(Py_False);
  SLOT(t, SLOT_GRAD) = Py_NewRef(Py_None);
  SLOT(t, SLOT_GRAD_FN) = Py_NewRef(Py_None);
  SLOT(t, SLOT_OUT_IDX) = Py_NewRef(zero);
  SLOT(t, SLOT_VERSION) = version;
  return t;
fail:
  Py_DECREF(base);
  return NULL;
}

// 1 when grad mode is on in this thread (grad_mode.is_grad_enabled), 0 off, -1 error.
static int grad_enabled(void) {
  PyObject *enabled = PyObject_GetAttr(a_grad_state, s_grad_enabled);
  if (enabled == NULL) {
    if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
    PyErr_Clear();  // never set in this thread: on
    return 1;
  }
  int on = PyObject_IsTrue(enabled);
  Py_DECREF(enabled);
  return on;
}

// apply(cls, *args): Function.apply. When an input Tensor requires grad and grad mode is on, the Python
// apply records the call; otherwise forward(ctx, *raw) runs with a context saying no input needs a
// gradient and its output (or each of its outputs) comes back as a Tensor.
static PyObject *function_apply(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (a_tensor == NULL || nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "apply(cls, *args), after set_autograd");
    return NULL;
  }
  Py_ssize_t n = nargs - 1, n_tensors = 0;
  if (n >= MAX_APPLY_ARGS) return PyObject_Vectorcall(a_python_apply, args, nargs, NULL);
  PyObject *raw[MAX_APPLY_ARGS], *tensors[MAX_APPLY_ARGS];
  int needs = 0;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *a = args[i + 1];
    raw[i + 1] = a;
    if (!PyObject_TypeCheck(a, a_tensor)) continue;
    tensors[n_tensors++] = a;
    PyObject *data = get_slot(a, SLOT_DATA), *requires = data ? get_slot(a, SLOT_REQUIRES_GRAD) : NULL;
    if (requires == NULL) return NULL;
    raw[i + 1] = data;
    if (!needs && (needs = PyObject_IsTrue(requires)) < 0) return NULL;
  }
  if (needs && (needs = grad_enabled()) != 0)
    return needs < 0 ? NULL : PyObject_Vectorcall(a_python_apply, args, nargs, NULL);
  PyObject *ctx = PyObject_CallOneArg(a_context, no_grad_needs[n]);
  if (ctx == NULL) return NULL;
  PyObject *forward = PyObject_GetAttr(args[0], s_forward), *out = NULL, *result = NULL;
  if (forward != NULL) {
    raw[0] = ctx;
    out = PyObject_Vectorcall(forward, raw, n + 1, NULL);
    Py_DECREF(forward);
  }
  Py_DECREF(ctx);
  if (out == NULL) return NULL;
  if (PyObject_TypeCheck(out, (PyTypeObject *)a_torch_tensor)) {
    result = wrap(out, tensors, n_tensors);
  } else {
    PyObject *items = PySequence_Fast(out, "Function.apply: forward must return a tensor or a sequence of them");
    if (items != NULL) {
      Py_ssize_t k = PySequence_Fast_GET_SIZE(items);
      result = PyTuple_New(k);
      for (Py_ssize_t i = 0; result != NULL && i < k; i++) {
        PyObject *t = wrap(PySequence_Fast_GET_ITEM(items, i), tensors, n_tensors);
        if (t == NULL) Py_CLEAR(result);
        else PyTuple_SET_ITEM(result, i, t);
      }
      Py_DECREF(items);
    }
  }
  Py_DECREF(out);
  return result;
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(plan, stream, *addresses) -> True, or False when this thread has no CUDA context"},
    {"call_key", (PyCFunction)(void (*)(void))call_key, METH_FASTCALL,
     "call_key(op, precision, inputs, attrs) -> the call key (ge2.backend.call_plans.key), or None"},
    {"set_types", (PyCFunction)(void (*)(void))set_types, METH_FASTCALL, "set_types(torch.Tensor, torch.dtype)"},
    {"call", (PyCFunction)(void (*)(void))dispatch_call, METH_FASTCALL | METH_KEYWORDS,
     "call(op, *inputs, **attrs): a recorded call's replay, else the registry's Python path"},
    {"set_dispatch", (PyCFunction)set_dispatch, METH_VARARGS,
     "set_dispatch(plans, slow, stats, recorders, runtime knobs, HookChain, get_device, get_stream, empty_like, "
     "empty_strided, registry, call_plans, launch and runtime module globals)"},
    {"set_autograd", (PyCFunction)(void (*)(void))set_autograd, METH_FASTCALL,
     "set_autograd(Tensor, Context, Version, grad_state, python_apply, torch.Tensor)"},
    {"apply", (PyCFunction)(void (*)(void))function_apply, METH_FASTCALL,
     "apply(cls, *args): Function.apply, recording through the Python apply when a gradient is needed"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ge2_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

static PyObject *intern(const char *text) { return PyUnicode_InternFromString(text); }

PyMODINIT_FUNC PyInit_ge2_native(void) {
  if (PyType_Ready(&LaunchType) < 0 || PyType_Ready(&ReplayType) < 0) return NULL;
  s_shape = intern("shape"), s_stride = intern("stride"), s_dtype = intern("dtype"), s_device = intern("device");
  s_data_ptr = intern("data_ptr"), s_backend = intern("_backend"), s_enabled = intern("ENABLED");
  s_precision = intern("_matmul_precision"), s_triton = intern("triton"), s_native = intern("native");
  s_replay = intern("replay"), s_hits = intern("hits"), s_native_hits = intern("native");
  s_enter_hook = intern("launch_enter_hook"), s_exit_hook = intern("launch_exit_hook"), s_calls = intern("calls");
  s_forward = intern("forward"), s_base = intern("_base"), s_grad_enabled = intern("enabled");
  one = PyLong_FromLong(1), zero = PyLong_FromLong(0);
  if (!s_forward || !s_base || !s_grad_enabled || !zero ||
      !s_shape || !s_stride || !s_dtype || !s_device || !s_data_ptr || !s_backend || !s_enabled || !s_precision ||
      !s_triton || !s_native || !s_replay || !s_hits || !s_native_hits || !s_enter_hook || !s_exit_hook || !s_calls ||
      !one)
    return NULL;
  s_empty_kwnames = PyTuple_Pack(2, s_dtype, s_device);
  if (s_empty_kwnames == NULL) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  if (PyModule_AddObjectRef(m, "Launch", (PyObject *)&LaunchType) < 0 ||
      PyModule_AddObjectRef(m, "Replay", (PyObject *)&ReplayType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
