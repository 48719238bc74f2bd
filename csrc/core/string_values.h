// string_values.h — the strings of a table whose value dtype is "string" (dualemb_core.h,
// "String values").
//
// The storage keeps such a table's rows as `dim` int64 handles per row (value dtype
// DE_VALUE_STRING, 8 bytes an element); this pool maps each handle to its bytes. Handle 0 is
// the table's default string of that column (the initializer), so a new row (find_or_insert)
// and a missing key (find) need no pool entry. Every other handle is owned by exactly one element
// of one row: a write gives each element a fresh handle and frees the handles the row held
// before; erase frees the erased rows' handles; clear drops all; restrict and capacity evictions
// leave their rows' handles behind, and a compaction (string_value_storage.cc) frees every handle
// no row holds.
// Not thread-safe by itself: StringValueStorage holds mutex() around the pool and the storage
// operation together, so no caller sees a row whose handles are not (yet, or any more) in the pool.
#ifndef DUALEMB_STRING_VALUES_H_
#define DUALEMB_STRING_VALUES_H_

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "config.h"
#include "copy_members.h"

namespace dualemb {

// The default row of a string table from its config: "initializer" "zeros" (the default: empty
// strings, TensorFlow's zero of tf.string), "constant" with "value" (a JSON string) or "vector"
// with "values" (a list of dim or 1 JSON strings). A string's bytes are the UTF-8 encoding of the
// JSON text. Reads (and so echoes) exactly those members; throws std::invalid_argument naming a
// bad one.
std::vector<std::string> string_default_row(const Config& c, int64_t dim);

class StringValues {
 public:
  explicit StringValues(std::vector<std::string> defaults) : defaults_(std::move(defaults)) {}

  std::shared_mutex& mutex() const { return mu_; }
  int64_t dim() const { return static_cast<int64_t>(defaults_.size()); }

  // The string of handle h in column j (h = 0: the column's default). Throws std::logic_error
  // for a handle not in the pool (an internal inconsistency, never expected).
  std::string_view get(int64_t h, int64_t j) const;
  // Adds n strings and writes their fresh handles to out. All or nothing: on std::bad_alloc the
  // pool is as it was.
  void add(const std::vector<std::string_view>& strings, int64_t* out);
  // Frees handles (0 and repeats are skipped).
  void release(const int64_t* handles, int64_t n);
  // Frees every handle not in `live_sorted` (ascending).
  void keep_only(const std::vector<int64_t>& live_sorted);
  void clear();

  int64_t entries() const { return entries_; }
  // Heap bytes of the pool: the slot table, the free list and each string's own buffer.
  size_t memory_bytes() const;

 private:
  mutable FreshSharedMutex mu_;  // a copy (clone, under this lock) gets a fresh one
  std::vector<std::string> defaults_;
  // slots_[h - 1] holds handle h; live_[h - 1] says whether it is in use (freed slots are on
  // free_ and reused, so the pool never grows past the most strings held at once).
  std::vector<std::string> slots_;
  std::vector<uint8_t> live_;
  std::vector<int64_t> free_;
  int64_t entries_ = 0;
  size_t string_bytes_ = 0;  // heap buffers of the strings held (beyond the small-string buffer)
};

}  // namespace dualemb

#endif  // DUALEMB_STRING_VALUES_H_
