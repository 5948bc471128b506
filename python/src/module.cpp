// python/src/module.cpp: lockstep._C, the bindings behind `import lockstep`.
#include "backend.h"

#include <lockstep/error.h>

#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  // The base classes' bindings (c10d::Backend) must be registered before ours derive from them.
  py::module_::import("torch.distributed");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const lockstep::ConfigError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const lockstep::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const lockstep::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    }
  });

  py::class_<lockstep::python::LockstepBackend, c10d::Backend,
             c10::intrusive_ptr<lockstep::python::LockstepBackend>>(m, "LockstepBackend")
      .def_property_readonly("transport", &lockstep::python::LockstepBackend::transport);

  m.def(
      "_create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
         const std::string& transport) {
        return c10::make_intrusive<lockstep::python::LockstepBackend>(
            store, rank, size,
            std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)), transport);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
      py::arg("transport"), py::call_guard<py::gil_scoped_release>(),
      "The lockstep c10d backend of one group (rendezvous through `store`).");
}
