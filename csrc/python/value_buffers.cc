#include "value_buffers.h"

#include <string>

namespace py = pybind11;

namespace dualemb_py {
namespace {

// numpy's names of the DE_VALUE_* dtypes (bfloat16 is ml_dtypes.bfloat16), by code.
const char* const kValueDtypeNames[] = {"float32", "float16", "bfloat16", "float64",
                                        "int8",    "int32",   "int64"};

}  // namespace

std::string value_dtype_name(int32_t code) {
  return code >= 0 && code < 7 ? kValueDtypeNames[code] : "unknown";
}

// A buffer of the table's value dtype (compared by numpy's dtype name, which also tells
// ml_dtypes' bfloat16 from float16), C-contiguous, with `expected` elements.
void check_values(const py::array& a, int64_t expected, int32_t value_dtype, const char* name,
                  bool writable) {
  const std::string want = value_dtype_name(value_dtype);
  const std::string got = py::str(a.dtype());
  if (got != want || !(a.flags() & py::array::c_style) || (writable && !a.writeable()))
    throw py::value_error(std::string(name) + " must be a " + (writable ? "writable " : "") +
                          "C-contiguous " + want + " array (the table's value dtype), got " +
                          got);
  if (a.size() != expected)
    throw py::value_error(std::string(name) + " has " + std::to_string(a.size()) +
                          " elements, expected " + std::to_string(expected));
}

void* value_buffer(py::array& a, int64_t expected, int32_t value_dtype, const char* name) {
  check_values(a, expected, value_dtype, name, true);
  return a.mutable_data();
}

const void* value_input(const py::array& a, int64_t expected, int32_t value_dtype,
                        const char* name) {
  check_values(a, expected, value_dtype, name, false);
  return a.data();
}

}  // namespace dualemb_py
