#include "table_facade.h"

#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "config.h"
#include "dualemb_core.h"
#include "storage/factory.h"
#include "string_value_storage.h"
#include "string_values.h"

namespace dualemb {
namespace {

const char* key_dtype_name(int32_t d) {
  return d == DE_KEY_INT64    ? "int64"
         : d == DE_KEY_INT32  ? "int32"
         : d == DE_KEY_STRING ? "string"
                              : "unknown";
}

// A batch's integer keys as int64: in place for int64, widened (one copy per batch) for int32.
class WideKeys {
 public:
  explicit WideKeys(const KeyBatch& k) {
    if (k.n > 0 && k.data == nullptr) throw std::invalid_argument("keys pointer is null");
    if (k.dtype == DE_KEY_INT64) {
      data_ = static_cast<const int64_t*>(k.data);
    } else {
      const int32_t* p = static_cast<const int32_t*>(k.data);
      widened_.assign(p, p + k.n);
      data_ = widened_.data();
    }
  }
  const int64_t* data() const { return data_; }

 private:
  const int64_t* data_ = nullptr;
  std::vector<int64_t> widened_;
};

// An export into a numeric keys buffer of `key_dtype` (it must be the table's,
// `table_key_dtype`): `page(keys64)` exports into an int64 keys buffer (null: no keys) and
// returns how many rows it wrote; an int32 table's keys are exported wide, then narrowed.
template <typename Page>
int64_t export_numeric_keys(int32_t table_key_dtype, int32_t key_dtype, void* keys, int64_t limit,
                            Page page) {
  if (keys && key_dtype != table_key_dtype)
    throw std::invalid_argument(std::string("export keys buffer has dtype ") +
                                key_dtype_name(key_dtype) + " but the table's key dtype is " +
                                key_dtype_name(table_key_dtype));
  if (!keys || key_dtype == DE_KEY_INT64) return page(static_cast<int64_t*>(keys));
  std::vector<int64_t> wide(static_cast<size_t>(limit));
  const int64_t n = page(wide.data());
  int32_t* k32 = static_cast<int32_t*>(keys);
  for (int64_t i = 0; i < n; ++i) k32[i] = static_cast<int32_t>(wide[i]);
  return n;
}

}  // namespace

TableFacade::TableFacade(const std::string& config) : rows_(make_storage(config)) {
  num_threads_ = static_cast<int>(Config::parse(config, "table config").get_int("num_threads", 0));
  if (rows_->value_dtype() == DE_VALUE_STRING)
    rows_ = std::make_shared<StringValueStorage>(
        std::move(rows_), string_default_row(Config::parse(config, "table config"), dim()));
  if (rows_->key_dtype() == DE_KEY_STRING)
    strings_.reset(new StringKeyTable(*rows_, testing_string_id_bits()));
}

std::unique_ptr<TableFacade> TableFacade::clone() const {
  std::unique_ptr<TableFacade> copy(new TableFacade());
  if (!strings_) {
    copy->rows_ = rows_->clone();
    return copy;
  }
  // Every string-key write holds the map's lock exclusively around its storage write, so under
  // a shared hold the map and the rows agree.
  std::shared_lock<std::shared_mutex> lock(strings_->mutex());
  copy->rows_ = rows_->clone();
  copy->strings_.reset(new StringKeyTable(*copy->rows_, *strings_));
  return copy;
}

void TableFacade::check_key_dtype(int32_t dtype) const {
  if (dtype != key_dtype())
    throw std::invalid_argument(std::string("keys have dtype ") + key_dtype_name(dtype) +
                                " but the table's key dtype is " + key_dtype_name(key_dtype()));
}

const StringKeyTable& TableFacade::strings() const {
  check_key_dtype(DE_KEY_STRING);
  return *strings_;
}

void TableFacade::check_batch(const KeyBatch& k) const {
  if (k.n < 0) throw std::invalid_argument("negative key count " + std::to_string(k.n));
  check_key_dtype(k.dtype);
}

// Every batched operation below has the same shape: the batch checked, then the string-key table
// or the backend called once with the whole batch.
void TableFacade::find(const KeyBatch& k, void* values, uint8_t* exists) const {
  check_batch(k);
  if (strings_) return strings_->find(k.data, k.n, values, exists);
  rows_->find(WideKeys(k).data(), k.n, values, exists);
}

int64_t TableFacade::find_or_insert(const KeyBatch& k, void* values, uint8_t* exists) {
  check_batch(k);
  if (strings_) return strings_->find_or_insert(k.data, k.n, values, exists);
  return rows_->find_or_insert(WideKeys(k).data(), k.n, values, exists);
}

int64_t TableFacade::insert_or_assign(const KeyBatch& k, const void* values) {
  check_batch(k);
  if (strings_) return strings_->insert_or_assign(k.data, k.n, values);
  return rows_->insert_or_assign(WideKeys(k).data(), k.n, values);
}

int64_t TableFacade::accum(const KeyBatch& k, const void* deltas, const uint8_t* exists) {
  check_batch(k);
  if (strings_) return strings_->accum(k.data, k.n, deltas, exists);
  return rows_->accum(WideKeys(k).data(), k.n, deltas, exists);
}

int64_t TableFacade::accum_rows(const KeyBatch& k, const void* old_values, const void* new_values,
                                const uint8_t* exists) {
  check_batch(k);
  if (strings_) return strings_->accum_rows(k.data, k.n, old_values, new_values, exists);
  return rows_->accum_rows(WideKeys(k).data(), k.n, old_values, new_values, exists);
}

void TableFacade::erase(const KeyBatch& k) {
  check_batch(k);
  if (strings_) return strings_->erase(k.data, k.n);
  rows_->erase(WideKeys(k).data(), k.n);
}

void TableFacade::clear() {
  if (strings_) return strings_->clear();  // the map goes with the rows
  rows_->clear();
}

void TableFacade::set_num_threads(int n) {
  if (n < 0) throw std::invalid_argument("num_threads must be >= 0");
  rows_->set_num_threads(n);
  num_threads_ = n;
}

void TableFacade::reserve(int64_t n) {
  if (n < 0) throw std::invalid_argument("reserve needs n >= 0");
  rows_->reserve(n);
}

int64_t TableFacade::apply_gradients(const KeyBatch& k, const float* grads, float lr,
                                     int64_t step) {
  check_batch(k);
  if (step < 1) throw std::invalid_argument("step must be >= 1 (the 1-based update count)");
  if (strings_) return strings_->apply_gradients(k.data, k.n, grads, lr, step);
  return rows_->apply_gradients(WideKeys(k).data(), k.n, grads, lr, step);
}

int64_t TableFacade::restrict(int64_t num_reserved, int32_t policy, const KeyBatch& k,
                              const float* scores) {
  if (num_reserved < 0) throw std::invalid_argument("num_reserved must be >= 0");
  if (policy < DE_RESTRICT_RECENCY || policy > DE_RESTRICT_CUSTOM)
    throw std::invalid_argument("unknown restrict policy " + std::to_string(policy));
  const auto by = static_cast<RestrictBy>(policy);
  if (by != RestrictBy::kCustom) {
    // Ranked by the rows' own metadata: no keys to read.
    if (strings_) return strings_->restrict_rows(num_reserved, by, nullptr, nullptr, 0);
    return rows_->restrict(num_reserved, by, nullptr, nullptr, 0);
  }
  check_batch(k);
  if (strings_) return strings_->restrict_rows(num_reserved, by, k.data, scores, k.n);
  return rows_->restrict(num_reserved, by, WideKeys(k).data(), scores, k.n);
}

int64_t TableFacade::export_rows(int64_t offset, int64_t limit, int32_t key_dtype, void* keys,
                                 void* values, void* slots, int32_t num_slots, int64_t* last_update,
                                 int64_t* update_count, uint8_t* stepped) const {
  if (offset < 0 || limit < 0) throw std::invalid_argument("offset and limit must be >= 0");
  const int slots_given = slots ? num_slots : -1;
  if (keys && key_dtype == DE_KEY_STRING)
    return strings().export_rows(offset, limit, static_cast<de_string_keys_out*>(keys), values,
                                 slots, slots_given, last_update, update_count, stepped);
  // Without a keys buffer a string-keyed table exports its rows like any other.
  return export_numeric_keys(this->key_dtype(), key_dtype, keys, limit, [&](int64_t* keys64) {
    return rows_->export_rows(offset, limit, keys64, values, slots, slots_given, last_update,
                              update_count, stepped);
  });
}

int64_t TableFacade::export_changed(int64_t* cursor, int64_t limit, int32_t key_dtype, void* keys,
                                    void* values, void* slots, int32_t num_slots,
                                    int64_t* last_update, int64_t* update_count,
                                    uint8_t* stepped) const {
  if (limit < 0) throw std::invalid_argument("limit must be >= 0");
  const int slots_given = slots ? num_slots : -1;
  if (keys && key_dtype == DE_KEY_STRING)
    return strings().export_changed(cursor, limit, static_cast<de_string_keys_out*>(keys), values,
                                    slots, slots_given, last_update, update_count, stepped);
  return export_numeric_keys(this->key_dtype(), key_dtype, keys, limit, [&](int64_t* keys64) {
    return rows_->export_changed(cursor, limit, keys64, values, slots, slots_given, last_update,
                                 update_count, stepped);
  });
}

void TableFacade::capture_evicted(int mode) {
  if (mode != 0 && (strings_ || value_dtype() == DE_VALUE_STRING))
    throw std::invalid_argument(
        "capture_evicted: not available for string keys or string values (their strings are "
        "dropped with the evicted rows)");
  rows_->capture_evicted(mode);
}

int64_t TableFacade::take_evicted(int64_t limit, int32_t key_dtype, void* keys, void* values,
                                  void* slots, int32_t num_slots, int64_t* last_update,
                                  int64_t* update_count, int64_t* remaining) {
  if (keys && key_dtype != this->key_dtype())
    throw std::invalid_argument(std::string("take_evicted keys buffer has dtype ") +
                                key_dtype_name(key_dtype) + " but the table's key dtype is " +
                                key_dtype_name(this->key_dtype()));
  const int slots_given = slots ? num_slots : -1;
  if (!keys || key_dtype == DE_KEY_INT64)
    return rows_->take_evicted(limit, static_cast<int64_t*>(keys), values, slots, slots_given,
                               last_update, update_count, remaining);
  std::vector<int64_t> wide(static_cast<size_t>(limit));
  const int64_t n = rows_->take_evicted(limit, wide.data(), values, slots, slots_given, last_update,
                                        update_count, remaining);
  int32_t* k32 = static_cast<int32_t*>(keys);
  for (int64_t i = 0; i < n; ++i) k32[i] = static_cast<int32_t>(wide[i]);
  return n;
}

int64_t TableFacade::import_rows(const KeyBatch& k, const void* values, const void* slots,
                                 int32_t num_slots, const int64_t* last_update,
                                 const int64_t* update_count, const uint8_t* stepped) {
  check_batch(k);
  const int slots_given = slots ? num_slots : -1;
  if (strings_)
    return strings_->import_rows(k.data, k.n, values, slots, slots_given, last_update, update_count,
                                 stepped);
  return rows_->import_rows(WideKeys(k).data(), k.n, values, slots, slots_given, last_update,
                            update_count, stepped);
}

int64_t TableFacade::replace_rows(const KeyBatch& k, const void* values, const void* slots,
                                  int32_t num_slots, const int64_t* last_update,
                                  const int64_t* update_count, const uint8_t* stepped) {
  check_batch(k);
  if (strings_) {
    clear();
    return import_rows(k, values, slots, num_slots, last_update, update_count, stepped);
  }
  const int slots_given = slots ? num_slots : -1;
  return rows_->replace_rows(WideKeys(k).data(), k.n, values, slots, slots_given, last_update,
                             update_count, stepped);
}

void TableFacade::initial_values(const KeyBatch& k, void* values) const {
  check_batch(k);
  if (strings_) return strings_->initial_values(k.data, k.n, values);
  rows_->initial_values(WideKeys(k).data(), k.n, values);
}

void TableFacade::string_key_stats(int64_t* entries, int64_t* key_bytes) const {
  strings().stats(entries, key_bytes);
}

}  // namespace dualemb
