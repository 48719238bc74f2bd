#include "value_buffers.h"

#include <string>

#include "string_keys.h"

namespace py = pybind11;

namespace dualemb_py {
namespace {

// numpy's names of the DE_VALUE_* dtypes (bfloat16 is ml_dtypes.bfloat16), by code.
const char* const kValueDtypeNames[] = {"float32", "float16", "bfloat16", "float64",
                                        "int8",    "int32",   "int64",    "string"};

}  // namespace

std::string value_dtype_name(int32_t code) {
  return code >= 0 && code < 8 ? kValueDtypeNames[code] : "unknown";
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

namespace {

// An object array for the strings of a string table (`expected` elements, C-contiguous).
void check_object_array(const py::array& a, int64_t expected, const char* name, bool writable) {
  if (a.dtype().kind() != 'O' || !(a.flags() & py::array::c_style) || (writable && !a.writeable()))
    throw py::value_error(std::string(name) + " must be a " + (writable ? "writable " : "") +
                          "C-contiguous object array (of bytes) for a table of value dtype "
                          "string, got " + std::string(py::str(a.dtype())));
  if (a.size() != expected)
    throw py::value_error(std::string(name) + " has " + std::to_string(a.size()) +
                          " elements, expected " + std::to_string(expected));
}

}  // namespace

RowsOut::RowsOut(py::array& a, int64_t expected, int32_t value_dtype, const char* name)
    : array_(a) {
  if (value_dtype != DE_VALUE_STRING) {
    ptr_ = value_buffer(a, expected, value_dtype, name);
    return;
  }
  check_object_array(a, expected, name, true);
  strings_ = true;
  offsets_.resize(static_cast<size_t>(expected) + 1);
  out_ = {&RowsOut::reserve, this, offsets_.data()};
  ptr_ = &out_;
}

char* RowsOut::reserve(void* self, int64_t total) {
  // Runs inside the core call (GIL released): plain C++ only; NULL reports out of memory.
  try {
    auto* me = static_cast<RowsOut*>(self);
    me->bytes_.resize(static_cast<size_t>(total));
    return me->bytes_.data();
  } catch (...) {
    return nullptr;
  }
}

void RowsOut::fill(int64_t elements_written) {
  if (!strings_) return;
  PyObject** items = static_cast<PyObject**>(array_.mutable_data());
  for (int64_t e = 0; e < elements_written; ++e) {
    PyObject* b = PyBytes_FromStringAndSize(bytes_.data() + offsets_[e],
                                            static_cast<Py_ssize_t>(offsets_[e + 1] - offsets_[e]));
    if (!b) throw py::error_already_set();
    Py_XSETREF(items[e], b);
  }
}

RowsIn::RowsIn(const py::array& a, int64_t expected, int32_t value_dtype, const char* name) {
  if (value_dtype != DE_VALUE_STRING) {
    ptr_ = value_input(a, expected, value_dtype, name);
    return;
  }
  check_object_array(a, expected, name, false);
  packed_ = pack_string_keys(a, "string values");
  ptr_ = packed_.get();
}

}  // namespace dualemb_py
