// c_api.cc — the extern "C" functions of dualemb_core.h. Each only marshals: it checks the
// pointers it is given, looks the table's facade up in the registry, calls one method of it
// (table_facade.h: key dtypes, int32 widening, string keys and values, every backend) and turns
// C++ exceptions into an error code, an error kind and a thread-local message.
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "dualemb_core.h"
#include "config.h"
#include "memory_block.h"
#include "registry.h"
#include "string_keys.h"
#include "thread_pool.h"

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

// The facade's batches for de_*_many: every table looked up (an unknown id fails the call
// before anything runs).
std::vector<dualemb::TableBatch> table_batches(const de_table_batch* in, int64_t count) {
  if (count < 0) throw std::invalid_argument("negative table count " + std::to_string(count));
  require(in, count, "batches");
  std::vector<dualemb::TableBatch> out(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const de_table_batch& b = in[i];
    dualemb::TableBatch& t = out[static_cast<size_t>(i)];
    try {
      t.table = dualemb::get_table(b.id);
    } catch (const std::out_of_range& e) {
      throw std::out_of_range("table " + std::to_string(i) + " of " + std::to_string(count) +
                              ": " + e.what());
    }
    t.id = b.id;
    t.keys = {b.key_dtype, b.keys, b.n};
    t.values = b.values;
    t.exists = b.exists;
    t.grads = b.grads;
    t.lr = b.lr;
    t.step = b.step;
  }
  return out;
}

void copy_evicted(const std::vector<dualemb::TableBatch>& from, de_table_batch* to) {
  for (size_t i = 0; i < from.size(); ++i) to[i].evicted = from[i].evicted;
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

int de_table_clone(int64_t id, int64_t* out_id) {
  return guarded("clone table", [&] {
    require_out(out_id, "out_id");
    *out_id = dualemb::clone_table(id);
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
  return guarded("set num threads", [&] { dualemb::get_table(id)->set_num_threads(n); });
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
    auto t = dualemb::get_table(id);
    require(values, n, "values");
    t->find({key_dtype, keys, n}, values, exists);
  });
}

int de_find_or_insert(int64_t id, int32_t key_dtype, const void* keys, int64_t n, void* values,
                      uint8_t* exists, int64_t* evicted) {
  return guarded("find_or_insert", [&] {
    auto t = dualemb::get_table(id);
    require(values, n, "values");
    set_evicted(evicted, t->find_or_insert({key_dtype, keys, n}, values, exists));
  });
}

int de_insert_or_assign(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                        const void* values, int64_t* evicted) {
  return guarded("insert_or_assign", [&] {
    auto t = dualemb::get_table(id);
    require(values, n, "values");
    set_evicted(evicted, t->insert_or_assign({key_dtype, keys, n}, values));
  });
}

int de_accum(int64_t id, int32_t key_dtype, const void* keys, int64_t n, const void* deltas,
             const uint8_t* exists, int64_t* evicted) {
  return guarded("accum", [&] {
    auto t = dualemb::get_table(id);
    require(deltas, n, "deltas");
    require(exists, n, "exists");
    set_evicted(evicted, t->accum({key_dtype, keys, n}, deltas, exists));
  });
}

int de_accum_rows(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                  const void* old_values, const void* new_values, const uint8_t* exists,
                  int64_t* evicted) {
  return guarded("accum", [&] {
    auto t = dualemb::get_table(id);
    require(old_values, n, "old_values");
    require(new_values, n, "new_values");
    require(exists, n, "exists");
    set_evicted(evicted, t->accum_rows({key_dtype, keys, n}, old_values, new_values, exists));
  });
}

int de_erase(int64_t id, int32_t key_dtype, const void* keys, int64_t n) {
  return guarded("erase", [&] { dualemb::get_table(id)->erase({key_dtype, keys, n}); });
}

int de_clear(int64_t id) {
  return guarded("clear", [&] { dualemb::get_table(id)->clear(); });
}

int de_size(int64_t id, int64_t* out) {
  return guarded("size", [&] {
    require_out(out, "out"); *out = dualemb::get_table(id)->size(); });
}

int de_reserve(int64_t id, int64_t n) {
  return guarded("reserve", [&] { dualemb::get_table(id)->reserve(n); });
}

int de_apply_gradients(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                       const float* grads, float lr, int64_t step, int64_t* evicted) {
  return guarded("apply_gradients", [&] {
    auto t = dualemb::get_table(id);
    require(grads, n, "grads");
    set_evicted(evicted, t->apply_gradients({key_dtype, keys, n}, grads, lr, step));
  });
}

int de_find_many(de_table_batch* batches, int64_t count) {
  return guarded("find_many", [&] {
    auto b = table_batches(batches, count);
    dualemb::TableFacade::find_many(b);
  });
}

int de_find_or_insert_many(de_table_batch* batches, int64_t count) {
  return guarded("find_or_insert_many", [&] {
    auto b = table_batches(batches, count);
    dualemb::TableFacade::find_or_insert_many(b);
    copy_evicted(b, batches);
  });
}

int de_apply_gradients_many(de_table_batch* batches, int64_t count) {
  return guarded("apply_gradients_many", [&] {
    auto b = table_batches(batches, count);
    dualemb::TableFacade::apply_gradients_many(b);
    copy_evicted(b, batches);
  });
}

int de_restrict(int64_t id, int64_t num_reserved, int32_t policy, int32_t key_dtype,
                const void* keys, const float* scores, int64_t n, int64_t* removed) {
  return guarded("restrict", [&] {
    auto t = dualemb::get_table(id);
    if (policy == DE_RESTRICT_CUSTOM) require(scores, n, "scores");
    const int64_t r = t->restrict(num_reserved, policy, {key_dtype, keys, n}, scores);
    if (removed) *removed = r;
  });
}

int de_export(int64_t id, int64_t offset, int64_t limit, int32_t key_dtype, void* keys,
              void* values, void* slots, int32_t num_slots, int64_t* last_update,
              int64_t* update_count, uint8_t* stepped, int64_t* out_n) {
  return guarded("export", [&] {
    const int64_t n = dualemb::get_table(id)->export_rows(offset, limit, key_dtype, keys, values,
                                                          slots, num_slots, last_update,
                                                          update_count, stepped);
    if (out_n) *out_n = n;
  });
}

int de_import(int64_t id, int32_t key_dtype, const void* keys, int64_t n, const void* values,
              const void* slots, int32_t num_slots, const int64_t* last_update,
              const int64_t* update_count, const uint8_t* stepped, int64_t* evicted) {
  return guarded("import", [&] {
    auto t = dualemb::get_table(id);
    require(values, n, "values");
    set_evicted(evicted, t->import_rows({key_dtype, keys, n}, values, slots, num_slots,
                                        last_update, update_count, stepped));
  });
}

int de_replace(int64_t id, int32_t key_dtype, const void* keys, int64_t n, const void* values,
               const void* slots, int32_t num_slots, const int64_t* last_update,
               const int64_t* update_count, const uint8_t* stepped, int64_t* evicted) {
  return guarded("replace", [&] {
    auto t = dualemb::get_table(id);
    require(values, n, "values");
    set_evicted(evicted, t->replace_rows({key_dtype, keys, n}, values, slots, num_slots,
                                         last_update, update_count, stepped));
  });
}

int de_changes_begin(int64_t id, int64_t* token) {
  return guarded("changes begin", [&] {
    require_out(token, "token");
    *token = dualemb::get_table(id)->changes_begin();
  });
}

int de_changes_commit(int64_t id, int64_t token, const char* label) {
  return guarded("changes commit", [&] {
    require_out(label, "label");
    dualemb::get_table(id)->changes_commit(token, label);
  });
}

int de_changes_label(int64_t id, char* label, int64_t capacity, int64_t* len) {
  return guarded("changes label", [&] {
    require_out(label, "label");
    require_out(len, "len");
    const std::string s = dualemb::get_table(id)->changes_label();
    if (capacity < static_cast<int64_t>(s.size()) + 1)
      throw std::invalid_argument("changes label: the buffer needs " +
                                  std::to_string(s.size() + 1) + " bytes");
    std::memcpy(label, s.c_str(), s.size() + 1);
    *len = static_cast<int64_t>(s.size());
  });
}

int de_count_changed(int64_t id, int64_t* out) {
  return guarded("count changed", [&] {
    require_out(out, "out");
    *out = dualemb::get_table(id)->count_changed();
  });
}

int de_export_changed(int64_t id, int64_t* cursor, int64_t limit, int32_t key_dtype, void* keys,
                      void* values, void* slots, int32_t num_slots, int64_t* last_update,
                      int64_t* update_count, uint8_t* stepped, int64_t* out_n) {
  return guarded("export changed", [&] {
    require_out(cursor, "cursor");
    const int64_t n =
        dualemb::get_table(id)->export_changed(cursor, limit, key_dtype, keys, values, slots,
                                               num_slots, last_update, update_count, stepped);
    if (out_n) *out_n = n;
  });
}

int de_capture_evicted(int64_t id, int32_t mode) {
  return guarded("capture evicted", [&] { dualemb::get_table(id)->capture_evicted(mode); });
}

int de_take_evicted(int64_t id, int64_t limit, int32_t key_dtype, void* keys, void* values,
                    void* slots, int32_t num_slots, int64_t* last_update, int64_t* update_count,
                    int64_t* out_n, int64_t* remaining) {
  return guarded("take evicted", [&] {
    const int64_t n = dualemb::get_table(id)->take_evicted(
        limit, key_dtype, keys, values, slots, num_slots, last_update, update_count, remaining);
    if (out_n) *out_n = n;
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
    *out = static_cast<int64_t>(dualemb::get_table(id)->memory_bytes());
  });
}

int de_initial_values(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                      void* values) {
  return guarded("initial values", [&] {
    auto t = dualemb::get_table(id);
    require(values, n, "values");
    t->initial_values({key_dtype, keys, n}, values);
  });
}

// ---- string keys ---------------------------------------------------------------------------

int64_t de_string_fingerprint(const char* bytes, int64_t len) {
  return dualemb::string_fingerprint(bytes, len > 0 && bytes ? static_cast<size_t>(len) : 0);
}

int de_string_keys_stats(int64_t id, int64_t* entries, int64_t* key_bytes) {
  return guarded("string keys stats",
                 [&] { dualemb::get_table(id)->string_key_stats(entries, key_bytes); });
}

int de_testing_string_id_bits(int32_t bits) {
  return guarded("testing string id bits", [&] { dualemb::set_testing_string_id_bits(bits); });
}

}  // extern "C"
