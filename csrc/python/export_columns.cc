// export_slot_columns: de_export writes a row's slots side by side ([rows, num_slots, dim]); a
// checkpoint stores each slot as its own tensor, and splitting a page into columns afterwards
// reads and writes every slot byte once more in memory (a background save does this beside
// training, whose random row accesses need the memory bandwidth). Here the rows are exported a
// few at a time into a small buffer that stays in the CPU cache and copied from there into the
// columns, so the slot bytes cross memory once. Several de_export calls make up one page: the
// caller checks the table's clock, as for any export in pages (a checkpoint's writer does).
#include "export_columns.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "core_errors.h"
#include "dualemb_core.h"
#include "value_buffers.h"

namespace py = pybind11;

namespace dualemb_py {
namespace {

// The rows' slots go through a buffer of about this many bytes (well inside a core's L2 cache).
constexpr int64_t kScratchBytes = 64 << 10;

template <class T>
T* meta_buffer(py::array& a, int64_t expected, const char* name) {
  if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style) || !a.writeable() ||
      a.size() != expected)
    throw py::value_error(std::string(name) + " must be a writable C-contiguous " +
                          std::string(py::str(py::dtype::of<T>())) + " array of " +
                          std::to_string(expected) + " elements");
  return static_cast<T*>(a.mutable_data());
}

int64_t export_slot_columns(int64_t id, int64_t offset, py::array keys, py::array values,
                            py::list columns, py::array last_update, py::array update_count,
                            py::array stepped) {
  if (offset < 0) throw py::value_error("offset must be >= 0");
  const int64_t limit = keys.size();
  int64_t dim;
  int32_t key_dtype, table_slots, value_dtype;
  check(de_table_dims(id, &dim, &key_dtype, &table_slots));
  check(de_value_dtype(id, &value_dtype));
  if (value_dtype == DE_VALUE_STRING || key_dtype == DE_KEY_STRING)
    throw py::value_error("export_slot_columns: string keys or values are exported with export");
  int32_t kd;
  if (keys.dtype().is(py::dtype::of<int64_t>()))
    kd = DE_KEY_INT64;
  else if (keys.dtype().is(py::dtype::of<int32_t>()))
    kd = DE_KEY_INT32;
  else
    throw py::value_error("keys must be int64 or int32");
  if (!(keys.flags() & py::array::c_style) || !keys.writeable())
    throw py::value_error("keys must be a writable C-contiguous array");
  auto* key_bytes = static_cast<unsigned char*>(keys.mutable_data());
  const size_t key_size = static_cast<size_t>(keys.itemsize());
  auto* vals =
      static_cast<unsigned char*>(value_buffer(values, limit * dim, value_dtype, "values"));
  const size_t rb = static_cast<size_t>(values.itemsize()) * static_cast<size_t>(dim);
  // The caller's slot count travels to the core, which checks it against the table's under the
  // table's lock (an optimizer may be attached through another handle at any time).
  const int32_t ns = static_cast<int32_t>(columns.size());
  std::vector<py::array> cols;
  std::vector<unsigned char*> col;
  for (int32_t j = 0; j < ns; ++j) {
    cols.push_back(columns[j].cast<py::array>());
    col.push_back(static_cast<unsigned char*>(
        value_buffer(cols.back(), limit * dim, value_dtype, "slot column")));
  }
  int64_t* lu = meta_buffer<int64_t>(last_update, limit, "last_update");
  int64_t* uc = meta_buffer<int64_t>(update_count, limit, "update_count");
  uint8_t* st = meta_buffer<uint8_t>(stepped, limit, "stepped");
  const int64_t slot_row = static_cast<int64_t>(rb) * std::max<int32_t>(ns, 1);
  const int64_t batch = std::max<int64_t>(1, kScratchBytes / std::max<int64_t>(slot_row, 1));
  std::vector<unsigned char> scratch(static_cast<size_t>(batch * slot_row));
  int64_t done = 0;
  int rc = 0;
  {
    py::gil_scoped_release release;
    while (done < limit) {
      const int64_t want = std::min(batch, limit - done);
      int64_t got = 0;
      rc = de_export(id, offset + done, want, kd, key_bytes + done * key_size, vals + done * rb,
                     ns ? scratch.data() : nullptr, ns, lu + done, uc + done, st + done, &got);
      if (rc != 0) break;
      for (int64_t i = 0; i < got; ++i)
        for (int32_t j = 0; j < ns; ++j)
          std::memcpy(col[j] + (done + i) * rb, scratch.data() + (i * ns + j) * rb, rb);
      done += got;
      if (got < want) break;  // the end of the table
    }
  }
  check(rc);
  return done;
}

}  // namespace

void bind_export_columns(py::module_& m) {
  m.def("export_slot_columns", &export_slot_columns, py::arg("id"), py::arg("offset"),
        py::arg("keys"), py::arg("values"), py::arg("columns"), py::arg("last_update"),
        py::arg("update_count"), py::arg("stepped"));
}

}  // namespace dualemb_py
