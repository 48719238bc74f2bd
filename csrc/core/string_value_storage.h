// string_value_storage.h — a table of value dtype string (dualemb_core.h, "String values"), as a
// Storage over any backend's rows of handles.
//
// The backend keeps `dim` int64 handles per row (value dtype DE_VALUE_STRING); the StringValues
// pool maps them to bytes (string_values.h). This layer is a Storage itself, so the table facade
// treats a string-valued table like any other: its `values` arguments are a de_string_values
// (writes) or a de_string_values_out (reads), as the C ABI passes them. Each operation runs the
// backend's and the matching change of the pool inside one hold of the pool's lock, so no caller
// sees a row whose strings are not in the pool. accum and apply_gradients need numbers and are
// refused. Every function throws (naming the problem) on bad input, leaving the table unchanged.
#ifndef DUALEMB_STRING_VALUE_STORAGE_H_
#define DUALEMB_STRING_VALUE_STORAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "storage/storage.h"
#include "string_values.h"

namespace dualemb {

class StringValueStorage final : public Storage {
 public:
  // `handles`: the backend, made with value dtype string; `defaults`: the default row's strings.
  StringValueStorage(std::shared_ptr<Storage> handles, std::vector<std::string> defaults);

  int64_t dim() const override { return rows_->dim(); }
  int key_dtype() const override { return rows_->key_dtype(); }
  int value_dtype() const override { return rows_->value_dtype(); }
  int num_slots() const override { return rows_->num_slots(); }
  std::string describe() const override { return rows_->describe(); }
  std::vector<std::string> slot_names() const override { return rows_->slot_names(); }
  void set_optimizer(const std::string& spec) override { rows_->set_optimizer(spec); }
  void set_num_threads(int n) override { rows_->set_num_threads(n); }

  void find(const int64_t* keys, int64_t n, void* values, uint8_t* exists) const override;
  int64_t find_or_insert(const int64_t* keys, int64_t n, void* values, uint8_t* exists) override;
  int64_t insert_or_assign(const int64_t* keys, int64_t n, const void* values) override;
  // Refused: accum needs numeric values.
  int64_t accum(const int64_t* keys, int64_t n, const void* deltas, const uint8_t* exists) override;
  int64_t accum_rows(const int64_t* keys, int64_t n, const void* old_values, const void* new_values,
                     const uint8_t* exists) override;
  void erase(const int64_t* keys, int64_t n) override;
  void clear() override;
  int64_t size() const override { return rows_->size(); }
  void reserve(int64_t n) override { rows_->reserve(n); }
  // Refused: training needs numeric values.
  int64_t apply_gradients(const int64_t* keys, int64_t n, const float* grads, float lr,
                          int64_t step) override;
  int64_t restrict(int64_t num_reserved, RestrictBy by, const int64_t* keys, const float* scores,
                   int64_t n) override;
  int64_t export_rows(int64_t offset, int64_t limit, int64_t* keys, void* values, void* slots,
                      int slots_given, int64_t* last_update, int64_t* update_count,
                      uint8_t* stepped) const override;
  int64_t import_rows(const int64_t* keys, int64_t n, const void* values, const void* slots,
                      int slots_given, const int64_t* last_update, const int64_t* update_count,
                      const uint8_t* stepped) override;
  // The default row for every key (the initializer's strings).
  void initial_values(const int64_t* keys, int64_t n, void* values) const override;

  // Change tracking: the backend's (the handles are its rows); evicted capture is refused.
  int64_t changes_begin() override { return rows_->changes_begin(); }
  void changes_commit(int64_t token, const std::string& label) override {
    rows_->changes_commit(token, label);
  }
  std::string changes_label() const override { return rows_->changes_label(); }
  int64_t count_changed() const override { return rows_->count_changed(); }
  int64_t export_changed(int64_t* cursor, int64_t limit, int64_t* keys, void* values, void* slots,
                         int slots_given, int64_t* last_update, int64_t* update_count,
                         uint8_t* stepped) const override;

  int64_t clock() const override { return rows_->clock(); }
  void set_clock(int64_t c) override { rows_->set_clock(c); }
  int64_t evicted_total() const override { return rows_->evicted_total(); }
  // The backend's bytes plus the pool's (the strings and their bookkeeping).
  size_t memory_bytes() const override;
  // The backend's clone and a copy of the pool, both under the pool's lock.
  std::shared_ptr<Storage> clone() const override;

 private:
  // clone(): the backend's copy and a copy of the pool.
  StringValueStorage(std::shared_ptr<Storage> handles, const StringValues& pool)
      : rows_(std::move(handles)), pool_(pool) {}
  template <class Write>
  int64_t write_strings(const int64_t* keys, int64_t n, const void* values, Write&& write);

  std::shared_ptr<Storage> rows_;  // rows of handles
  StringValues pool_;
};

}  // namespace dualemb

#endif  // DUALEMB_STRING_VALUE_STORAGE_H_
