// module.cc — the pybind11 module dualemb._jax_ffi: hands the FFI handlers to Python as
// capsules for jax.ffi.register_ffi_target (dualemb/jax/_ffi.py registers them at import). The
// targets come from the one list, DUALEMB_JAX_FFI_TARGETS in ffi_handlers.h.
#include <pybind11/pybind11.h>

#include "dualemb_core.h"
#include "ffi_handlers.h"
#include "xla/ffi/api/c_api.h"

#ifndef DUALEMB_JAXLIB_VERSION
#error "DUALEMB_JAXLIB_VERSION (the jaxlib the FFI headers come from) is set by CMakeLists.txt"
#endif

namespace py = pybind11;

namespace {

template <typename Fn>
py::capsule Encapsulate(Fn* fn) {
  return py::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

PYBIND11_MODULE(_jax_ffi, m) {
  m.doc() = "XLA FFI handlers (CPU) over libdualemb_core's C ABI.";
  m.def(
      "registrations",
      []() {
        py::dict d;
#define DUALEMB_JAX_ADD_TARGET(name, cuda) d["dualemb_" #name] = Encapsulate(dualemb_##name);
        DUALEMB_JAX_FFI_TARGETS(DUALEMB_JAX_ADD_TARGET)
#undef DUALEMB_JAX_ADD_TARGET
        return d;
      },
      "{target name: PyCapsule of its XLA_FFI_Handler*} for the CPU platform.");
  m.def("core_version", []() { return std::string(de_version()); });
  // What the handlers are compiled against: dualemb/jax/_jaxlib_check.py compares the jaxlib
  // release with the one imported before any handler is registered.
  m.attr("jaxlib_version") = DUALEMB_JAXLIB_VERSION;
  m.attr("ffi_api_version") = py::make_tuple(XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR);
}
