// c_api.cc — the extern "C" functions of dualemb_core.h: argument checks, int32 key widening,
// and turning C++ exceptions into an error code plus a thread-local message.
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "dualemb_core.h"
#include "c_api_string_values.h"
#include "c_api_strings.h"
#include "config.h"
#include "memory_block.h"
#include "registry.h"
#include "thread_pool.h"
#include "value_dtype.h"

using Table = dualemb::Storage;
namespace sv = dualemb::string_values_api;

namespace {

thread_local std::string g_last_error;
thread_local int g_last_error_kind = DE_ERROR_NONE;

template <class Fn>
int guarded(const char* what, Fn&& fn) {
  try {
    fn();
    return 0;
  } catch (const std::bad_alloc& e) {
    // dualemb::OutOfMemory names the size; a plain std::bad_alloc says only "std::bad_alloc".
    g_last_error = std::string(what) + ": " +
                   (dynamic_cast<const dualemb::OutOfMemory*>(&e) ? e.what() : "out of memory");
    g_last_error_kind = DE_ERROR_NO_MEMORY;
    return -1;
  } catch (const std::exception& e) {
    g_last_error = std::string(what) + ": " + e.what();
  } catch (...) {
    g_last_error = std::string(what) + ": unknown error";
  }
  g_last_error_kind = DE_ERROR_OTHER;
  return -1;
}

// Every output pointer a function cannot do without is checked, so a NULL is an error, never a
// crash.
void require_out(const void* p, const char* name) {
  if (p == nullptr) throw std::invalid_argument(std::string(name) + " pointer is null");
}

const char* dtype_name(int32_t d) {
  return d == DE_KEY_INT64 ? "int64" : d == DE_KEY_INT32 ? "int32" : d == DE_KEY_STRING ? "string" : "unknown";
}

// Keys as int64, widened from int32 when the table's key dtype is int32.
struct Keys {
  const int64_t* data = nullptr;
  std::vector<int64_t> widened;
};

void check_keys(const Table& t, int32_t key_dtype, const void* keys, int64_t n, Keys* out) {
  if (n < 0) throw std::invalid_argument("negative key count " + std::to_string(n));
  if (key_dtype != t.key_dtype())
    throw std::invalid_argument(std::string("keys have dtype ") + dtype_name(key_dtype) +
                                " but the table's key dtype is " + dtype_name(t.key_dtype()));
  if (n > 0 && keys == nullptr) throw std::invalid_argument("keys pointer is null");
  if (key_dtype == DE_KEY_INT64) {
    out->data = static_cast<const int64_t*>(keys);
  } else {
    const int32_t* k = static_cast<const int32_t*>(keys);
    out->widened.assign(k, k + n);
    out->data = out->widened.data();
  }
}

void require(const void* p, int64_t n, const char* name) {
  if (n > 0 && p == nullptr) throw std::invalid_argument(std::string(name) + " pointer is null");
}

void set_evicted(int64_t* out, int64_t v) {
  if (out) *out = v;
}

int copy_out(const std::string& s, char* buf, size_t buflen, size_t* needed) {
  if (needed) *needed = s.size() + 1;
  if (buf && buflen > 0) {
    size_t n = std::min(buflen - 1, s.size());
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
  }
  return 0;
}

}  // namespace

extern "C" {

const char* de_last_error(void) { return g_last_error.c_str(); }
int de_last_error_kind(void) { return g_last_error_kind; }
const char* de_version(void) { return DUALEMB_VERSION; }  // from dualemb/__init__.py (CMake)

int de_table_create(int64_t id, const char* config, int64_t* out_id) {
  return guarded("create table", [&] {
    if (!config) throw std::invalid_argument("config is null");
    // A drawn id reaches the caller only through out_id; without it the table would be lost.
    if (id == 0 && !out_id) throw std::invalid_argument("out_id pointer is null (id 0 draws one)");
    int64_t got = dualemb::create_table(id, config);
    if (out_id) *out_id = got;
  });
}

int de_table_exists(int64_t id) { return dualemb::table_exists(id) ? 1 : 0; }

int de_table_retain(int64_t id) {
  return guarded("retain table", [&] { dualemb::retain_table(id); });
}

int de_table_release(int64_t id) {
  return guarded("release table", [&] {
    if (!dualemb::release_table(id))
      throw std::out_of_range("unknown table id " + std::to_string(id));
  });
}

int de_table_destroy(int64_t id) {
  return guarded("destroy table", [&] {
    if (!dualemb::destroy_table(id))
      throw std::out_of_range("unknown table id " + std::to_string(id));
  });
}

int de_table_describe(int64_t id, char* buf, size_t buflen, size_t* needed) {
  return guarded("describe", [&] { copy_out(dualemb::get_table(id)->describe(), buf, buflen, needed); });
}

int de_canonical_json(const char* text, char* buf, size_t buflen, size_t* needed) {
  return guarded("canonical JSON", [&] {
    if (!text) throw std::invalid_argument("text is null");
    copy_out(dualemb::canonical_json_text(text), buf, buflen, needed);
  });
}

int de_table_dims(int64_t id, int64_t* dim, int32_t* key_dtype, int32_t* num_slots) {
  return guarded("table dims", [&] {
    auto t = dualemb::get_table(id);
    if (dim) *dim = t->dim();
    if (key_dtype) *key_dtype = t->key_dtype();
    if (num_slots) *num_slots = t->num_slots();
  });
}

int de_value_dtype(int64_t id, int32_t* value_dtype) {
  return guarded("value dtype", [&] {
    require_out(value_dtype, "value_dtype");
    *value_dtype = dualemb::get_table(id)->value_dtype();
  });
}

int de_set_optimizer(int64_t id, const char* spec) {
  return guarded("set optimizer", [&] { dualemb::get_table(id)->set_optimizer(spec ? spec : ""); });
}

int de_slot_names(int64_t id, char* buf, size_t buflen, size_t* needed) {
  return guarded("slot names", [&] {
    std::string s;
    for (const auto& n : dualemb::get_table(id)->slot_names()) s += (s.empty() ? "" : ",") + n;
    copy_out(s, buf, buflen, needed);
  });
}

int de_set_num_threads(int64_t id, int32_t n) {
  return guarded("set num threads", [&] {
    if (n < 0) throw std::invalid_argument("num_threads must be >= 0");
    dualemb::get_table(id)->set_num_threads(n);
  });
}

void de_set_thread_scheduler(de_scheduler_fn fn, void* context, de_scheduler_fn* prev_fn,
                             void** prev_context) {
  dualemb::ExternalScheduler prev = dualemb::set_thread_scheduler({fn, context});
  if (prev_fn) *prev_fn = prev.fn;
  if (prev_context) *prev_context = prev.context;
}

int de_find(int64_t id, int32_t key_dtype, const void* keys, int64_t n, void* values,
            uint8_t* exists) {
  return guarded("find", [&] {
    if (key_dtype == DE_KEY_STRING) return dualemb::string_api::find(id, keys, n, values, exists);
    auto ref = dualemb::get_table_ref(id);
    auto& t = ref.storage;
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    require(values, n, "values");
    if (ref.values) return sv::find(ref, k.data, n, values, exists);
    t->find(k.data, n, values, exists);
  });
}

int de_find_or_insert(int64_t id, int32_t key_dtype, const void* keys, int64_t n, void* values,
                      uint8_t* exists, int64_t* evicted) {
  return guarded("find_or_insert", [&] {
    if (key_dtype == DE_KEY_STRING)
      return set_evicted(evicted, dualemb::string_api::find_or_insert(id, keys, n, values, exists));
    auto ref = dualemb::get_table_ref(id);
    auto& t = ref.storage;
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    require(values, n, "values");
    if (ref.values) return set_evicted(evicted, sv::find_or_insert(ref, k.data, n, values, exists));
    set_evicted(evicted, t->find_or_insert(k.data, n, values, exists));
  });
}

int de_insert_or_assign(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                        const void* values, int64_t* evicted) {
  return guarded("insert_or_assign", [&] {
    if (key_dtype == DE_KEY_STRING)
      return set_evicted(evicted, dualemb::string_api::insert_or_assign(id, keys, n, values));
    auto ref = dualemb::get_table_ref(id);
    auto& t = ref.storage;
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    require(values, n, "values");
    if (ref.values) return set_evicted(evicted, sv::insert_or_assign(ref, k.data, n, values));
    set_evicted(evicted, t->insert_or_assign(k.data, n, values));
  });
}

int de_accum(int64_t id, int32_t key_dtype, const void* keys, int64_t n, const void* deltas,
             const uint8_t* exists, int64_t* evicted) {
  return guarded("accum", [&] {
    if (key_dtype == DE_KEY_STRING)
      return set_evicted(evicted, dualemb::string_api::accum(id, keys, n, deltas, exists));
    auto t = dualemb::get_table(id);
    if (t->value_dtype() == DE_VALUE_STRING) sv::refuse("accum");
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    require(deltas, n, "deltas");
    require(exists, n, "exists");
    set_evicted(evicted, t->accum(k.data, n, deltas, exists));
  });
}

int de_accum_rows(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                  const void* old_values, const void* new_values, const uint8_t* exists,
                  int64_t* evicted) {
  return guarded("accum", [&] {
    auto t = dualemb::get_table(id);
    if (t->value_dtype() == DE_VALUE_STRING) sv::refuse("accum");
    require(old_values, n, "old_values");
    require(new_values, n, "new_values");
    require(exists, n, "exists");
    if (key_dtype == DE_KEY_STRING) {
      // The string layer takes deltas: computed here, before the table is touched.
      std::vector<unsigned char> deltas(dualemb::value_dtype_size(t->value_dtype()) *
                                        static_cast<size_t>(t->dim()) * static_cast<size_t>(n));
      dualemb::accum_deltas(t->value_dtype(), old_values, new_values, exists, n, t->dim(),
                            deltas.data());
      return set_evicted(evicted,
                         dualemb::string_api::accum(id, keys, n, deltas.data(), exists));
    }
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    set_evicted(evicted, t->accum_rows(k.data, n, old_values, new_values, exists));
  });
}

int de_erase(int64_t id, int32_t key_dtype, const void* keys, int64_t n) {
  return guarded("erase", [&] {
    if (key_dtype == DE_KEY_STRING) return dualemb::string_api::erase(id, keys, n);
    auto ref = dualemb::get_table_ref(id);
    auto& t = ref.storage;
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    if (ref.values) return sv::erase(ref, k.data, n);
    t->erase(k.data, n);
  });
}

int de_clear(int64_t id) {
  return guarded("clear", [&] {
    auto ref = dualemb::get_table_ref(id);
    if (ref.keys) return dualemb::string_api::clear(id);
    if (ref.values) return sv::clear(ref);
    ref.storage->clear();
  });
}

int de_size(int64_t id, int64_t* out) {
  return guarded("size", [&] {
    require_out(out, "out"); *out = dualemb::get_table(id)->size(); });
}

int de_reserve(int64_t id, int64_t n) {
  return guarded("reserve", [&] {
    if (n < 0) throw std::invalid_argument("reserve needs n >= 0");
    dualemb::get_table(id)->reserve(n);
  });
}

int de_apply_gradients(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                       const float* grads, float lr, int64_t step, int64_t* evicted) {
  return guarded("apply_gradients", [&] {
    if (key_dtype == DE_KEY_STRING)
      return set_evicted(evicted, dualemb::string_api::apply_gradients(id, keys, n, grads, lr, step));
    auto t = dualemb::get_table(id);
    if (t->value_dtype() == DE_VALUE_STRING) sv::refuse("apply_gradients (training)");
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    require(grads, n, "grads");
    if (step < 1) throw std::invalid_argument("step must be >= 1 (the 1-based update count)");
    set_evicted(evicted, t->apply_gradients(k.data, n, grads, lr, step));
  });
}

int de_restrict(int64_t id, int64_t num_reserved, int32_t policy, int32_t key_dtype,
                const void* keys, const float* scores, int64_t n, int64_t* removed) {
  return guarded("restrict", [&] {
    if (dualemb::string_api::is_string_table(id) &&
        (policy != DE_RESTRICT_CUSTOM || key_dtype == DE_KEY_STRING)) {
      if (num_reserved < 0) throw std::invalid_argument("num_reserved must be >= 0");
      if (policy < DE_RESTRICT_RECENCY || policy > DE_RESTRICT_CUSTOM)
        throw std::invalid_argument("unknown restrict policy " + std::to_string(policy));
      int64_t r = dualemb::string_api::restrict_rows(id, num_reserved, policy, keys, scores, n);
      if (removed) *removed = r;
      return;
    }
    if (key_dtype == DE_KEY_STRING && policy == DE_RESTRICT_CUSTOM)
      dualemb::string_api::find(id, nullptr, 0, nullptr, nullptr);  // throws: not a string table
    auto ref = dualemb::get_table_ref(id);
    auto& t = ref.storage;
    if (num_reserved < 0) throw std::invalid_argument("num_reserved must be >= 0");
    if (policy < DE_RESTRICT_RECENCY || policy > DE_RESTRICT_CUSTOM)
      throw std::invalid_argument("unknown restrict policy " + std::to_string(policy));
    Keys k;
    if (policy == DE_RESTRICT_CUSTOM) {
      check_keys(*t, key_dtype, keys, n, &k);
      require(scores, n, "scores");
    }
    const int64_t given = policy == DE_RESTRICT_CUSTOM ? n : 0;
    const auto by = static_cast<dualemb::RestrictBy>(policy);
    int64_t r = ref.values ? sv::restrict_rows(ref, num_reserved, by, k.data, scores, given)
                           : t->restrict(num_reserved, by, k.data, scores, given);
    if (removed) *removed = r;
  });
}

int de_export(int64_t id, int64_t offset, int64_t limit, int32_t key_dtype, void* keys,
              void* values, void* slots, int32_t num_slots, int64_t* last_update,
              int64_t* update_count, int64_t* out_n) {
  return guarded("export", [&] {
    if (key_dtype == DE_KEY_STRING && keys) {
      int64_t n = dualemb::string_api::export_rows(id, offset, limit,
                                                   static_cast<de_string_keys_out*>(keys), values,
                                                   slots, num_slots, last_update, update_count);
      if (out_n) *out_n = n;
      return;
    }
    auto ref = dualemb::get_table_ref(id);
    auto& t = ref.storage;
    if (offset < 0 || limit < 0) throw std::invalid_argument("offset and limit must be >= 0");
    if (keys && key_dtype != t->key_dtype())
      throw std::invalid_argument(std::string("export keys buffer has dtype ") +
                                  dtype_name(key_dtype) + " but the table's key dtype is " +
                                  dtype_name(t->key_dtype()));
    std::vector<int64_t> wide;
    int64_t* k64 = nullptr;
    if (keys) {
      if (key_dtype == DE_KEY_INT64) {
        k64 = static_cast<int64_t*>(keys);
      } else {
        wide.resize(limit);
        k64 = wide.data();
      }
    }
    int64_t n = ref.values ? sv::export_rows(ref, offset, limit, k64, values, slots, num_slots,
                                             last_update, update_count)
                           : t->export_rows(offset, limit, k64, values, slots,
                                            slots ? num_slots : -1, last_update, update_count);
    if (keys && key_dtype == DE_KEY_INT32) {
      int32_t* k32 = static_cast<int32_t*>(keys);
      for (int64_t i = 0; i < n; ++i) k32[i] = static_cast<int32_t>(wide[i]);
    }
    if (out_n) *out_n = n;
  });
}

int de_import(int64_t id, int32_t key_dtype, const void* keys, int64_t n, const void* values,
              const void* slots, int32_t num_slots, const int64_t* last_update,
              const int64_t* update_count, int64_t* evicted) {
  return guarded("import", [&] {
    if (key_dtype == DE_KEY_STRING)
      return set_evicted(evicted, dualemb::string_api::import_rows(id, keys, n, values, slots, num_slots, last_update, update_count));
    auto ref = dualemb::get_table_ref(id);
    auto& t = ref.storage;
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    require(values, n, "values");
    if (ref.values)
      return set_evicted(evicted, sv::import_rows(ref, k.data, n, values, slots, num_slots,
                                                  last_update, update_count));
    set_evicted(evicted, t->import_rows(k.data, n, values, slots, slots ? num_slots : -1,
                                        last_update, update_count));
  });
}

int de_get_clock(int64_t id, int64_t* out) {
  return guarded("clock", [&] {
    require_out(out, "out"); *out = dualemb::get_table(id)->clock(); });
}

int de_set_clock(int64_t id, int64_t clock) {
  return guarded("set clock", [&] { dualemb::get_table(id)->set_clock(clock); });
}

int de_evicted_total(int64_t id, int64_t* out) {
  return guarded("evicted total", [&] {
    require_out(out, "out"); *out = dualemb::get_table(id)->evicted_total(); });
}

int de_memory_bytes(int64_t id, int64_t* out) {
  return guarded("memory bytes", [&] {
    require_out(out, "out");
    auto ref = dualemb::get_table_ref(id);
    size_t bytes = ref.storage->memory_bytes();
    if (ref.values) bytes += sv::pool_bytes(ref);
    *out = static_cast<int64_t>(bytes);
  });
}

int de_initial_values(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                      void* values) {
  return guarded("initial values", [&] {
    if (key_dtype == DE_KEY_STRING) return dualemb::string_api::initial_values(id, keys, n, values);
    auto ref = dualemb::get_table_ref(id);
    auto& t = ref.storage;
    Keys k;
    check_keys(*t, key_dtype, keys, n, &k);
    require(values, n, "values");
    if (ref.values) return sv::initial_values(ref, n, values);
    t->initial_values(k.data, n, values);
  });
}

// ---- string keys (c_api_strings.cc) ----------------------------------------------------------

int64_t de_string_fingerprint(const char* bytes, int64_t len) {
  return dualemb::string_fingerprint(bytes, len > 0 && bytes ? static_cast<size_t>(len) : 0);
}

int de_string_keys_stats(int64_t id, int64_t* entries, int64_t* key_bytes) {
  return guarded("string keys stats",
                 [&] { dualemb::string_api::stats(id, entries, key_bytes); });
}

int de_testing_string_id_bits(int32_t bits) {
  return guarded("testing string id bits", [&] { dualemb::set_testing_string_id_bits(bits); });
}

}  // extern "C"
