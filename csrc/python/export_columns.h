// export_columns.h — export_slot_columns: a page of a table's rows with every optimizer slot in
// its own [rows, dim] array, the layout a checkpoint file stores (docs/checkpoint_format.md).
#ifndef DUALEMB_PYTHON_EXPORT_COLUMNS_H_
#define DUALEMB_PYTHON_EXPORT_COLUMNS_H_

#include <pybind11/pybind11.h>

namespace dualemb_py {

void bind_export_columns(pybind11::module_& m);

}  // namespace dualemb_py

#endif  // DUALEMB_PYTHON_EXPORT_COLUMNS_H_
