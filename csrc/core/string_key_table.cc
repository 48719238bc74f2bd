#include "string_key_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "string_batch.h"
#include "value_dtype.h"

namespace dualemb {
namespace {

// The n strings of a de_string_keys, checked.
std::vector<std::string_view> read_keys(const void* keys, int64_t n) {
  if (n < 0) throw std::invalid_argument("negative key count " + std::to_string(n));
  if (n > 0 && !keys) throw std::invalid_argument("keys pointer is null");
  return read_string_batch(keys, n, "string keys", "position");
}

// Bytes of one value row in the table's value dtype (rows cross the C ABI as raw bytes).
size_t value_row_bytes(const Storage& s) {
  return static_cast<size_t>(s.dim()) * value_dtype_size(s.value_dtype());
}

// Whether each id has a row (ids are few here: new or probed ones, or a rollback).
std::vector<uint8_t> has_rows(const Storage& s, const std::vector<int64_t>& ids) {
  std::vector<uint8_t> out(ids.size());
  constexpr size_t kChunk = 1024;
  // 8 bytes per value element: room for any value dtype, aligned for any.
  std::vector<double> scratch(std::min(ids.size(), kChunk) * static_cast<size_t>(s.dim()));
  for (size_t b = 0; b < ids.size(); b += kChunk) {
    const size_t m = std::min(kChunk, ids.size() - b);
    s.find(ids.data() + b, static_cast<int64_t>(m), scratch.data(), out.data() + b);
  }
  return out;
}

// Writes the initial row of string s (from its fingerprint) at row i of `values`.
void write_initial(const Storage& st, std::string_view s, void* values, int64_t i) {
  const int64_t k = string_init_key(s);
  st.initial_values(&k, 1, static_cast<char*>(values) + i * value_row_bytes(st));
}

// Ids of the strings, added to the map where absent; the added ids go to *added.
std::vector<int64_t> ids_adding(StringKeys& m, const std::vector<std::string_view>& sv,
                                std::vector<int64_t>* added) {
  std::vector<int64_t> ids(sv.size());
  m.reserve_more(sv.size());
  try {
    for (size_t i = 0; i < sv.size(); ++i) {
      bool fresh = false;
      ids[i] = m.find_or_add(sv[i], &fresh);
      if (fresh) added->push_back(ids[i]);
    }
  } catch (...) {
    for (int64_t id : *added) m.remove_id(id);
    throw;
  }
  return ids;
}

// After a failed write: the strings this call added are dropped again, except those whose row
// exists (rows are never left without their string).
void roll_back(StringKeys& m, const Storage& st, const std::vector<int64_t>& added) {
  try {
    std::vector<uint8_t> live = has_rows(st, added);
    for (size_t i = 0; i < added.size(); ++i)
      if (!live[i]) m.remove_id(added[i]);
  } catch (...) {
    // Could not tell which have rows: keep them all (a string without a row is harmless; the
    // next compaction drops it).
  }
}

// Drops every string whose row is gone.
void compact(StringKeys& m, const Storage& st) {
  const int64_t size = st.size();
  std::vector<int64_t> live(static_cast<size_t>(size));
  const int64_t got =
      st.export_rows(0, size, live.data(), nullptr, nullptr, -1, nullptr, nullptr, nullptr);
  live.resize(static_cast<size_t>(got));
  std::sort(live.begin(), live.end());
  m.keep_only(live);
}

// Amortised: evicted rows leave their strings behind; once they outnumber the live ones (plus
// some slack) one pass drops them all, so the map stays within about twice the table's size.
void maybe_compact(StringKeys& m, const Storage& st) {
  if (m.entries() > 2 * st.size() + 1024) compact(m, st);
}

// A new string whose id is not its fingerprint (another string held that id) would get the
// initializer row of its id; its row is made first from the fingerprint instead. Returns the
// ids so made (sorted) and adds to *evicted what their import evicted. Almost always a no-op:
// it takes two strings with one 63-bit fingerprint.
std::vector<int64_t> make_probed_rows(Storage& st, const std::vector<std::string_view>& sv,
                                      const std::vector<int64_t>& ids, int64_t* evicted) {
  std::vector<int64_t> cand;
  std::vector<std::string_view> cand_s;
  for (size_t i = 0; i < sv.size(); ++i)
    if (ids[i] != string_init_key(sv[i]) &&
        std::find(cand.begin(), cand.end(), ids[i]) == cand.end()) {
      cand.push_back(ids[i]);
      cand_s.push_back(sv[i]);
    }
  if (cand.empty()) return {};
  std::vector<uint8_t> live = has_rows(st, cand);
  std::vector<int64_t> make;
  std::vector<double> rows;  // double: aligned for any value dtype
  const size_t rb = value_row_bytes(st);
  for (size_t j = 0; j < cand.size(); ++j) {
    if (live[j]) continue;
    make.push_back(cand[j]);
    rows.resize((make.size() * rb + sizeof(double) - 1) / sizeof(double));
    write_initial(st, cand_s[j], rows.data(), static_cast<int64_t>(make.size() - 1));
  }
  if (make.empty()) return {};
  *evicted += st.import_rows(make.data(), static_cast<int64_t>(make.size()), rows.data(), nullptr,
                             -1, nullptr, nullptr, nullptr);
  std::sort(make.begin(), make.end());
  return make;
}

using Exclusive = std::unique_lock<std::shared_mutex>;
using Shared = std::shared_lock<std::shared_mutex>;

}  // namespace

void StringKeyTable::find(const void* keys, int64_t n, void* values, uint8_t* exists) const {
  auto sv = read_keys(keys, n);
  Shared lock(map_.mutex());
  std::vector<int64_t> ids(n);
  std::vector<uint8_t> known(n), found(n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = map_.find(sv[i]);
    known[i] = k >= 0;
    // An unknown string is looked up by its fingerprint only to fill the row in one pass; the
    // row it may hit belongs to another string and is overwritten below.
    ids[i] = k >= 0 ? k : string_init_key(sv[i]);
  }
  rows_.find(ids.data(), n, values, found.data());
  for (int64_t i = 0; i < n; ++i) {
    const bool wrong_row = known[i] ? (!found[i] && ids[i] != string_init_key(sv[i])) : found[i];
    if (wrong_row) write_initial(rows_, sv[i], values, i);
    if (exists) exists[i] = known[i] && found[i];
  }
}

// A write that may add strings: reads and maps them (adding the new ones) under the map's
// exclusive lock, runs write(strings, ids) -> evicted, then compacts the map. If the write
// throws, the strings it added leave the map again unless their row exists.
template <class Write>
int64_t StringKeyTable::write_adding(const void* keys, int64_t n, Write&& write) {
  const std::vector<std::string_view> sv = read_keys(keys, n);
  Exclusive lock(map_.mutex());
  std::vector<int64_t> added;
  const std::vector<int64_t> ids = ids_adding(map_, sv, &added);
  int64_t evicted = 0;
  try {
    evicted = write(sv, ids);
  } catch (...) {
    roll_back(map_, rows_, added);
    throw;
  }
  maybe_compact(map_, rows_);
  return evicted;
}

using Strings = std::vector<std::string_view>;
using Ids = std::vector<int64_t>;

int64_t StringKeyTable::find_or_insert(const void* keys, int64_t n, void* values, uint8_t* exists) {
  return write_adding(keys, n, [&](const Strings& sv, const Ids& ids) {
    int64_t evicted = 0;
    const auto made = make_probed_rows(rows_, sv, ids, &evicted);
    std::vector<uint8_t> ex(n);
    evicted += rows_.find_or_insert(ids.data(), n, values, ex.data());
    if (exists)
      for (int64_t i = 0; i < n; ++i)
        exists[i] = ex[i] && !std::binary_search(made.begin(), made.end(), ids[i]);
    return evicted;
  });
}

int64_t StringKeyTable::insert_or_assign(const void* keys, int64_t n, const void* values) {
  return write_adding(keys, n, [&](const Strings&, const Ids& ids) {
    return rows_.insert_or_assign(ids.data(), n, values);
  });
}

// accum(ids) of the strings: an unknown string with exists = 1 is ignored by accum, so it got no
// row and leaves the map again.
template <class Accum>
static int64_t accum_strings(Storage& rows, StringKeys& map,
                             const std::vector<std::string_view>& sv, Accum&& accum) {
  std::vector<int64_t> added;
  auto ids = ids_adding(map, sv, &added);
  int64_t evicted;
  try {
    evicted = accum(ids);
  } catch (...) {
    roll_back(map, rows, added);
    throw;
  }
  roll_back(map, rows, added);
  maybe_compact(map, rows);
  return evicted;
}

int64_t StringKeyTable::accum(const void* keys, int64_t n, const void* deltas,
                              const uint8_t* exists) {
  auto sv = read_keys(keys, n);
  Exclusive lock(map_.mutex());
  return accum_strings(rows_, map_, sv,
                       [&](const Ids& ids) { return rows_.accum(ids.data(), n, deltas, exists); });
}

int64_t StringKeyTable::accum_rows(const void* keys, int64_t n, const void* old_values,
                                   const void* new_values, const uint8_t* exists) {
  auto sv = read_keys(keys, n);
  Exclusive lock(map_.mutex());
  return accum_strings(rows_, map_, sv, [&](const Ids& ids) {
    return rows_.accum_rows(ids.data(), n, old_values, new_values, exists);
  });
}

void StringKeyTable::erase(const void* keys, int64_t n) {
  auto sv = read_keys(keys, n);
  Exclusive lock(map_.mutex());
  std::vector<int64_t> ids;
  ids.reserve(sv.size());
  for (auto s : sv) {
    const int64_t k = map_.find(s);
    if (k >= 0) ids.push_back(k);
  }
  rows_.erase(ids.data(), static_cast<int64_t>(ids.size()));
  for (int64_t k : ids) map_.remove_id(k);
}

void StringKeyTable::clear() {
  Exclusive lock(map_.mutex());
  rows_.clear();
  map_.clear();
}

int64_t StringKeyTable::apply_gradients(const void* keys, int64_t n, const float* grads, float lr,
                                        int64_t step) {
  {
    // Refused before any string is added or any row is made (describe() ends with
    // ,"optimizer":null} exactly when none is attached).
    const std::string d = rows_.describe();
    static const std::string kNone = ",\"optimizer\":null}";
    if (d.size() >= kNone.size() && d.compare(d.size() - kNone.size(), kNone.size(), kNone) == 0)
      throw std::invalid_argument("this table has no optimizer attached");
  }
  return write_adding(keys, n, [&](const Strings& sv, const Ids& ids) {
    int64_t evicted = 0;
    make_probed_rows(rows_, sv, ids, &evicted);
    evicted += rows_.apply_gradients(ids.data(), n, grads, lr, step);
    return evicted;
  });
}

int64_t StringKeyTable::restrict_rows(int64_t num_reserved, RestrictBy by, const void* keys,
                                      const float* scores, int64_t n) {
  std::vector<int64_t> ids;
  std::vector<float> sc;
  std::vector<std::string_view> sv;
  if (by == RestrictBy::kCustom) {
    sv = read_keys(keys, n);
    for (int64_t i = 0; i < n; ++i)
      if (std::isnan(scores[i]))
        throw std::invalid_argument("the score of the string key at position " + std::to_string(i) +
                                    " is NaN; scores must be numbers (+-inf allowed)");
  }
  Exclusive lock(map_.mutex());
  for (size_t i = 0; i < sv.size(); ++i) {
    const int64_t k = map_.find(sv[i]);
    if (k < 0) continue;  // no row: its score ranks nothing
    ids.push_back(k);
    sc.push_back(scores[i]);
  }
  const int64_t removed =
      rows_.restrict(num_reserved, by, ids.data(), sc.data(), static_cast<int64_t>(ids.size()));
  compact(map_, rows_);
  return removed;
}

template <class Export>
int64_t StringKeyTable::export_strings(int64_t limit, de_string_keys_out* out,
                                       Export&& export_ids) const {
  if (!out->offsets) throw std::invalid_argument("string keys out: offsets pointer is null");
  if (out->capacity < 0) throw std::invalid_argument("string keys out: negative capacity");
  if (out->capacity > 0 && !out->bytes)
    throw std::invalid_argument("string keys out: bytes pointer is null");
  Shared lock(map_.mutex());
  std::vector<int64_t> ids(static_cast<size_t>(std::min<int64_t>(limit, rows_.size())));
  const int64_t got = export_ids(ids);
  int64_t used = 0, written = 0;
  out->offsets[0] = 0;
  out->needed = 0;
  for (; written < got; ++written) {
    const std::string* s = map_.string_of(ids[written]);
    if (!s) throw std::logic_error("internal error: a row of a string table has no string");
    const int64_t len = static_cast<int64_t>(s->size());
    if (used + len > out->capacity) {
      out->needed = len;
      break;
    }
    if (len) std::memcpy(out->bytes + used, s->data(), static_cast<size_t>(len));
    used += len;
    out->offsets[written + 1] = used;
  }
  return written;
}

int64_t StringKeyTable::export_rows(int64_t offset, int64_t limit, de_string_keys_out* out,
                                    void* values, void* slots, int slots_given,
                                    int64_t* last_update, int64_t* update_count,
                                    uint8_t* stepped) const {
  return export_strings(limit, out, [&](std::vector<int64_t>& ids) {
    return rows_.export_rows(offset, static_cast<int64_t>(ids.size()), ids.data(), values, slots,
                             slots_given, last_update, update_count, stepped);
  });
}

// A page that ends early (a key did not fit) must not skip the rows it did not write: the cursor
// then moves only past the rows written, found by exporting again up to the last one.
int64_t StringKeyTable::export_changed(int64_t* cursor, int64_t limit, de_string_keys_out* out,
                                       void* values, void* slots, int slots_given,
                                       int64_t* last_update, int64_t* update_count,
                                       uint8_t* stepped) const {
  const int64_t start = *cursor;
  int64_t got = 0;
  const int64_t written = export_strings(limit, out, [&](std::vector<int64_t>& ids) {
    got = rows_.export_changed(cursor, static_cast<int64_t>(ids.size()), ids.data(), values, slots,
                               slots_given, last_update, update_count, stepped);
    return got;
  });
  if (written < got) {
    *cursor = start;
    std::vector<int64_t> ids(static_cast<size_t>(written));
    rows_.export_changed(cursor, written, ids.data(), nullptr, nullptr, -1, nullptr, nullptr,
                         nullptr);
  }
  return written;
}

int64_t StringKeyTable::import_rows(const void* keys, int64_t n, const void* values,
                                    const void* slots, int slots_given, const int64_t* last_update,
                                    const int64_t* update_count, const uint8_t* stepped) {
  return write_adding(keys, n, [&](const Strings&, const Ids& ids) {
    return rows_.import_rows(ids.data(), n, values, slots, slots_given, last_update, update_count,
                             stepped);
  });
}

void StringKeyTable::initial_values(const void* keys, int64_t n, void* values) const {
  auto sv = read_keys(keys, n);
  std::vector<int64_t> k(n);
  for (int64_t i = 0; i < n; ++i) k[i] = string_init_key(sv[i]);
  rows_.initial_values(k.data(), n, values);
}

void StringKeyTable::stats(int64_t* entries, int64_t* key_bytes) const {
  Shared lock(map_.mutex());
  if (entries) *entries = map_.entries();
  if (key_bytes) *key_bytes = map_.key_bytes();
}

}  // namespace dualemb
