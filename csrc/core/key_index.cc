#include "key_index.h"

#include "hash.h"

namespace dualemb {

void KeyIndex::erase(int64_t key, uint64_t h) {
  uint64_t i = h & mask_;
  while (!(slots_[i].row != kEmpty && slots_[i].key == key)) i = (i + 1) & mask_;
  // Backward-shift deletion: pull later entries of the probe run into the hole when their home
  // bucket allows it.
  uint64_t hole = i;
  for (uint64_t j = (i + 1) & mask_; slots_[j].row != kEmpty; j = (j + 1) & mask_) {
    uint64_t home = hash_key(slots_[j].key) & mask_;
    // Entry j may move to `hole` if its home is not in the cyclic interval (hole, j].
    bool home_in_between = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
    if (!home_in_between) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole].row = kEmpty;
}

void KeyIndex::grow_to(int64_t n) {
  uint64_t cap = 16;
  while (cap * 3 < static_cast<uint64_t>(n) * 4) cap <<= 1;
  if (cap <= mask_ + 1) return;
  std::vector<Slot> old;
  old.swap(slots_);
  slots_.assign(cap, Slot{0, kEmpty});
  mask_ = cap - 1;
  for (const Slot& s : old)
    if (s.row != kEmpty) place(s.key, hash_key(s.key), s.row);
}

}  // namespace dualemb
