// string_keys.h — string keys in the pybind11 module: numpy object arrays of bytes packed into
// the C ABI's de_string_keys, and the bindings only string tables have.
#ifndef DUALEMB_PYTHON_STRING_KEYS_H_
#define DUALEMB_PYTHON_STRING_KEYS_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "dualemb_core.h"

namespace dualemb_py {

// Packs a C-contiguous object array whose elements are all `bytes` (dualemb/core/_string_keys.py
// makes one from str/bytes input); the result owns a copy of the bytes, so the GIL may be
// released while the core reads it. TypeError names the first element that is not bytes
// (`what` names the array: string keys, or the string values of a string-valued table, which
// travel in the same layout).
std::shared_ptr<const de_string_keys> pack_string_keys(const pybind11::array& keys,
                                                       const char* what = "string keys");

// export_page_strings, string_keys_stats, string_fingerprint, _testing_string_id_bits.
void bind_string_keys(pybind11::module_& m);

}  // namespace dualemb_py

#endif  // DUALEMB_PYTHON_STRING_KEYS_H_
