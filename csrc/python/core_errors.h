// core_errors.h — how a failed core call (dualemb_core.h) surfaces in Python, in one place for
// every binding file: MemoryError (an allocation failed or was refused for its size), KeyError
// (unknown table) or ValueError (anything else: a bad argument).
#ifndef DUALEMB_PYTHON_CORE_ERRORS_H_
#define DUALEMB_PYTHON_CORE_ERRORS_H_

#include <pybind11/pybind11.h>

#include <string>

#include "dualemb_core.h"

namespace dualemb_py {

inline void check(int rc) {
  if (rc == 0) return;
  std::string msg = de_last_error();
  if (de_last_error_kind() == DE_ERROR_NO_MEMORY) {
    PyErr_SetString(PyExc_MemoryError, msg.c_str());
    throw pybind11::error_already_set();
  }
  if (msg.find("unknown table id") != std::string::npos) throw pybind11::key_error(msg);
  throw pybind11::value_error(msg);
}

}  // namespace dualemb_py

#endif  // DUALEMB_PYTHON_CORE_ERRORS_H_
