// module.cc — the pybind11 module dualemb._jax_ffi: hands the FFI handlers to Python as
// capsules for jax.ffi.register_ffi_target (dualemb/jax/_ffi.py registers them at import).
#include <pybind11/pybind11.h>

#include "dualemb_core.h"
#include "ffi_handlers.h"

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
        d["dualemb_find"] = Encapsulate(dualemb_find);
        d["dualemb_size"] = Encapsulate(dualemb_size);
        d["dualemb_export"] = Encapsulate(dualemb_export);
        d["dualemb_after"] = Encapsulate(dualemb_after);
        d["dualemb_find_or_insert"] = Encapsulate(dualemb_find_or_insert);
        d["dualemb_insert_or_assign"] = Encapsulate(dualemb_insert_or_assign);
        d["dualemb_insert_masked"] = Encapsulate(dualemb_insert_masked);
        d["dualemb_accum"] = Encapsulate(dualemb_accum);
        d["dualemb_erase"] = Encapsulate(dualemb_erase);
        d["dualemb_apply_gradients"] = Encapsulate(dualemb_apply_gradients);
        d["dualemb_unique"] = Encapsulate(dualemb_unique);
        d["dualemb_exchange_check"] = Encapsulate(dualemb_exchange_check);
        d["dualemb_apply_gradients_first"] = Encapsulate(dualemb_apply_gradients_first);
        return d;
      },
      "{target name: PyCapsule of its XLA_FFI_Handler*} for the CPU platform.");
  m.def("core_version", []() { return std::string(de_version()); });
}
