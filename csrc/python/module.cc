// dualemb._core — pybind11 bindings over the C ABI. Thin on purpose: shapes and dtypes are
// checked here (so nothing unchecked reaches C), the GIL is released around every table call,
// and dualemb/core/table.py gives it a friendly interface.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "changes.h"
#include "core_errors.h"
#include "dualemb_core.h"
#include "export_columns.h"
#include "string_keys.h"
#include "value_buffers.h"

namespace py = pybind11;

using dualemb_py::check;
using dualemb_py::value_buffer;
using dualemb_py::value_dtype_name;
using dualemb_py::value_input;

namespace {


// The slot count a [rows, num_slots, dim] slots array is shaped for. The caller's count travels
// to the core, which checks it against the table's under the table lock (another handle may
// attach an optimizer at any time).
int32_t slots_in(const py::array& a, int64_t rows, int64_t dim, const char* name) {
  if (a.ndim() != 3 || a.shape(0) != rows || a.shape(2) != dim)
    throw py::value_error(std::string(name) + " must have shape [" + std::to_string(rows) +
                          ", num_slots, " + std::to_string(dim) + "]");
  return static_cast<int32_t>(a.shape(1));
}

struct KeyView {
  const void* ptr;
  int64_t n;
  int32_t dtype;
  std::shared_ptr<const de_string_keys> strings = nullptr;  // owns what ptr points at
};

KeyView key_view(const py::array& keys) {
  if (!(keys.flags() & py::array::c_style))
    throw py::value_error("keys must be C-contiguous");
  py::dtype dt = keys.dtype();
  if (dt.kind() == 'O') {  // string keys: an object array of bytes
    auto packed = dualemb_py::pack_string_keys(keys);
    return {packed.get(), static_cast<int64_t>(keys.size()), DE_KEY_STRING, packed};
  }
  int32_t code;
  if (dt.is(py::dtype::of<int64_t>())) code = DE_KEY_INT64;
  else if (dt.is(py::dtype::of<int32_t>())) code = DE_KEY_INT32;
  else throw py::value_error("keys must be int64 or int32, got " + std::string(py::str(dt)));
  return {keys.data(), static_cast<int64_t>(keys.size()), code};
}

// What the value buffers of a call must be: dim elements per row of the table's value dtype.
struct RowFormat {
  int64_t dim;
  int32_t value_dtype;
};

RowFormat row_format(int64_t id) {
  RowFormat f;
  int32_t kd, ns;
  check(de_table_dims(id, &f.dim, &kd, &ns));
  check(de_value_dtype(id, &f.value_dtype));
  return f;
}

const float* float_input(const py::array& a, int64_t expected, const char* name) {
  if (!a.dtype().is(py::dtype::of<float>()) || !(a.flags() & py::array::c_style))
    throw py::value_error(std::string(name) + " must be a C-contiguous float32 array");
  if (a.size() != expected)
    throw py::value_error(std::string(name) + " has " + std::to_string(a.size()) +
                          " elements, expected " + std::to_string(expected));
  return static_cast<const float*>(a.data());
}

template <class T>
T* typed_buffer(py::array& a, int64_t expected, const char* name) {
  if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style) || !a.writeable())
    throw py::value_error(std::string(name) + " has the wrong dtype or layout");
  if (a.size() != expected) throw py::value_error(std::string(name) + " has the wrong size");
  return static_cast<T*>(a.mutable_data());
}

template <class T>
T* optional_buffer(const py::object& o, int64_t expected, const char* name) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  return typed_buffer<T>(a, expected, name);
}

template <class T>
const T* typed_input(const py::object& o, int64_t expected, const char* name) {
  if (o.is_none()) return nullptr;
  py::array a = o.cast<py::array>();
  if (!a.dtype().is(py::dtype::of<T>()) || !(a.flags() & py::array::c_style))
    throw py::value_error(std::string(name) + " has the wrong dtype or layout");
  if (a.size() != expected) throw py::value_error(std::string(name) + " has the wrong size");
  return static_cast<const T*>(a.data());
}

int64_t dim_of(int64_t id) {
  int64_t dim;
  int32_t kd, ns;
  check(de_table_dims(id, &dim, &kd, &ns));
  return dim;
}

std::string read_string(int (*fn)(int64_t, char*, size_t, size_t*), int64_t id) {
  size_t needed = 0;
  check(fn(id, nullptr, 0, &needed));
  std::string s(needed, '\0');
  check(fn(id, s.data(), s.size(), &needed));
  s.resize(needed - 1);
  return s;
}

// The arguments of a multi-table call being assembled: one de_table_batch per table.
struct ManyCall {
  ManyCall(const std::vector<int64_t>& ids, const std::vector<py::array>& keys, const char* name)
      : n(ids.size()), what(name) {
    expect(keys.size(), "keys");
    for (size_t i = 0; i < n; ++i) {
      k.push_back(key_view(keys[i]));
      de_table_batch t{};
      t.id = ids[i];
      t.key_dtype = k[i].dtype;
      t.keys = k[i].ptr;
      t.n = k[i].n;
      b.push_back(t);
    }
  }
  // ValueError unless a per-table list has one entry per table.
  void expect(size_t got, const char* list) const {
    if (got != n)
      throw py::value_error(std::string(what) + ": " + list + " has " + std::to_string(got) +
                            " entries for " + std::to_string(n) + " tables");
  }
  std::vector<py::array> list_or_none(const py::object& o, const char* list) const {
    if (o.is_none()) return {};
    auto v = o.cast<std::vector<py::array>>();
    expect(v.size(), list);
    return v;
  }
  void run(int (*fn)(de_table_batch*, int64_t)) {
    int rc;
    {
      py::gil_scoped_release release;
      rc = fn(b.data(), static_cast<int64_t>(n));
    }
    check(rc);
  }
  std::vector<int64_t> evicted() const {
    std::vector<int64_t> e;
    for (const auto& t : b) e.push_back(t.evicted);
    return e;
  }
  size_t n;
  const char* what;
  std::vector<KeyView> k;
  std::vector<de_table_batch> b;
};

// find_many and find_or_insert_many (`fn`: de_find_many or de_find_or_insert_many): every
// table's rows into `values` (and whether each key exists into `exists`, unless None).
void find_rows_many(ManyCall& c, std::vector<py::array>& values, const py::object& exists,
                    int (*fn)(de_table_batch*, int64_t)) {
  std::vector<std::unique_ptr<dualemb_py::RowsOut>> out;
  std::vector<py::array> ex = c.list_or_none(exists, "exists");
  c.expect(values.size(), "values");
  for (size_t i = 0; i < c.n; ++i) {
    RowFormat f = row_format(c.b[i].id);
    out.emplace_back(new dualemb_py::RowsOut(values[i], c.k[i].n * f.dim, f.value_dtype,
                                             "values"));
    c.b[i].values = out.back()->ptr();
    if (!ex.empty()) c.b[i].exists = typed_buffer<uint8_t>(ex[i], c.k[i].n, "exists");
  }
  c.run(fn);
  for (size_t i = 0; i < c.n; ++i) out[i]->fill(c.k[i].n * dim_of(c.b[i].id));
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "Low-level bindings of libdualemb_core (use dualemb.core.Table instead).";

  m.def("version", [] { return std::string(de_version()); });
  dualemb_py::bind_string_keys(m);
  dualemb_py::bind_changes(m);
  dualemb_py::bind_export_columns(m);
  m.def("create", [](int64_t id, const std::string& config) {
    int64_t out;
    check(de_table_create(id, config.c_str(), &out));
    return out;
  });
  m.def("exists", [](int64_t id) { return de_table_exists(id) == 1; });
  m.def("destroy", [](int64_t id) { check(de_table_destroy(id)); });
  m.def("clone", [](int64_t id) {
    int64_t out = 0;
    int rc;
    {
      py::gil_scoped_release release;  // copying a big table takes a while
      rc = de_table_clone(id, &out);
    }
    check(rc);  // raises with the GIL held (MemoryError sets the Python error)
    return out;
  });
  m.def("describe", [](int64_t id) { return read_string(de_table_describe, id); });
  m.def("slot_names", [](int64_t id) { return read_string(de_slot_names, id); });
  m.def("canonical_json", [](const std::string& text) {
    size_t needed = 0;
    check(de_canonical_json(text.c_str(), nullptr, 0, &needed));
    std::string s(needed, '\0');
    check(de_canonical_json(text.c_str(), s.data(), s.size(), &needed));
    s.resize(needed - 1);
    return s;
  });
  m.def("dims", [](int64_t id) {
    int64_t dim;
    int32_t kd, ns;
    check(de_table_dims(id, &dim, &kd, &ns));
    return py::make_tuple(dim, kd, ns);
  });
  m.def("value_dtype", [](int64_t id) {
    int32_t vd;
    check(de_value_dtype(id, &vd));
    return vd;
  });
  m.def("set_optimizer", [](int64_t id, const std::string& spec) {
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_set_optimizer(id, spec.c_str());
    }
    check(rc);
  });
  m.def("set_num_threads", [](int64_t id, int32_t n) { check(de_set_num_threads(id, n)); });

  m.def("find", [](int64_t id, py::array keys, py::array values, py::object exists) {
    KeyView k = key_view(keys);
    RowFormat f = row_format(id);
    dualemb_py::RowsOut v(values, k.n * f.dim, f.value_dtype, "values");
    uint8_t* e = optional_buffer<uint8_t>(exists, k.n, "exists");
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_find(id, k.dtype, k.ptr, k.n, v.ptr(), e);
    }
    check(rc);
    v.fill(k.n * f.dim);
  });
  m.def("find_or_insert", [](int64_t id, py::array keys, py::array values, py::object exists) {
    KeyView k = key_view(keys);
    RowFormat f = row_format(id);
    dualemb_py::RowsOut v(values, k.n * f.dim, f.value_dtype, "values");
    uint8_t* e = optional_buffer<uint8_t>(exists, k.n, "exists");
    int64_t evicted = 0;
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_find_or_insert(id, k.dtype, k.ptr, k.n, v.ptr(), e, &evicted);
    }
    check(rc);
    v.fill(k.n * f.dim);
    return evicted;
  });
  m.def("insert_or_assign", [](int64_t id, py::array keys, py::array values) {
    KeyView k = key_view(keys);
    RowFormat f = row_format(id);
    dualemb_py::RowsIn v(values, k.n * f.dim, f.value_dtype, "values");
    int64_t evicted = 0;
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_insert_or_assign(id, k.dtype, k.ptr, k.n, v.ptr(), &evicted);
    }
    check(rc);
    return evicted;
  });
  m.def("accum", [](int64_t id, py::array keys, py::array deltas, py::array exists) {
    KeyView k = key_view(keys);
    RowFormat f = row_format(id);
    dualemb_py::RowsIn d(deltas, k.n * f.dim, f.value_dtype, "deltas");
    const uint8_t* e = typed_input<uint8_t>(exists, k.n, "exists");
    int64_t evicted = 0;
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_accum(id, k.dtype, k.ptr, k.n, d.ptr(), e, &evicted);
    }
    check(rc);
    return evicted;
  });
  // accum with the deltas still to compute (TFRA's Variable.accum(keys, old, new, exists)):
  // the core forms new - old where exists as it adds, with no pass over the batch first.
  m.def("accum_rows", [](int64_t id, py::array keys, py::array old_values, py::array new_values,
                         py::array exists) {
    KeyView k = key_view(keys);
    RowFormat f = row_format(id);
    dualemb_py::RowsIn o(old_values, k.n * f.dim, f.value_dtype, "old_values");
    dualemb_py::RowsIn v(new_values, k.n * f.dim, f.value_dtype, "new_values");
    const uint8_t* e = typed_input<uint8_t>(exists, k.n, "exists");
    int64_t evicted = 0;
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_accum_rows(id, k.dtype, k.ptr, k.n, o.ptr(), v.ptr(), e, &evicted);
    }
    check(rc);
    return evicted;
  });
  m.def("erase", [](int64_t id, py::array keys) {
    KeyView k = key_view(keys);
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_erase(id, k.dtype, k.ptr, k.n);
    }
    check(rc);
  });
  m.def("clear", [](int64_t id) {
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_clear(id);
    }
    check(rc);
  });
  m.def("size", [](int64_t id) {
    int64_t n;
    check(de_size(id, &n));
    return n;
  });
  m.def("reserve", [](int64_t id, int64_t n) {
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_reserve(id, n);
    }
    check(rc);
  });
  m.def("apply_gradients",
        [](int64_t id, py::array keys, py::array grads, float lr, int64_t step) {
          KeyView k = key_view(keys);
          const float* g = float_input(grads, k.n * dim_of(id), "grads");
          int64_t evicted = 0;
          int rc;
          {
            py::gil_scoped_release release;
            rc = de_apply_gradients(id, k.dtype, k.ptr, k.n, g, lr, step, &evicted);
          }
          check(rc);
          return evicted;
        });
  // Multi-table calls (de_*_many): lists with one entry per table, each as the per-table call
  // takes it; checked here like the per-table calls, then one core call for all the tables.
  m.def("find_many", [](const std::vector<int64_t>& ids, const std::vector<py::array>& keys,
                        std::vector<py::array> values, py::object exists) {
    ManyCall c(ids, keys, "find_many");
    find_rows_many(c, values, exists, de_find_many);
  });
  m.def("find_or_insert_many", [](const std::vector<int64_t>& ids,
                                  const std::vector<py::array>& keys,
                                  std::vector<py::array> values, py::object exists) {
    ManyCall c(ids, keys, "find_or_insert_many");
    find_rows_many(c, values, exists, de_find_or_insert_many);
    return c.evicted();
  });
  m.def("apply_gradients_many",
        [](const std::vector<int64_t>& ids, const std::vector<py::array>& keys,
           const std::vector<py::array>& grads, const std::vector<float>& lrs,
           const std::vector<int64_t>& steps) {
          ManyCall c(ids, keys, "apply_gradients_many");
          c.expect(grads.size(), "grads");
          c.expect(lrs.size(), "lrs");
          c.expect(steps.size(), "steps");
          for (size_t i = 0; i < ids.size(); ++i) {
            c.b[i].grads = float_input(grads[i], c.k[i].n * dim_of(ids[i]), "grads");
            c.b[i].lr = lrs[i];
            c.b[i].step = steps[i];
          }
          c.run(de_apply_gradients_many);
          return c.evicted();
        });
  m.def("restrict", [](int64_t id, int64_t num_reserved, int32_t policy, py::object keys,
                       py::object scores) {
    KeyView k{nullptr, 0, 0};
    const float* s = nullptr;
    if (!keys.is_none()) {
      k = key_view(keys.cast<py::array>());
      s = typed_input<float>(scores, k.n, "scores");
    }
    int64_t removed = 0;
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_restrict(id, num_reserved, policy, k.dtype, k.ptr, s, k.n, &removed);
    }
    check(rc);
    return removed;
  });
  // values may be None (keys and metadata alone: no copy of the rows).
  m.def(
      "export_page",
      [](int64_t id, int64_t offset, py::array keys, py::object values, py::object slots,
         py::object last_update, py::object update_count, py::object stepped) {
    int64_t limit = keys.size();
    KeyView k = key_view(keys);
    if (!keys.writeable()) throw py::value_error("keys buffer must be writable");
    RowFormat f = row_format(id);
    const int64_t dim = f.dim;
    std::unique_ptr<dualemb_py::RowsOut> v;
    if (!values.is_none()) {
      py::array a = values.cast<py::array>();
      v.reset(new dualemb_py::RowsOut(a, limit * dim, f.value_dtype, "values"));
    }
    void* sl = nullptr;
    int32_t ns = 0;
    int64_t* lu = nullptr;
    int64_t* uc = nullptr;
    if (!slots.is_none()) {
      py::array a = slots.cast<py::array>();
      ns = slots_in(a, limit, dim, "slots");
      sl = value_buffer(a, limit * dim * ns, f.value_dtype, "slots");
    }
    lu = optional_buffer<int64_t>(last_update, limit, "last_update");
    uc = optional_buffer<int64_t>(update_count, limit, "update_count");
    uint8_t* st = optional_buffer<uint8_t>(stepped, limit, "stepped");
    int64_t n = 0;
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_export(id, offset, limit, k.dtype, const_cast<void*>(k.ptr), v ? v->ptr() : nullptr,
                     sl, ns, lu, uc, st, &n);
    }
    check(rc);
    if (v) v->fill(n * dim);
    return n;
  },
      py::arg("id"), py::arg("offset"), py::arg("keys"), py::arg("values"), py::arg("slots"),
      py::arg("last_update"), py::arg("update_count"), py::arg("stepped") = py::none());
  m.def(
      "import_rows",
      [](int64_t id, py::array keys, py::array values, py::object slots, py::object last_update,
         py::object update_count, py::object stepped) {
    KeyView k = key_view(keys);
    RowFormat f = row_format(id);
    const int64_t dim = f.dim;
    dualemb_py::RowsIn v(values, k.n * dim, f.value_dtype, "values");
    int32_t ns = 0;
    const void* sl = nullptr;
    if (!slots.is_none()) {
      py::array a = slots.cast<py::array>();
      ns = slots_in(a, k.n, dim, "slots");
      sl = value_input(a, k.n * dim * ns, f.value_dtype, "slots");
    }
    const int64_t* lu = typed_input<int64_t>(last_update, k.n, "last_update");
    const int64_t* uc = typed_input<int64_t>(update_count, k.n, "update_count");
    const uint8_t* st = typed_input<uint8_t>(stepped, k.n, "stepped");
    int64_t evicted = 0;
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_import(id, k.dtype, k.ptr, k.n, v.ptr(), sl, ns, lu, uc, st, &evicted);
    }
    check(rc);
    return evicted;
  },
      py::arg("id"), py::arg("keys"), py::arg("values"), py::arg("slots"),
      py::arg("last_update"), py::arg("update_count"), py::arg("stepped") = py::none());
  m.def("initial_values", [](int64_t id, py::array keys, py::array values) {
    KeyView k = key_view(keys);
    RowFormat f = row_format(id);
    dualemb_py::RowsOut v(values, k.n * f.dim, f.value_dtype, "values");
    int rc;
    {
      py::gil_scoped_release release;
      rc = de_initial_values(id, k.dtype, k.ptr, k.n, v.ptr());
    }
    check(rc);
    v.fill(k.n * f.dim);
  });
  m.def("clock", [](int64_t id) {
    int64_t c;
    check(de_get_clock(id, &c));
    return c;
  });
  m.def("set_clock", [](int64_t id, int64_t c) { check(de_set_clock(id, c)); });
  m.def("evicted_total", [](int64_t id) {
    int64_t c;
    check(de_evicted_total(id, &c));
    return c;
  });
  m.def("memory_bytes", [](int64_t id) {
    int64_t c;
    check(de_memory_bytes(id, &c));
    return c;
  });
}
