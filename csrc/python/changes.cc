// changes.cc — see changes.h. Buffers are checked here (dtype, layout, size) before the core sees
// them; the GIL is released around every core call.
#include "changes.h"

#include <pybind11/numpy.h>

#include <string>
#include <vector>

#include "core_errors.h"
#include "dualemb_core.h"
#include "value_buffers.h"

namespace py = pybind11;

namespace dualemb_py {
namespace {

struct Format {
  int64_t dim;
  int32_t key_dtype, num_slots, value_dtype;
};

Format format_of(int64_t id) {
  Format f;
  check(de_table_dims(id, &f.dim, &f.key_dtype, &f.num_slots));
  check(de_value_dtype(id, &f.value_dtype));
  return f;
}

template <class T>
T* meta_out(const py::object& o, int64_t elements, const char* name) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style) || !a.writeable())
    throw py::value_error(std::string(name) + " must be a writable C-contiguous " +
                          (sizeof(T) == 1 ? "uint8" : "int64") + " array");
  if (a.size() != elements) throw py::value_error(std::string(name) + " has the wrong size");
  return static_cast<T*>(a.mutable_data());
}

// An int64/int32 key buffer of the table's key dtype, or nullptr for None.
void* key_out(const py::object& o, int64_t limit, int32_t key_dtype) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  const bool ok = key_dtype == DE_KEY_INT64   ? a.dtype().is(py::dtype::of<int64_t>())
                  : key_dtype == DE_KEY_INT32 ? a.dtype().is(py::dtype::of<int32_t>())
                                              : false;
  if (!ok || !(a.flags() & py::array::c_style) || !a.writeable() || a.size() != limit)
    throw py::value_error(
        "keys must be a writable C-contiguous array of the table's key dtype "
        "with one entry per row");
  return a.mutable_data();
}

// slots: None, or [limit, num_slots, dim] of the value dtype; *ns receives num_slots.
void* slots_out(const py::object& o, int64_t limit, const Format& f, int32_t* ns) {
  *ns = 0;
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  if (a.ndim() != 3 || a.shape(0) != limit || a.shape(2) != f.dim)
    throw py::value_error("slots must have shape [" + std::to_string(limit) + ", num_slots, " +
                          std::to_string(f.dim) + "]");
  *ns = static_cast<int32_t>(a.shape(1));
  return value_buffer(a, limit * f.dim * *ns, f.value_dtype, "slots");
}

}  // namespace

void bind_changes(py::module_& m) {
  m.def("changes_begin", [](int64_t id) {
    int64_t token = 0;
    check(de_changes_begin(id, &token));
    return token;
  });
  m.def("changes_commit", [](int64_t id, int64_t token, const std::string& label) {
    check(de_changes_commit(id, token, label.c_str()));
  });
  m.def("changes_label", [](int64_t id) {
    std::vector<char> buf(260);
    int64_t len = 0;
    check(de_changes_label(id, buf.data(), static_cast<int64_t>(buf.size()), &len));
    return std::string(buf.data(), static_cast<size_t>(len));
  });
  m.def("count_changed", [](int64_t id) {
    int64_t n = 0;
    check(de_count_changed(id, &n));
    return n;
  });
  // One page of changed rows from row position `cursor`: (rows written, next cursor, keys).
  // keys: the given int64/int32 array filled (returned as None), or for a string table (keys
  // None) a list of bytes; the key buffer grows until the whole page fits.
  m.def("export_changed_page", [](int64_t id, int64_t cursor, int64_t limit, py::object keys,
                                  py::array values, py::object slots, py::object last_update,
                                  py::object update_count, py::object stepped) {
    const Format f = format_of(id);
    RowsOut v(values, limit * f.dim, f.value_dtype, "values");
    int32_t ns = 0;
    void* sl = slots_out(slots, limit, f, &ns);
    int64_t* lu = meta_out<int64_t>(last_update, limit, "last_update");
    int64_t* uc = meta_out<int64_t>(update_count, limit, "update_count");
    uint8_t* st = meta_out<uint8_t>(stepped, limit, "stepped");
    int64_t n = 0;
    const int64_t start = cursor;
    if (f.key_dtype != DE_KEY_STRING) {
      void* k = key_out(keys, limit, f.key_dtype);
      int rc;
      {
        py::gil_scoped_release release;
        rc = de_export_changed(id, &cursor, limit, f.key_dtype, k, v.ptr(), sl, ns, lu, uc, st, &n);
      }
      check(rc);
      v.fill(n * f.dim);
      return py::tuple(py::make_tuple(n, cursor, py::none()));
    }
    std::vector<char> bytes(static_cast<size_t>(std::max<int64_t>(4096, 32 * limit)));
    std::vector<int64_t> offs(static_cast<size_t>(limit) + 1);
    de_string_keys_out out{};
    for (;;) {
      out = {bytes.data(), static_cast<int64_t>(bytes.size()), offs.data(), 0};
      cursor = start;
      int rc;
      {
        py::gil_scoped_release release;
        rc = de_export_changed(id, &cursor, limit, DE_KEY_STRING, &out, v.ptr(), sl, ns, lu, uc, st,
                               &n);
      }
      check(rc);
      if (out.needed == 0) break;
      bytes.resize(bytes.size() * 2 + static_cast<size_t>(out.needed));
    }
    v.fill(n * f.dim);
    py::list out_keys(n);
    for (int64_t i = 0; i < n; ++i)
      out_keys[i] = py::bytes(bytes.data() + offs[i], static_cast<size_t>(offs[i + 1] - offs[i]));
    return py::tuple(py::make_tuple(n, cursor, out_keys));
  });
  m.def("capture_evicted", [](int64_t id, int32_t mode) { check(de_capture_evicted(id, mode)); });
  // Takes up to `limit` captured rows into the given buffers (any may be None):
  // (rows written, rows still captured).
  m.def("take_evicted_page", [](int64_t id, int64_t limit, py::object keys, py::object values,
                                py::object slots, py::object last_update, py::object update_count) {
    const Format f = format_of(id);
    void* k = key_out(keys, limit, f.key_dtype);
    void* v = nullptr;
    if (!values.is_none()) {
      py::array a = values.cast<py::array>();
      v = value_buffer(a, limit * f.dim, f.value_dtype, "values");
    }
    int32_t ns = 0;
    void* sl = slots_out(slots, limit, f, &ns);
    int64_t* lu = meta_out<int64_t>(last_update, limit, "last_update");
    int64_t* uc = meta_out<int64_t>(update_count, limit, "update_count");
    int64_t n = 0, remaining = 0;
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_take_evicted(id, limit, f.key_dtype, k, v, sl, ns, lu, uc, &n, &remaining);
    }
    check(rc);
    return py::make_tuple(n, remaining);
  });
}

}  // namespace dualemb_py
