#include "string_keys.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core_errors.h"
#include "value_buffers.h"

namespace py = pybind11;

namespace dualemb_py {
namespace {


struct Packed : de_string_keys {
  std::string data;
  std::vector<int64_t> offs;
};

template <class T>
T* out_buffer(const py::object& o, int64_t elements, const char* name) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style) || !a.writeable())
    throw py::value_error(std::string(name) + " has the wrong dtype or layout");
  if (a.size() != elements) throw py::value_error(std::string(name) + " has the wrong size");
  return static_cast<T*>(a.mutable_data());
}

void* value_out(const py::object& o, int64_t elements, int32_t value_dtype, const char* name) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  return value_buffer(a, elements, value_dtype, name);
}

}  // namespace

std::shared_ptr<const de_string_keys> pack_string_keys(const py::array& keys, const char* what) {
  if (!(keys.flags() & py::array::c_style))
    throw py::value_error(std::string(what) + " must be C-contiguous");
  auto p = std::make_shared<Packed>();
  const int64_t n = static_cast<int64_t>(keys.size());
  PyObject* const* items = static_cast<PyObject* const*>(keys.data());
  size_t total = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!PyBytes_Check(items[i]))
      throw py::type_error(std::string(what) + " must be bytes; element " + std::to_string(i) + " is " +
                           std::string(py::str(py::type::of(py::handle(items[i])))));
    total += static_cast<size_t>(PyBytes_GET_SIZE(items[i]));
  }
  p->data.reserve(total);
  p->offs.reserve(n + 1);
  p->offs.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    p->data.append(PyBytes_AS_STRING(items[i]), static_cast<size_t>(PyBytes_GET_SIZE(items[i])));
    p->offs.push_back(static_cast<int64_t>(p->data.size()));
  }
  p->bytes = p->data.data();
  p->offsets = p->offs.data();
  return p;
}

void bind_string_keys(py::module_& m) {
  // One page of a string table: (rows written, list of their keys as bytes). The key
  // buffer grows until the whole page fits, so a page is never cut short by key sizes.
  m.def(
      "export_page_strings",
      [](int64_t id, int64_t offset, int64_t limit, py::object values, py::object slots,
         int32_t num_slots, py::object last_update, py::object update_count, py::object stepped) {
    int64_t dim;
    int32_t kd, ns, vd;
    check(de_table_dims(id, &dim, &kd, &ns));
    check(de_value_dtype(id, &vd));
    // Rows and slots come back in the table's value dtype.
    void* v = value_out(values, limit * dim, vd, "values");
    void* sl = value_out(slots, limit * dim * num_slots, vd, "slots");
    int64_t* lu = out_buffer<int64_t>(last_update, limit, "last_update");
    int64_t* uc = out_buffer<int64_t>(update_count, limit, "update_count");
    uint8_t* st = out_buffer<uint8_t>(stepped, limit, "stepped");
    std::vector<char> bytes(static_cast<size_t>(std::max<int64_t>(4096, 32 * limit)));
    std::vector<int64_t> offs(static_cast<size_t>(limit) + 1);
    de_string_keys_out out{};
    int64_t n = 0;
    for (;;) {
      out = {bytes.data(), static_cast<int64_t>(bytes.size()), offs.data(), 0};
      int rc;
      {
        py::gil_scoped_release release;
        rc = de_export(id, offset, limit, DE_KEY_STRING, &out, v, sl, num_slots, lu, uc, st, &n);
      }
      check(rc);
      if (out.needed == 0) break;
      bytes.resize(bytes.size() * 2 + static_cast<size_t>(out.needed));
    }
    py::list keys(n);
    for (int64_t i = 0; i < n; ++i)
      keys[i] = py::bytes(bytes.data() + offs[i], static_cast<size_t>(offs[i + 1] - offs[i]));
    return py::make_tuple(n, keys);
  },
      py::arg("id"), py::arg("offset"), py::arg("limit"), py::arg("values"), py::arg("slots"),
      py::arg("num_slots"), py::arg("last_update"), py::arg("update_count"),
      py::arg("stepped") = py::none());
  m.def("string_keys_stats", [](int64_t id) {
    int64_t entries = 0, key_bytes = 0;
    check(de_string_keys_stats(id, &entries, &key_bytes));
    return py::make_tuple(entries, key_bytes);
  });
  m.def("string_fingerprint", [](py::bytes b) {
    std::string s = b;
    return de_string_fingerprint(s.data(), static_cast<int64_t>(s.size()));
  });
  // Fingerprints of an object array of bytes (any shape), as int64: what a string table's
  // initial rows follow, and the host-side hashing dualemb.jax.string_ids offers.
  m.def("string_fingerprints", [](const py::array& keys) {
    auto packed = pack_string_keys(keys);
    const int64_t n = static_cast<int64_t>(keys.size());
    py::array_t<int64_t> out(n);
    int64_t* o = out.mutable_data();
    for (int64_t i = 0; i < n; ++i)
      o[i] = de_string_fingerprint(packed->bytes + packed->offsets[i],
                                   packed->offsets[i + 1] - packed->offsets[i]);
    return out;
  });
  m.def("_testing_string_id_bits", [](int32_t bits) { check(de_testing_string_id_bits(bits)); });
}

}  // namespace dualemb_py
