#include "key_index.h"

#include <cstring>
#include <new>
#include <utility>

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

KeyIndex::KeyIndex(const KeyIndex& o)
    : block_((o.mask_ + 1) * sizeof(Slot), Block::Prefault{}), mask_(o.mask_) {
  slots_ = reinterpret_cast<Slot*>(block_.data());
  std::memcpy(slots_, o.slots_, (mask_ + 1) * sizeof(Slot));
}

void KeyIndex::reset(uint64_t cap) {
  Block fresh(cap * sizeof(Slot));  // may throw: nothing has changed yet
  Slot* s = reinterpret_cast<Slot*>(fresh.data());
  for (uint64_t i = 0; i < cap; ++i) s[i] = Slot{0, kEmpty};
  block_ = std::move(fresh);
  slots_ = s;
  mask_ = cap - 1;
}

void KeyIndex::rehash_into(uint64_t cap, KeyIndex* dst) const {
  dst->reset(cap);  // may throw: nothing else has changed yet
  const uint64_t new_mask = cap - 1;
  Slot* s = dst->slots_;
  for (uint64_t j = 0; j <= mask_; ++j) {
    const Slot& old = slots_[j];
    if (old.row == kEmpty) continue;
    uint64_t i = hash_key(old.key) & new_mask;
    while (s[i].row != kEmpty) i = (i + 1) & new_mask;
    s[i] = old;
  }
}

void KeyIndex::rehash(uint64_t cap) {
  KeyIndex fresh{NoArray{}};
  rehash_into(cap, &fresh);
  *this = std::move(fresh);
}

KeyIndex KeyIndex::grown_copy(int64_t n) const {
  KeyIndex fresh{NoArray{}};
  rehash_into(capacity_for(n), &fresh);
  return fresh;
}

void KeyIndex::grow_to(int64_t n) {
  uint64_t cap = capacity_for(n);
  if (cap > mask_ + 1) rehash(cap);
}

void KeyIndex::shrink_for(int64_t n) noexcept {
  const uint64_t cap = mask_ + 1;
  if (cap <= kMinCapacity || static_cast<uint64_t>(n) * 8 >= cap) return;
  try {
    rehash(capacity_for(n));
  } catch (const std::bad_alloc&) {
    // Keeping the larger array is always correct; shrinking only saves memory.
  }
}

}  // namespace dualemb
