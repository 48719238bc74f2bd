#include "string_value_storage.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dualemb_core.h"
#include "string_batch.h"

namespace dualemb {
namespace {

using Exclusive = std::unique_lock<std::shared_mutex>;
using Shared = std::shared_lock<std::shared_mutex>;

// The `count` strings of a de_string_values, checked.
std::vector<std::string_view> read_values(const void* values, int64_t count) {
  if (count > 0 && !values) throw std::invalid_argument("values pointer is null");
  return read_string_batch(values, count, "string values", "element");
}

de_string_values_out* output(void* values, int64_t rows) {
  auto* out = static_cast<de_string_values_out*>(values);
  if (rows > 0 && !out) throw std::invalid_argument("values pointer is null");
  if (out && (!out->reserve || !out->offsets))
    throw std::invalid_argument("string values out: reserve or offsets is null");
  return out;
}

// Writes the strings of `rows` rows of handles to `out` (see dualemb_core.h).
void emit(const StringValues& pool, const int64_t* handles, int64_t rows,
          de_string_values_out* out) {
  if (!out) return;
  const int64_t dim = pool.dim(), count = rows * dim;
  std::vector<std::string_view> sv(static_cast<size_t>(count));
  int64_t total = 0;
  for (int64_t e = 0; e < count; ++e) {
    sv[e] = pool.get(handles[e], e % dim);
    total += static_cast<int64_t>(sv[e].size());
  }
  char* bytes = out->reserve(out->context, total);
  if (!bytes && total > 0)
    throw std::bad_alloc();  // the caller could not give a buffer for the strings
  int64_t used = 0;
  out->offsets[0] = 0;
  for (int64_t e = 0; e < count; ++e) {
    if (!sv[e].empty()) std::memcpy(bytes + used, sv[e].data(), sv[e].size());
    used += static_cast<int64_t>(sv[e].size());
    out->offsets[e + 1] = used;
  }
}

// The handles the keys' rows hold now (0s for a missing key: its initial row).
std::vector<int64_t> handles_of(const Storage& st, const int64_t* keys, int64_t n,
                                std::vector<uint8_t>* exists = nullptr) {
  std::vector<int64_t> h(static_cast<size_t>(n * st.dim()));
  std::vector<uint8_t> ex(static_cast<size_t>(n));
  st.find(keys, n, h.data(), ex.data());
  if (exists) *exists = std::move(ex);
  return h;
}

[[noreturn]] void refuse(const char* op) {
  throw std::invalid_argument(std::string(op) +
                              " is not defined for a table of value dtype string (it needs "
                              "numeric values; string tables serve lookups, writes, erase, "
                              "export and save/load)");
}

// Frees every handle no row holds (after restrict or capacity evictions).
void compact(StringValues& pool, const Storage& st) {
  const int64_t size = st.size();
  std::vector<int64_t> live(static_cast<size_t>(size * st.dim()));
  const int64_t got =
      st.export_rows(0, size, nullptr, live.data(), nullptr, -1, nullptr, nullptr, nullptr);
  live.resize(static_cast<size_t>(got * st.dim()));
  std::sort(live.begin(), live.end());
  pool.keep_only(live);
}

// Amortised: capacity evictions leave their rows' strings behind; once the pool holds more
// than twice the strings the rows hold (plus slack), one pass frees them all.
void maybe_compact(StringValues& pool, const Storage& st) {
  if (pool.entries() > 2 * st.size() * st.dim() + 1024) compact(pool, st);
}

}  // namespace

StringValueStorage::StringValueStorage(std::shared_ptr<Storage> handles,
                                       std::vector<std::string> defaults)
    : rows_(std::move(handles)), pool_(std::move(defaults)) {}

void StringValueStorage::find(const int64_t* keys, int64_t n, void* values, uint8_t* exists) const {
  auto* out = output(values, n);
  Shared lock(pool_.mutex());
  std::vector<uint8_t> ex;
  const std::vector<int64_t> h = handles_of(*rows_, keys, n, &ex);
  emit(pool_, h.data(), n, out);
  if (exists && n) std::memcpy(exists, ex.data(), static_cast<size_t>(n));
}

int64_t StringValueStorage::find_or_insert(const int64_t* keys, int64_t n, void* values,
                                           uint8_t* exists) {
  auto* out = output(values, n);
  Exclusive lock(pool_.mutex());
  std::vector<int64_t> h(static_cast<size_t>(n * rows_->dim()));
  // New rows hold handle 0 everywhere: the default strings, which need no pool entry.
  const int64_t evicted = rows_->find_or_insert(keys, n, h.data(), exists);
  emit(pool_, h.data(), n, out);
  try {
    maybe_compact(pool_, *rows_);
  } catch (const std::bad_alloc&) {
  }
  return evicted;
}

// A write that gives the keys' rows new strings: adds them to the pool, runs write(handles) ->
// evicted, then frees the handles the rows held before and the new ones no row kept (a repeated
// key keeps one row; a capacity limit may evict). If the write throws, the new strings leave the
// pool again and the table is as it was (the storage's own guarantee). The caller holds the
// pool's exclusive lock.
template <class Write>
int64_t StringValueStorage::write_strings(const int64_t* keys, int64_t n, const void* values,
                                          Write&& write) {
  StringValues& pool = pool_;
  const Storage& st = *rows_;
  auto sv = read_values(values, n * st.dim());
  const std::vector<int64_t> old = handles_of(st, keys, n);
  std::vector<int64_t> fresh(sv.size());
  pool.add(sv, fresh.data());
  int64_t evicted;
  try {
    evicted = write(fresh.data());
  } catch (...) {
    pool.release(fresh.data(), static_cast<int64_t>(fresh.size()));
    throw;
  }
  try {
    pool.release(old.data(), static_cast<int64_t>(old.size()));  // overwritten or evicted
    std::vector<int64_t> now = handles_of(st, keys, n);
    std::sort(now.begin(), now.end());
    std::vector<int64_t> dropped;
    for (int64_t h : fresh)
      if (!std::binary_search(now.begin(), now.end(), h)) dropped.push_back(h);
    pool.release(dropped.data(), static_cast<int64_t>(dropped.size()));
    maybe_compact(pool, st);
  } catch (const std::bad_alloc&) {
    // The write is done; strings no row holds stay in the pool until a later compaction.
  }
  return evicted;
}

int64_t StringValueStorage::insert_or_assign(const int64_t* keys, int64_t n, const void* values) {
  Exclusive lock(pool_.mutex());
  return write_strings(keys, n, values, [&](const int64_t* handles) {
    return rows_->insert_or_assign(keys, n, handles);
  });
}

int64_t StringValueStorage::export_changed(int64_t* cursor, int64_t limit, int64_t* keys,
                                           void* values, void*, int slots_given,
                                           int64_t* last_update, int64_t* update_count,
                                           uint8_t* stepped) const {
  auto* out = static_cast<de_string_values_out*>(values);
  if (out) output(values, 0);  // checks its members
  Shared lock(pool_.mutex());
  const int64_t rows = std::min<int64_t>(limit, rows_->size());
  std::vector<int64_t> h(static_cast<size_t>(rows * rows_->dim()));
  const int64_t got = rows_->export_changed(cursor, rows, keys, h.data(), nullptr, slots_given,
                                            last_update, update_count, stepped);
  emit(pool_, h.data(), got, out);
  return got;
}

int64_t StringValueStorage::import_rows(const int64_t* keys, int64_t n, const void* values,
                                        const void* slots, int slots_given,
                                        const int64_t* last_update, const int64_t* update_count,
                                        const uint8_t* stepped) {
  if (slots && slots_given > 0)
    throw std::invalid_argument("a table of value dtype string has no optimizer slots");
  Exclusive lock(pool_.mutex());
  return write_strings(keys, n, values, [&](const int64_t* handles) {
    return rows_->import_rows(keys, n, handles, nullptr, -1, last_update, update_count, stepped);
  });
}

int64_t StringValueStorage::accum(const int64_t*, int64_t, const void*, const uint8_t*) {
  refuse("accum");
}

int64_t StringValueStorage::accum_rows(const int64_t*, int64_t, const void*, const void*,
                                       const uint8_t*) {
  refuse("accum");
}

int64_t StringValueStorage::apply_gradients(const int64_t*, int64_t, const float*, float, int64_t) {
  refuse("apply_gradients (training)");
}

void StringValueStorage::erase(const int64_t* keys, int64_t n) {
  Exclusive lock(pool_.mutex());
  const std::vector<int64_t> old = handles_of(*rows_, keys, n);
  rows_->erase(keys, n);
  pool_.release(old.data(), static_cast<int64_t>(old.size()));
}

void StringValueStorage::clear() {
  Exclusive lock(pool_.mutex());
  rows_->clear();
  pool_.clear();
}

int64_t StringValueStorage::restrict(int64_t num_reserved, RestrictBy by, const int64_t* keys,
                                     const float* scores, int64_t n) {
  Exclusive lock(pool_.mutex());
  const int64_t removed = rows_->restrict(num_reserved, by, keys, scores, n);
  try {
    compact(pool_, *rows_);
  } catch (const std::bad_alloc&) {
  }
  return removed;
}

int64_t StringValueStorage::export_rows(int64_t offset, int64_t limit, int64_t* keys, void* values,
                                        void*, int slots_given, int64_t* last_update,
                                        int64_t* update_count, uint8_t* stepped) const {
  auto* out = static_cast<de_string_values_out*>(values);
  if (out) output(values, 0);  // checks its members
  Shared lock(pool_.mutex());
  const int64_t rows = std::min<int64_t>(limit, std::max<int64_t>(0, rows_->size() - offset));
  std::vector<int64_t> h(static_cast<size_t>(rows * rows_->dim()));
  const int64_t got = rows_->export_rows(offset, rows, keys, h.data(), nullptr, slots_given,
                                         last_update, update_count, stepped);
  emit(pool_, h.data(), got, out);
  return got;
}

void StringValueStorage::initial_values(const int64_t*, int64_t n, void* values) const {
  auto* out = output(values, n);
  std::vector<int64_t> zeros(static_cast<size_t>(n * rows_->dim()), 0);
  Shared lock(pool_.mutex());
  emit(pool_, zeros.data(), n, out);
}

size_t StringValueStorage::memory_bytes() const {
  const size_t rows = rows_->memory_bytes();
  Shared lock(pool_.mutex());
  return rows + pool_.memory_bytes();
}

std::shared_ptr<Storage> StringValueStorage::clone() const {
  // Writers hold the pool's lock exclusively around the backend's write, so under a shared hold
  // the rows' handles and the pool agree.
  Shared lock(pool_.mutex());
  std::shared_ptr<Storage> rows = rows_->clone();
  return std::shared_ptr<Storage>(new StringValueStorage(std::move(rows), pool_));
}

}  // namespace dualemb
