// ge2's compiled helpers for the repeated-call path of an op (ge2/backend/call_plans.py):
//
// * call_key: the call key of an op call, the same tuple call_plans.key builds in Python, without
//   the interpreter's per-item overhead (it runs on every op call);
// * Launch / launch: one CUDA launch of a compiled Triton kernel whose parameters were packed once,
//   with only the device addresses that change between calls passed in. Triton's own launcher
//   parses every kernel argument (constexprs included) from a Python tuple on every call.
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

#define MAX_PARAMS 256
#define MAX_STORAGE 4096

typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, CUfunction, void **, void **);
typedef CUresult (*ctx_get_t)(CUcontext *);
typedef CUresult (*error_string_t)(CUresult, const char **);
static launch_ex_t launch_ex = NULL;
static ctx_get_t ctx_get_current = NULL;
static error_string_t error_string = NULL;

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
  char *storage;
} Launch;

static void Launch_dealloc(Launch *self) {
  PyMem_Free(self->slots);
  PyMem_Free(self->storage);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

// Launch(function, (grid x, y, z), threads per block, shared bytes, cooperative, pdl,
//        storage: bytes, param offsets: tuple, slot offsets: tuple)
static int Launch_init(Launch *self, PyObject *args, PyObject *kwargs) {
  unsigned long long function;
  PyObject *offsets, *slots;
  const char *storage;
  Py_ssize_t storage_size;
  if (open_libcuda() < 0) return -1;
  if (!PyArg_ParseTuple(args, "K(III)IIppy#O!O!", &function, &self->grid[0], &self->grid[1], &self->grid[2],
                        &self->block, &self->shared, &self->cooperative, &self->pdl, &storage, &storage_size,
                        &PyTuple_Type, &offsets, &PyTuple_Type, &slots))
    return -1;
  self->function = (CUfunction)(uintptr_t)function;
  self->n_params = PyTuple_GET_SIZE(offsets);
  self->n_slots = PyTuple_GET_SIZE(slots);
  if (self->n_params > MAX_PARAMS || storage_size > MAX_STORAGE) {
    PyErr_Format(PyExc_ValueError, "Launch: %zd parameters in %zd bytes (at most %d in %d)", self->n_params,
                 storage_size, MAX_PARAMS, MAX_STORAGE);
    return -1;
  }
  PyMem_Free(self->storage);
  PyMem_Free(self->slots);
  self->storage = PyMem_Malloc(storage_size ? storage_size : 1);
  self->slots = PyMem_Malloc(sizeof(Py_ssize_t) * (self->n_slots ? self->n_slots : 1));
  if (!self->storage || !self->slots) {
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

// launch(plan, stream, *addresses): one cuLaunchKernelEx.
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
  // A copy of the block per call: another thread may launch the same plan while the GIL is released.
  _Alignas(16) char storage[MAX_STORAGE];
  void *params[MAX_PARAMS];
  memcpy(storage, plan->storage, plan->storage_size);
  for (Py_ssize_t i = 0; i < plan->n_slots; i++) {
    uint64_t address = PyLong_AsUnsignedLongLong(args[i + 2]);
    memcpy(storage + plan->slots[i], &address, 8);
  }
  if (PyErr_Occurred()) return NULL;
  for (Py_ssize_t i = 0; i < plan->n_params; i++) params[i] = storage + plan->param_offsets[i];

  CUcontext context = NULL;
  ctx_get_current(&context);
  if (context == NULL) {  // this thread never touched CUDA: the caller takes Triton's launcher instead
    Py_RETURN_FALSE;
  }
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
    return NULL;
  }
  Py_RETURN_TRUE;
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

// call_key(op, precision, inputs: tuple, attrs: dict) -> tuple, or None when something cannot be
// keyed. Item for item the tuple call_plans.key builds (see there for what each part is).
static PyObject *call_key(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyTuple_Check(args[2]) || !PyDict_Check(args[3]) || tensor_type == NULL) {
    PyErr_SetString(PyExc_TypeError, "call_key(op, precision, inputs: tuple, attrs: dict), after set_types");
    return NULL;
  }
  PyObject *inputs = args[2], *attrs = args[3];
  Py_ssize_t n = PyTuple_GET_SIZE(inputs), capacity = 2 + 6 * n + PyDict_GET_SIZE(attrs), count = 0;
  PyObject **items = PyMem_Malloc(sizeof(PyObject *) * capacity);
  unsigned long long *ptrs = PyMem_Malloc(sizeof(unsigned long long) * (n ? n : 1));
  PyObject *result = NULL;
  Py_ssize_t n_ptrs = 0;
  if (!items || !ptrs) {
    PyErr_NoMemory();
    goto done;
  }
  items[count++] = Py_NewRef(args[0]);
  items[count++] = Py_NewRef(args[1]);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *v = PyTuple_GET_ITEM(inputs, i);
    if ((PyObject *)Py_TYPE(v) == tensor_type) {
      PyObject *address = PyObject_CallMethodNoArgs(v, s_data_ptr);
      if (address == NULL) goto done;
      unsigned long long ptr = PyLong_AsUnsignedLongLong(address);
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
  PyObject *name, *v;
  while (PyDict_Next(attrs, &pos, &name, &v)) {
    PyObject *item;
    if (is_plain_scalar(v) || Py_TYPE(v) == &PyTuple_Type) {
      item = PyTuple_Pack(3, name, (PyObject *)Py_TYPE(v), v);
    } else if (Py_TYPE(v) == &PyFloat_Type) {
      PyObject *sign = PyFloat_FromDouble(copysign(1.0, PyFloat_AS_DOUBLE(v)));
      item = sign ? PyTuple_Pack(4, name, (PyObject *)&PyFloat_Type, v, sign) : NULL;
      Py_XDECREF(sign);
    } else if ((PyObject *)Py_TYPE(v) == dtype_type) {
      item = PyTuple_Pack(2, name, v);
    } else {
      result = Py_NewRef(Py_None);
      goto done;
    }
    if (item == NULL) goto done;
    items[count++] = item;
  }
  result = PyTuple_New(count);
  if (result != NULL) {
    for (Py_ssize_t i = 0; i < count; i++) PyTuple_SET_ITEM(result, i, items[i]);  // steals the references
    count = 0;
  }
done:
  for (Py_ssize_t i = 0; i < count; i++) Py_XDECREF(items[i]);
  PyMem_Free(items);
  PyMem_Free(ptrs);
  return result;
}

static PyMethodDef methods[] = {
    {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL,
     "launch(plan, stream, *addresses) -> True, or False when this thread has no CUDA context"},
    {"call_key", (PyCFunction)(void (*)(void))call_key, METH_FASTCALL,
     "call_key(op, precision, inputs, attrs) -> the call key (ge2.backend.call_plans.key), or None"},
    {"set_types", (PyCFunction)(void (*)(void))set_types, METH_FASTCALL, "set_types(torch.Tensor, torch.dtype)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "ge2_native", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_ge2_native(void) {
  if (PyType_Ready(&LaunchType) < 0) return NULL;
  s_shape = PyUnicode_InternFromString("shape");
  s_stride = PyUnicode_InternFromString("stride");
  s_dtype = PyUnicode_InternFromString("dtype");
  s_device = PyUnicode_InternFromString("device");
  s_data_ptr = PyUnicode_InternFromString("data_ptr");
  if (!s_shape || !s_stride || !s_dtype || !s_device || !s_data_ptr) return NULL;
  PyObject *m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  Py_INCREF(&LaunchType);
  if (PyModule_AddObject(m, "Launch", (PyObject *)&LaunchType) < 0) {
    Py_DECREF(&LaunchType);
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
