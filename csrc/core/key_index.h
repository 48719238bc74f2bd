// key_index.h — open-addressing (linear probing) index from key to row number, for one shard.
// Deletion shifts entries back instead of leaving tombstones, so probes stay short under churn.
//
// Every resize allocates and fills the new array before the old one is dropped, so a failed
// allocation (std::bad_alloc) leaves the index exactly as it was.
#ifndef DUALEMB_KEY_INDEX_H_
#define DUALEMB_KEY_INDEX_H_

#include <cstddef>
#include <cstdint>

#include "memory_block.h"

namespace dualemb {

class KeyIndex {
 public:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  static constexpr uint64_t kMinCapacity = 16;

  KeyIndex() { reset(kMinCapacity); }
  KeyIndex(KeyIndex&&) noexcept = default;
  KeyIndex& operator=(KeyIndex&&) noexcept = default;
  // A deep copy (a table's clone, storage/storage.h). Throws std::bad_alloc.
  KeyIndex(const KeyIndex& o);
  KeyIndex& operator=(const KeyIndex&) = delete;

  // Row of `key` (whose hash is h), or -1.
  int64_t find(int64_t key, uint64_t h) const {
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.row == kEmpty) return -1;
      if (s.key == key) return s.row;
    }
  }
  void prefetch(uint64_t h) const { __builtin_prefetch(&slots_[h & mask_]); }

  // Records key -> row; the key must be absent. Grows first if the load would pass 3/4.
  void insert(int64_t key, uint64_t h, uint32_t row, int64_t size_after) {
    if (static_cast<uint64_t>(size_after) * 4 > (mask_ + 1) * 3) grow_to(size_after);
    place(key, h, row);
  }
  // Points an existing key at another row.
  void update(int64_t key, uint64_t h, uint32_t row) {
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      if (slots_[i].key == key && slots_[i].row != kEmpty) { slots_[i].row = row; return; }
    }
  }
  // Removes `key` (present).
  void erase(int64_t key, uint64_t h);
  // Makes room for n keys under 3/4 load (never shrinks). Throws std::bad_alloc, unchanged.
  void grow_to(int64_t n);
  // Whether n keys need a larger array, and a copy of this index with room for them (for
  // callers that must allocate several indexes before committing any).
  bool needs_growth(int64_t n) const { return capacity_for(n) > mask_ + 1; }
  KeyIndex grown_copy(int64_t n) const;
  // After erasures: rebuilds smaller when fewer than 1/8 of the slots are used by the `n` keys,
  // so an emptied shard gives its index memory back. Optional: an allocation failure keeps the
  // current array.
  void shrink_for(int64_t n) noexcept;
  // Drops every key and the array (back to the minimum). Throws std::bad_alloc, unchanged.
  void clear() { reset(kMinCapacity); }
  // Whether empty_for(n) keeps this array (it already has the size an index grown for n keys
  // from empty would get), so it allocates nothing.
  bool empties_in_place(int64_t n) const { return capacity_for(n) == mask_ + 1; }
  // Drops every key, keeping the array; only where empties_in_place(n). Rewriting resident
  // slots costs a fraction of mapping (and faulting in) a fresh array of the same size.
  void empty_in_place() noexcept {
    for (uint64_t i = 0; i <= mask_; ++i) slots_[i] = Slot{0, kEmpty};
  }
  // An empty index with the array that growing an empty one for n keys would allocate.
  static KeyIndex empty_for(int64_t n) {
    KeyIndex k{NoArray{}};
    k.reset(capacity_for(n));
    return k;
  }
  size_t bytes() const { return block_.footprint(); }
  // Bytes an index for n keys would take (for up-front size checks).
  static long double bytes_for(int64_t n) {
    return static_cast<long double>(capacity_for(n)) * sizeof(Slot);
  }

 private:
  struct Slot {
    int64_t key;
    uint32_t row;
  };
  static uint64_t capacity_for(int64_t n) {
    uint64_t cap = kMinCapacity;
    while (cap * 3 < static_cast<uint64_t>(n) * 4) cap <<= 1;
    return cap;
  }
  void place(int64_t key, uint64_t h, uint32_t row) {
    uint64_t i = h & mask_;
    while (slots_[i].row != kEmpty) i = (i + 1) & mask_;
    slots_[i] = Slot{key, row};
  }
  struct NoArray {};
  explicit KeyIndex(NoArray) {}
  // Fills `dst` (fresh array of `cap` slots) with this index's entries.
  void rehash_into(uint64_t cap, KeyIndex* dst) const;
  // Rehashes into a fresh array of `cap` slots (allocated before anything changes).
  void rehash(uint64_t cap);
  void reset(uint64_t cap);

  Block block_;
  Slot* slots_ = nullptr;
  uint64_t mask_ = 0;
};

}  // namespace dualemb

#endif  // DUALEMB_KEY_INDEX_H_
