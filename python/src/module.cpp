// python/src/module.cpp: lockstep._C, the bindings behind `import lockstep`.
#include "backend.h"

#include <lockstep/compress/policy.h>
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
      .def_property_readonly("transport", &lockstep::python::LockstepBackend::transport)
      .def_property_readonly("_lockstep_timeout_s", &lockstep::python::LockstepBackend::timeout_s)
      .def("_lockstep_shutdown", &lockstep::python::LockstepBackend::shutdown);

  m.def(
      "_create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s,
         const std::string& transport) {
        return c10::make_intrusive<lockstep::python::LockstepBackend>(
            store, rank, size, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000.0)),
            transport);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
      py::arg("transport"), py::call_guard<py::gil_scoped_release>(),
      "The lockstep c10d backend of one group (rendezvous through `store`).");

  // Compression (lockstep.compression()): LOCKSTEP_COMPRESSION_* override what is passed,
  // as in the C++ API (include/lockstep/compress/policy.h).
  m.def(
      "_set_compression",
      [](int bits, int64_t bucket_size, int64_t min_numel, bool stochastic, bool error_feedback,
         uint64_t seed, int64_t pipeline_chunk) {
        lockstep::compress::QsgdOptions o;
        o.bits = bits;
        o.bucket_size = bucket_size;
        o.min_layer = min_numel;
        o.exclude.clear();  // a backend sees buffers, not layer names
        o.stochastic = stochastic;
        o.error_feedback = error_feedback;
        o.seed = seed;
        o.pipeline_chunk = pipeline_chunk;
        lockstep::python::set_compression(std::make_shared<const lockstep::compress::QsgdOptions>(
            lockstep::compress::apply_env(o)));
      },
      py::arg("bits"), py::arg("bucket_size"), py::arg("min_numel"), py::arg("stochastic"),
      py::arg("error_feedback"), py::arg("seed"), py::arg("pipeline_chunk"));
  m.def("_compression_off", [] { lockstep::python::set_compression(nullptr); });
  // At import: LOCKSTEP_COMPRESSION_BITS alone turns compression on for an unchanged script.
  m.def("_compression_from_env", [] {
    auto o = lockstep::compress::options_from_env();
    if (!o) return false;
    o->exclude.clear();
    lockstep::python::set_compression(std::make_shared<const lockstep::compress::QsgdOptions>(*o));
    return true;
  });
  m.def("_compression", []() -> py::object {
    auto o = lockstep::python::compression();
    if (!o) return py::none();
    py::dict d;
    d["bits"] = o->bits;
    d["bucket_size"] = o->bucket_size;
    d["min_numel"] = o->min_layer;
    d["stochastic"] = o->stochastic;
    d["error_feedback"] = o->error_feedback;
    d["seed"] = o->seed;
    d["pipeline_chunk"] = o->pipeline_chunk;
    return d;
  });
}
