// string_keys.h — the per-table map from string keys to the int64 ids the storage keys rows by.
//
// No collisions: the map keeps every string's bytes and compares them. A string's id is its
// fingerprint (string_fingerprint) when that id is free, else the next free id (linear probe);
// ids are non-negative. Initial rows never depend on the id: callers use string_init_key.
// Not thread-safe by itself: StringKeyTable (string_key_table.h) holds mutex() around the
// translation and the storage operation together.
#ifndef DUALEMB_STRING_KEYS_H_
#define DUALEMB_STRING_KEYS_H_

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace dualemb {

// FNV-1a 64 of the bytes, then the splitmix64 finalizer, masked to a non-negative int64.
int64_t string_fingerprint(const char* bytes, size_t len);
// The int64 key whose initializer row a new string starts from: its full fingerprint, whatever
// id it got (so the same string starts from the same row in every table and process).
inline int64_t string_init_key(std::string_view s) { return string_fingerprint(s.data(), s.size()); }

// The id bits tables created from now on use (testing hook; 63 normally).
void set_testing_string_id_bits(int bits);
int testing_string_id_bits();

class StringKeys {
 public:
  explicit StringKeys(int id_bits = 63);
  // A deep copy (a table's clone); the caller holds `o`'s lock. The string -> id index is rebuilt
  // over the copy's own strings. Throws std::bad_alloc.
  StringKeys(const StringKeys& o);
  StringKeys& operator=(const StringKeys&) = delete;

  std::shared_mutex& mutex() const { return mu_; }

  // The id of s, or -1 if s is not in the map.
  int64_t find(std::string_view s) const;
  // The id of s, adding s with a fresh id if absent (*added says which).
  int64_t find_or_add(std::string_view s, bool* added);
  // Makes room for n more strings at once (one rehash per batch instead of several).
  void reserve_more(size_t n);
  // The string of an id, or nullptr.
  const std::string* string_of(int64_t id) const;
  // Drops s / the entry of id (no-op if absent).
  void remove(std::string_view s);
  void remove_id(int64_t id);
  void clear();
  // Drops every entry whose id is not in `live` (sorted ascending).
  void keep_only(const std::vector<int64_t>& live_sorted);
  // Ids of all entries.
  std::vector<int64_t> ids() const;

  int64_t entries() const { return static_cast<int64_t>(by_string_.size()); }
  int64_t key_bytes() const { return key_bytes_; }

 private:
  mutable std::shared_mutex mu_;
  uint64_t id_mask_;
  // id -> string; nodes never move, so by_string_'s views of these strings stay valid.
  std::unordered_map<int64_t, std::string> by_id_;
  // string (a view of the string in by_id_) -> id: lookups by string_view allocate nothing.
  std::unordered_map<std::string_view, int64_t> by_string_;
  int64_t key_bytes_ = 0;
};

}  // namespace dualemb

#endif  // DUALEMB_STRING_KEYS_H_
