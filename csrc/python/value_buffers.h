// value_buffers.h — the numpy value buffers of a table call: rows and slots travel in the table's
// value dtype (DE_VALUE_*), checked here by numpy's dtype name (which also tells ml_dtypes'
// bfloat16 from float16) before anything reaches the core.
#ifndef DUALEMB_PYTHON_VALUE_BUFFERS_H_
#define DUALEMB_PYTHON_VALUE_BUFFERS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dualemb_core.h"

namespace dualemb_py {

// numpy's name of a DE_VALUE_* code ("unknown" for anything else).
std::string value_dtype_name(int32_t code);
// ValueError unless `a` is a C-contiguous array of the value dtype (writable if asked) with
// `expected` elements.
void check_values(const pybind11::array& a, int64_t expected, int32_t value_dtype,
                  const char* name, bool writable);
void* value_buffer(pybind11::array& a, int64_t expected, int32_t value_dtype, const char* name);
const void* value_input(const pybind11::array& a, int64_t expected, int32_t value_dtype,
                        const char* name);

// The values argument of a call that reads rows out (find, find_or_insert, export,
// initial_values): a numeric buffer the core writes, or, for a table of value dtype string, an
// object array the strings are put in after the call (fill(), with the GIL held) from the
// buffer the core filled (dualemb_core.h, "String values").
class RowsOut {
 public:
  RowsOut(pybind11::array& a, int64_t expected, int32_t value_dtype, const char* name);
  RowsOut(const RowsOut&) = delete;
  RowsOut& operator=(const RowsOut&) = delete;
  void* ptr() { return ptr_; }
  // Puts the first `elements_written` strings into the object array as bytes (GIL held).
  void fill(int64_t elements_written);

 private:
  static char* reserve(void* self, int64_t total);
  pybind11::array array_;
  void* ptr_ = nullptr;
  bool strings_ = false;
  std::string bytes_;
  std::vector<int64_t> offsets_;
  de_string_values_out out_{};
};

// The values argument of a call that writes rows (insert_or_assign, import): a numeric buffer,
// or for a string table an object array of bytes packed into a de_string_values.
class RowsIn {
 public:
  RowsIn(const pybind11::array& a, int64_t expected, int32_t value_dtype, const char* name);
  const void* ptr() const { return ptr_; }

 private:
  const void* ptr_ = nullptr;
  std::shared_ptr<const de_string_keys> packed_;
};

}  // namespace dualemb_py

#endif  // DUALEMB_PYTHON_VALUE_BUFFERS_H_
