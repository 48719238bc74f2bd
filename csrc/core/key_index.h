// key_index.h — open-addressing (linear probing) index from key to row number, for one shard.
// Deletion shifts entries back instead of leaving tombstones, so probes stay short under churn.
#ifndef DUALEMB_KEY_INDEX_H_
#define DUALEMB_KEY_INDEX_H_

#include <cstdint>
#include <cstddef>
#include <vector>

namespace dualemb {

class KeyIndex {
 public:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;

  KeyIndex() { slots_.assign(16, Slot{0, kEmpty}); mask_ = 15; }

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
  // Rebuilds with room for n keys under 3/4 load; `key_hash(row)` is not needed since slots keep
  // their keys.
  void grow_to(int64_t n);
  void clear() { slots_.assign(16, Slot{0, kEmpty}); mask_ = 15; }
  size_t bytes() const { return slots_.size() * sizeof(Slot); }

 private:
  struct Slot {
    int64_t key;
    uint32_t row;
  };
  void place(int64_t key, uint64_t h, uint32_t row) {
    uint64_t i = h & mask_;
    while (slots_[i].row != kEmpty) i = (i + 1) & mask_;
    slots_[i] = Slot{key, row};
  }

  std::vector<Slot> slots_;
  uint64_t mask_;
};

}  // namespace dualemb

#endif  // DUALEMB_KEY_INDEX_H_
