// changes.h — the bindings of change tracking (delta checkpoints) and evicted-row capture
// (dualemb_core.h: de_changes_*, de_export_changed, de_capture_evicted, de_take_evicted).
#ifndef DUALEMB_PYTHON_CHANGES_H_
#define DUALEMB_PYTHON_CHANGES_H_

#include <pybind11/pybind11.h>

namespace dualemb_py {

void bind_changes(pybind11::module_& m);

}  // namespace dualemb_py

#endif  // DUALEMB_PYTHON_CHANGES_H_
