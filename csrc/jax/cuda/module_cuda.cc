// module_cuda.cc — the pybind11 module dualemb._jax_ffi_cuda: the CUDA-platform FFI handlers
// (ffi_cuda.cc) as capsules, for the entries of DUALEMB_JAX_FFI_TARGETS marked 1 in its CUDA
// column (ffi_handlers.h). Built only with the GPU table; dualemb/jax/_ffi.py imports it when a
// GPU table is made, and registers the capsules for the platform "CUDA" under the same names
// as the CPU handlers.
#include <pybind11/pybind11.h>

#include "ffi_handlers.h"

namespace py = pybind11;

PYBIND11_MODULE(_jax_ffi_cuda, m) {
  m.doc() = "XLA FFI handlers (CUDA) over libdualemb_cuda's C ABI.";
  m.def(
      "registrations",
      []() {
        py::dict d;
#define DUALEMB_JAX_ADD_CUDA_TARGET(name, cuda)    \
  DUALEMB_JAX_IF_CUDA_##cuda(d["dualemb_" #name] = \
                                 py::capsule(reinterpret_cast<void*>(dualemb_##name##_cuda));)
        DUALEMB_JAX_FFI_TARGETS(DUALEMB_JAX_ADD_CUDA_TARGET)
#undef DUALEMB_JAX_ADD_CUDA_TARGET
        return d;
      },
      "{target name: PyCapsule of its XLA_FFI_Handler*} for the CUDA platform.");
}
