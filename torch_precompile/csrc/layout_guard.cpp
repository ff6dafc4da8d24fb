// torch_precompile._C_<torch version>: the driver's per-call tensor check, in C++.
//
// LayoutGuard(tensors, sizes, strides) records what Dynamo's TensorGuards
// records of each tensor -- its Python type, dispatch keys (with this
// thread's included/excluded keys applied), dtype, device, requires_grad,
// dim, and the sizes and strides not left free (None) -- and
//
//   check(*tensors)                 -> bool
//   gather(tables, names, inputs)   -> list | None   (inputs: a tuple or list)
//
// check() compares as TensorGuards.check() does; gather() first looks up
// tables[i][names[i]] (a module's _parameters / _buffers dict and a key, as
// dict.__getitem__ does), appends inputs, and returns that list when every
// tensor passes, else None (a missing key included, and any torch function
// or dispatch mode active on this thread: the call's slow path refuses it,
// which keeps that test off the per-call path).  Why not TensorGuards:
// it costs ~63 ns a tensor (SymInt sizes, optional compares), this ~10 ns, and
// the lookup here saves the ~25 ns a tensor of map(dict.__getitem__, ...):
// a 100-parameter model's check drops from ~9 us to ~2 us
// (benchmarks/soundness_overhead.py).
//
// And the module cache's re-verification (_ModuleCache.watched_unchanged),
// one C loop instead of four maps:
//
//   entries_unchanged(owners, keys, values, sized, lengths, missing) -> bool
//     owners[i].get(keys[i], missing) is values[i] for each i, and
//     len(sized[j]) == lengths[j] for each j, where lengths[j] is an int;
//     where it is a tuple (version, *values), sized[j] is a dict holding
//     exactly those values, in order, by identity (the submodules under a
//     _modules dict).  version is dict_version(sized[j]) when recorded: equal,
//     the dict was not written since, and its values are not compared.
//
//   dict_version(d) -> int
//     CPython's per-dict version tag (PEP 509; changes with every write to
//     the dict) where this Python has one, else 0 (never equal: values compared).
//
//   classes_unchanged(objects, refs, classes) -> bool
//     [*map(type, objects), *(type(ref()) for ref in refs)] == classes, by
//     identity (NoneType for a referent that is gone): ``m.__class__ =
//     Other`` writes no dict, so only the object's class shows it.
//
// ABI_VERSION (a module int) moves whenever a signature or meaning changes:
// 2 added the tuple form of lengths[j] and dict_version; 3, gather() None
// under a torch function or dispatch mode.  A function added keeps it
// (classes_unchanged: drivers look it up by name, and older ones use the
// rest as before).  A driver (the copy
// an artifact carries included) uses the extension only at an ABI it names
// (DRIVER_ABIS in torch/_precompile_runtime.py); at any other it checks with
// TensorGuards and Python loops, as without the extension.
//
// Built by setup.py against the installed torch, whose version names the
// module (venvs with different torch may share an editable checkout) and is
// checked again at import: under another torch it raises ImportError and the
// driver uses TensorGuards (torch/_precompile_runtime.py, _LayoutGuard).  The
// driver also runs without it (an artifact where only torch is installed).
#include <Python.h>

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <memory>
#include <vector>

#if !defined(PRECOMPILE_TORCH_VERSION) || !defined(PRECOMPILE_MODULE)
#error "setup.py defines PRECOMPILE_TORCH_VERSION (the torch version this is built against) and PRECOMPILE_MODULE"
#endif
#define PRECOMPILE_STRING(x) PRECOMPILE_STRING_(x)
#define PRECOMPILE_STRING_(x) #x
#define PRECOMPILE_INIT(name) PRECOMPILE_INIT_(name)
#define PRECOMPILE_INIT_(name) PyInit_##name

namespace {

constexpr int64_t kFree = -1;  // a size or stride the check leaves free

struct Expected {
  PyTypeObject* type;  // a strong reference (release()): a freed subclass's address may be reused
  uint64_t keys;  // raw dispatch keys, thread-local keys applied
  c10::ScalarType dtype;
  c10::Device device;
  bool requires_grad;
  // Inline up to 5 dims: no pointer to chase per tensor (the check is memory-bound).
  c10::SmallVector<int64_t, 5> sizes;  // kFree where free
  c10::SmallVector<int64_t, 5> strides;
};

uint64_t keys_now(const c10::TensorImpl* impl, const c10::impl::LocalDispatchKeySet& local) {
  return ((impl->key_set() | local.included_) - local.excluded_).raw_repr();
}

bool same_layout(const Expected& want, const c10::TensorImpl* impl, const c10::impl::LocalDispatchKeySet& local) {
  if (keys_now(impl, local) != want.keys || impl->dtype().toScalarType() != want.dtype ||
      impl->device() != want.device || impl->requires_grad() != want.requires_grad) {
    return false;
  }
  // Same keys as recorded: a strided tensor with concrete sizes (the constructor refused others).
  c10::IntArrayRef sizes = impl->sizes(), strides = impl->strides();
  size_t dim = want.sizes.size();
  if (sizes.size() != dim) {
    return false;
  }
  for (size_t i = 0; i < dim; ++i) {
    if ((want.sizes[i] != kFree && want.sizes[i] != sizes[i]) ||
        (want.strides[i] != kFree && want.strides[i] != strides[i])) {
      return false;
    }
  }
  return true;
}

bool passes(const Expected& want, PyObject* obj, const c10::impl::LocalDispatchKeySet& local) noexcept {
  if (Py_TYPE(obj) != want.type) {  // also any non-tensor: its type was never recorded
    return false;
  }
  try {
    return same_layout(want, THPVariable_Unpack(obj).unsafeGetTensorImpl(), local);
  } catch (...) {  // no C++ exception may cross into Python: a tensor it cannot read fails the check
    return false;
  }
}

struct LayoutGuard {
  PyObject_HEAD
  std::vector<Expected>* expected;
};

// A list of ints and Nones, one per dim; None -> kFree.
bool read_dims(PyObject* list, size_t dim, c10::SmallVector<int64_t, 5>& out) {
  if (!PyList_Check(list) || static_cast<size_t>(PyList_GET_SIZE(list)) != dim) {
    PyErr_SetString(PyExc_ValueError, "LayoutGuard: expected a list of ints or None, one per dim");
    return false;
  }
  for (size_t i = 0; i < dim; ++i) {
    PyObject* item = PyList_GET_ITEM(list, i);
    int64_t value = item == Py_None ? kFree : PyLong_AsLongLong(item);
    if (value == -1 && PyErr_Occurred()) {
      return false;
    }
    out.push_back(value);
  }
  return true;
}

int record(LayoutGuard* self, PyObject* tensors, PyObject* sizes, PyObject* strides);

void release(std::vector<Expected>* expected) {
  if (expected != nullptr) {
    for (const Expected& want : *expected) {
      Py_DECREF(want.type);
    }
    delete expected;
  }
}

int LayoutGuard_init(LayoutGuard* self, PyObject* args, PyObject* kwargs) {
  PyObject *tensors, *sizes, *strides;
  if (kwargs != nullptr || !PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &tensors, &PyList_Type, &sizes,
                                             &PyList_Type, &strides)) {
    if (!PyErr_Occurred()) {
      PyErr_SetString(PyExc_TypeError, "LayoutGuard(tensors, sizes, strides) takes three lists");
    }
    return -1;
  }
  try {
    return record(self, tensors, sizes, strides);
  } catch (const std::exception& error) {
    PyErr_Format(PyExc_TypeError, "LayoutGuard: %s", error.what());
    return -1;
  }
}

int record(LayoutGuard* self, PyObject* tensors, PyObject* sizes, PyObject* strides) {
  Py_ssize_t n = PyList_GET_SIZE(tensors);
  if (PyList_GET_SIZE(sizes) != n || PyList_GET_SIZE(strides) != n) {
    PyErr_SetString(PyExc_ValueError, "LayoutGuard: tensors, sizes and strides differ in length");
    return -1;
  }
  // Released (the types' references dropped) on every early return.
  std::unique_ptr<std::vector<Expected>, decltype(&release)> expected(new std::vector<Expected>(), &release);
  expected->reserve(n);
  auto local = c10::impl::tls_local_dispatch_key_set();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* obj = PyList_GET_ITEM(tensors, i);
    if (!THPVariable_Check(obj)) {
      PyErr_Format(PyExc_TypeError, "LayoutGuard: item %zd is not a tensor", i);
      return -1;
    }
    const c10::TensorImpl* impl = THPVariable_Unpack(obj).unsafeGetTensorImpl();
    // Only what sizes()/strides() read without a Python call or an error:
    // dense strided tensors, no Python dispatch (subclasses, fake tensors),
    // no symbolic sizes.  Others keep TensorGuards (TypeError: the caller's cue).
    if (impl->layout() != c10::kStrided || impl->is_nested() || impl->has_symbolic_sizes_strides() ||
        impl->key_set().has(c10::DispatchKey::Python) || impl->is_python_dispatch()) {
      PyErr_Format(PyExc_TypeError, "LayoutGuard: item %zd is not a plain strided tensor", i);
      return -1;
    }
    Expected want{Py_TYPE(obj), keys_now(impl, local), impl->dtype().toScalarType(), impl->device(),
                  impl->requires_grad(), {}, {}};
    size_t dim = impl->dim();
    if (!read_dims(PyList_GET_ITEM(sizes, i), dim, want.sizes) ||
        !read_dims(PyList_GET_ITEM(strides, i), dim, want.strides)) {
      return -1;
    }
    Py_INCREF(want.type);
    expected->push_back(std::move(want));
  }
  release(self->expected);
  self->expected = expected.release();
  return 0;
}

void LayoutGuard_dealloc(LayoutGuard* self) {
  release(self->expected);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

bool armed(const LayoutGuard* self) {
  if (self->expected == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "LayoutGuard was not initialised");
    return false;
  }
  return true;
}

PyObject* LayoutGuard_check(LayoutGuard* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!armed(self)) {
    return nullptr;
  }
  const auto& expected = *self->expected;
  if (static_cast<size_t>(nargs) != expected.size()) {
    Py_RETURN_FALSE;
  }
  auto local = c10::impl::tls_local_dispatch_key_set();
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (!passes(expected[i], args[i], local)) {
      Py_RETURN_FALSE;
    }
  }
  Py_RETURN_TRUE;
}

PyObject* LayoutGuard_gather(LayoutGuard* self, PyObject* const* args, Py_ssize_t nargs) {
  if (!armed(self)) {
    return nullptr;
  }
  if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) ||
      !(PyTuple_Check(args[2]) || PyList_Check(args[2]))) {
    PyErr_SetString(PyExc_TypeError, "gather(tables: list, names: list, inputs: tuple | list)");
    return nullptr;
  }
  if (at::impl::torch_function_mode_enabled() || c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    Py_RETURN_NONE;
  }
  PyObject *tables = args[0], *names = args[1], *inputs = args[2];
  Py_ssize_t num_state = PyList_GET_SIZE(tables), num_inputs = PySequence_Fast_GET_SIZE(inputs);
  const auto& expected = *self->expected;
  if (PyList_GET_SIZE(names) != num_state || static_cast<size_t>(num_state + num_inputs) != expected.size()) {
    Py_RETURN_NONE;
  }
  auto local = c10::impl::tls_local_dispatch_key_set();
  PyObject* gathered = PyList_New(num_state + num_inputs);
  if (gathered == nullptr) {
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < num_state + num_inputs; ++i) {
    PyObject* item;
    if (i < num_state) {
      PyObject* table = PyList_GET_ITEM(tables, i);
      // A borrowed reference, as dict.__getitem__ finds it (a dict subclass's own __getitem__ is not called).
      item = PyDict_Check(table) ? PyDict_GetItemWithError(table, PyList_GET_ITEM(names, i)) : nullptr;
      if (item == nullptr) {  // deleted (del module.weight): the slow path names it
        Py_DECREF(gathered);
        if (PyErr_Occurred()) {
          return nullptr;
        }
        Py_RETURN_NONE;
      }
    } else {
      item = PySequence_Fast_GET_ITEM(inputs, i - num_state);
    }
    if (!passes(expected[i], item, local)) {
      Py_DECREF(gathered);
      Py_RETURN_NONE;
    }
    Py_INCREF(item);
    PyList_SET_ITEM(gathered, i, item);
  }
  return gathered;
}

// PEP 509's tag: public (deprecated since 3.12) through CPython 3.13; 0 where absent.
uint64_t dict_version(PyObject* dict) {
#if PY_VERSION_HEX < 0x030E0000
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  return reinterpret_cast<PyDictObject*>(dict)->ma_version_tag;
#pragma GCC diagnostic pop
#else
  (void)dict;
  return 0;
#endif
}

PyObject* dict_version_of(PyObject*, PyObject* dict) {
  if (!PyDict_Check(dict)) {
    PyErr_SetString(PyExc_TypeError, "dict_version(d): expected a dict");
    return nullptr;
  }
  return PyLong_FromUnsignedLongLong(dict_version(dict));
}

PyObject* entries_unchanged(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
      !PyList_Check(args[3]) || !PyList_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError, "entries_unchanged(owners, keys, values, sized, lengths: list, missing)");
    return nullptr;
  }
  PyObject *owners = args[0], *keys = args[1], *values = args[2], *sized = args[3], *lengths = args[4];
  Py_ssize_t n = PyList_GET_SIZE(owners);
  if (PyList_GET_SIZE(keys) != n || PyList_GET_SIZE(values) != n || PyList_GET_SIZE(lengths) != PyList_GET_SIZE(sized)) {
    PyErr_SetString(PyExc_ValueError, "entries_unchanged: the lists differ in length");
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* owner = PyList_GET_ITEM(owners, i);
    if (!PyDict_Check(owner)) {
      PyErr_SetString(PyExc_TypeError, "entries_unchanged: owners holds a non-dict");
      return nullptr;
    }
    PyObject* value = PyDict_GetItemWithError(owner, PyList_GET_ITEM(keys, i));
    if (value == nullptr) {
      if (PyErr_Occurred()) {
        return nullptr;
      }
      value = args[5];  // absent: as dict.get(key, missing)
    }
    if (value != PyList_GET_ITEM(values, i)) {  // identity: a new value object, even an equal one, differs
      Py_RETURN_FALSE;
    }
  }
  for (Py_ssize_t j = 0; j < PyList_GET_SIZE(sized); ++j) {
    PyObject* expected = PyList_GET_ITEM(lengths, j);
    if (PyTuple_Check(expected)) {
      PyObject* dict = PyList_GET_ITEM(sized, j);
      if (!PyDict_Check(dict)) {
        PyErr_SetString(PyExc_TypeError, "entries_unchanged: a tuple of values is for a dict");
        return nullptr;
      }
      if (PyTuple_GET_SIZE(expected) < 1 || PyDict_GET_SIZE(dict) != PyTuple_GET_SIZE(expected) - 1) {
        Py_RETURN_FALSE;
      }
      uint64_t version = dict_version(dict);
      if (version != 0 && version == PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(expected, 0))) {
        continue;  // not written since it was recorded
      }
      if (PyErr_Occurred()) {
        return nullptr;
      }
      Py_ssize_t position = 0, i = 1;
      PyObject *key, *value;
      while (PyDict_Next(dict, &position, &key, &value)) {  // insertion order, as dict.values()
        if (value != PyTuple_GET_ITEM(expected, i++)) {
          Py_RETURN_FALSE;
        }
      }
      continue;
    }
    Py_ssize_t length = PyObject_Length(PyList_GET_ITEM(sized, j));
    Py_ssize_t want = PyLong_AsSsize_t(expected);
    if ((length == -1 || want == -1) && PyErr_Occurred()) {
      return nullptr;
    }
    if (length != want) {
      Py_RETURN_FALSE;
    }
  }
  Py_RETURN_TRUE;
}

// The class of a weakref's referent (NoneType once it is gone), or nullptr with an error set.
PyObject* referent_class(PyObject* ref) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* object = nullptr;
  if (PyWeakref_GetRef(ref, &object) < 0) {
    return nullptr;
  }
  PyObject* cls = reinterpret_cast<PyObject*>(object == nullptr ? Py_TYPE(Py_None) : Py_TYPE(object));
  Py_XDECREF(object);  // the class outlives this call: the caller's list holds it
  return cls;
#else
  return reinterpret_cast<PyObject*>(Py_TYPE(PyWeakref_GET_OBJECT(ref)));
#endif
}

PyObject* classes_unchanged(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2]) ||
      PyList_GET_SIZE(args[0]) + PyList_GET_SIZE(args[1]) != PyList_GET_SIZE(args[2])) {
    PyErr_SetString(PyExc_TypeError, "classes_unchanged(objects, refs, classes): lists, len(classes) the sum");
    return nullptr;
  }
  PyObject *objects = args[0], *refs = args[1], *classes = args[2];
  Py_ssize_t n = PyList_GET_SIZE(objects);
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(PyList_GET_ITEM(objects, i))) != PyList_GET_ITEM(classes, i)) {
      Py_RETURN_FALSE;
    }
  }
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(refs); ++i) {
    PyObject* ref = PyList_GET_ITEM(refs, i);
    if (!PyWeakref_CheckRef(ref)) {
      PyErr_SetString(PyExc_TypeError, "classes_unchanged: refs holds a non-weakref");
      return nullptr;
    }
    PyObject* cls = referent_class(ref);
    if (cls == nullptr) {
      return nullptr;
    }
    if (cls != PyList_GET_ITEM(classes, n + i)) {
      Py_RETURN_FALSE;
    }
  }
  Py_RETURN_TRUE;
}

PyMethodDef module_methods[] = {
    {"entries_unchanged", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(entries_unchanged)),
     METH_FASTCALL,
     "entries_unchanged(owners, keys, values, sized, lengths, missing) -> bool: "
     "owners[i].get(keys[i], missing) is values[i], and len(sized[j]) == lengths[j] (an int) or "
     "tuple(sized[j].values()) are lengths[j][1:] (a tuple), by identity"},
    {"classes_unchanged", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(classes_unchanged)),
     METH_FASTCALL,
     "classes_unchanged(objects, refs, classes) -> bool: the classes of objects, then of the referents "
     "of the weakrefs refs, are classes, by identity"},
    {"dict_version", reinterpret_cast<PyCFunction>(dict_version_of), METH_O,
     "dict_version(d) -> int: the dict's PEP 509 version tag, or 0 where this Python has none"},
    {nullptr, nullptr, 0, nullptr}};

PyMethodDef LayoutGuard_methods[] = {
    {"check", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(LayoutGuard_check)), METH_FASTCALL,
     "check(*tensors) -> bool: each tensor has the recorded type, keys, dtype, device, requires_grad and layout"},
    {"gather", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(LayoutGuard_gather)), METH_FASTCALL,
     "gather(tables, names, inputs) -> list | None: [tables[i][names[i]]..., *inputs] if all pass check()"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject LayoutGuardType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "torch_precompile." PRECOMPILE_STRING(PRECOMPILE_MODULE),
                          "The precompile driver's per-call checks (see layout_guard.cpp).", -1, module_methods};

// The running torch must be the one this was compiled against: TensorImpl's
// layout is not stable across releases.
bool same_torch() {
  PyObject* version_module = PyImport_ImportModule("torch.version");
  if (version_module == nullptr) {
    return false;
  }
  PyObject* version = PyObject_GetAttrString(version_module, "__version__");
  Py_DECREF(version_module);
  if (version == nullptr) {
    return false;
  }
  const char* running = PyUnicode_AsUTF8(version);
  if (running == nullptr) {
    Py_DECREF(version);
    return false;
  }
  if (std::strcmp(running, PRECOMPILE_TORCH_VERSION) != 0) {
    PyErr_Format(PyExc_ImportError,
                 "torch_precompile._C was built against torch %s but torch %s is running: reinstall "
                 "torch-precompile (pip install --no-build-isolation .) to rebuild it",
                 PRECOMPILE_TORCH_VERSION, running);
    Py_DECREF(version);
    return false;
  }
  Py_DECREF(version);
  return true;
}

}  // namespace

PyMODINIT_FUNC PRECOMPILE_INIT(PRECOMPILE_MODULE)(void) {
  if (!same_torch()) {
    return nullptr;
  }
  LayoutGuardType.tp_name = "torch_precompile." PRECOMPILE_STRING(PRECOMPILE_MODULE) ".LayoutGuard";
  LayoutGuardType.tp_basicsize = sizeof(LayoutGuard);
  LayoutGuardType.tp_flags = Py_TPFLAGS_DEFAULT;
  LayoutGuardType.tp_doc = "The recorded layout of a list of tensors, checked in one C++ call.";
  LayoutGuardType.tp_new = PyType_GenericNew;
  LayoutGuardType.tp_init = reinterpret_cast<initproc>(LayoutGuard_init);
  LayoutGuardType.tp_dealloc = reinterpret_cast<destructor>(LayoutGuard_dealloc);
  LayoutGuardType.tp_methods = LayoutGuard_methods;
  if (PyType_Ready(&LayoutGuardType) < 0) {
    return nullptr;
  }
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) {
    return nullptr;
  }
  Py_INCREF(&LayoutGuardType);
  if (PyModule_AddObject(module, "LayoutGuard", reinterpret_cast<PyObject*>(&LayoutGuardType)) < 0) {
    Py_DECREF(&LayoutGuardType);
    Py_DECREF(module);
    return nullptr;
  }
  if (PyModule_AddIntConstant(module, "ABI_VERSION", 3) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
