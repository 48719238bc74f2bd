// string_key_table.h — a table with string keys (dualemb_core.h, "String keys") over any
// Storage keyed by int64.
//
// The StringKeys map gives every string an int64 id (string_keys.h); each operation translates
// the strings to ids and runs the storage's operation inside one hold of the map's lock, so no
// caller sees a half-done call. Values travel as void*: the storage's value layout is its own
// business; only the fix-up of initial rows needs a row's byte size. Keys arrive as the C ABI's
// de_string_keys (n strings); the table facade (table_facade.h) has checked the key dtype.
// Every function throws (naming the problem) on bad input, leaving the table unchanged.
#ifndef DUALEMB_STRING_KEY_TABLE_H_
#define DUALEMB_STRING_KEY_TABLE_H_

#include <cstdint>
#include <shared_mutex>

#include "dualemb_core.h"
#include "storage/storage.h"
#include "string_keys.h"

namespace dualemb {

class StringKeyTable {
 public:
  // `rows`: the storage the rows live in, keyed by the strings' ids; it outlives this object.
  StringKeyTable(Storage& rows, int id_bits) : rows_(rows), map_(id_bits) {}
  // A copy of `o`'s map over `rows`, a clone of o's storage taken under the same hold of
  // mutex() (table_facade.cc): the caller holds o.mutex().
  StringKeyTable(Storage& rows, const StringKeyTable& o) : rows_(rows), map_(o.map_) {}
  // The map's lock, held around each translation and the storage operation together.
  std::shared_mutex& mutex() const { return map_.mutex(); }

  void find(const void* keys, int64_t n, void* values, uint8_t* exists) const;
  int64_t find_or_insert(const void* keys, int64_t n, void* values, uint8_t* exists);
  int64_t insert_or_assign(const void* keys, int64_t n, const void* values);
  int64_t accum(const void* keys, int64_t n, const void* deltas, const uint8_t* exists);
  int64_t accum_rows(const void* keys, int64_t n, const void* old_values, const void* new_values,
                     const uint8_t* exists);
  void erase(const void* keys, int64_t n);
  void clear();
  int64_t apply_gradients(const void* keys, int64_t n, const float* grads, float lr, int64_t step);
  // keys and scores are read only for RestrictBy::kCustom.
  int64_t restrict_rows(int64_t num_reserved, RestrictBy by, const void* keys, const float* scores,
                        int64_t n);
  int64_t export_rows(int64_t offset, int64_t limit, de_string_keys_out* keys, void* values,
                      void* slots, int slots_given, int64_t* last_update, int64_t* update_count,
                      uint8_t* stepped) const;
  // export_rows over the rows changed since the mark (storage.h: export_changed).
  int64_t export_changed(int64_t* cursor, int64_t limit, de_string_keys_out* keys, void* values,
                         void* slots, int slots_given, int64_t* last_update, int64_t* update_count,
                         uint8_t* stepped) const;
  int64_t import_rows(const void* keys, int64_t n, const void* values, const void* slots,
                      int slots_given, const int64_t* last_update, const int64_t* update_count,
                      const uint8_t* stepped);
  void initial_values(const void* keys, int64_t n, void* values) const;
  void stats(int64_t* entries, int64_t* key_bytes) const;

 private:
  // Runs export(ids) -> rows written (under the map's shared lock) and writes their strings.
  template <class Export>
  int64_t export_strings(int64_t limit, de_string_keys_out* out, Export&& export_ids) const;
  template <class Write>
  int64_t write_adding(const void* keys, int64_t n, Write&& write);

  Storage& rows_;
  StringKeys map_;
};

}  // namespace dualemb

#endif  // DUALEMB_STRING_KEY_TABLE_H_
