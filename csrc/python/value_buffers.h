// value_buffers.h — the numpy value buffers of a table call: rows and slots travel in the table's
// value dtype (DE_VALUE_*), checked here by numpy's dtype name (which also tells ml_dtypes'
// bfloat16 from float16) before anything reaches the core.
#ifndef DUALEMB_PYTHON_VALUE_BUFFERS_H_
#define DUALEMB_PYTHON_VALUE_BUFFERS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

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

}  // namespace dualemb_py

#endif  // DUALEMB_PYTHON_VALUE_BUFFERS_H_
