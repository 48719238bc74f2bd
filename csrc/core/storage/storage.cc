// storage.cc — the defaults that backends may override.
#include "storage/storage.h"

#include <stdexcept>
#include <vector>

#include "value_dtype.h"

namespace dualemb {

int64_t Storage::accum_rows(const int64_t* keys, int64_t n, const void* old_values,
                            const void* new_values, const uint8_t* exists) {
  // Allocated before the table is touched: a std::bad_alloc leaves it unchanged.
  std::vector<unsigned char> deltas(value_dtype_size(value_dtype()) *
                                    static_cast<size_t>(dim()) * static_cast<size_t>(n));
  accum_deltas(value_dtype(), old_values, new_values, exists, n, dim(), deltas.data());
  return accum(keys, n, deltas.data(), exists);
}

namespace {

[[noreturn]] void no_change_tracking() {
  throw std::invalid_argument(
      "this table's storage backend does not track which rows changed (only the in-memory "
      "backend does), so it cannot be saved as a delta checkpoint; save a full checkpoint");
}

[[noreturn]] void no_evicted_capture() {
  throw std::invalid_argument(
      "this table's storage backend cannot hand over evicted rows (only the in-memory backend "
      "with int64/int32 keys and numeric values can)");
}

}  // namespace

int64_t Storage::replace_rows(const int64_t* keys, int64_t n, const void* values,
                              const void* slots, int slots_given, const int64_t* last_update,
                              const int64_t* update_count, const uint8_t* stepped) {
  clear();
  return import_rows(keys, n, values, slots, slots_given, last_update, update_count, stepped);
}

void Storage::changes_commit(int64_t token, const std::string&) {
  if (token != 0) no_change_tracking();
}
std::string Storage::changes_label() const { no_change_tracking(); }
int64_t Storage::count_changed() const { no_change_tracking(); }
int64_t Storage::export_changed(int64_t*, int64_t, int64_t*, void*, void*, int, int64_t*,
                                int64_t*, uint8_t*) const {
  no_change_tracking();
}
void Storage::capture_evicted(int mode) {
  if (mode != 0) no_evicted_capture();
}
int64_t Storage::take_evicted(int64_t, int64_t*, void*, void*, int, int64_t*, int64_t*,
                              int64_t*) {
  no_evicted_capture();
}

std::shared_ptr<Storage> Storage::clone() const {
  throw std::invalid_argument(
      "this table's storage backend cannot be copied: only in-memory tables can be cloned (a "
      "Redis table's rows live in the server; a background save of it is not supported)");
}

}  // namespace dualemb
