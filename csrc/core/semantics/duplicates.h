// semantics/duplicates.h — duplicate keys in one batch, the same way in every backend.
//
// The rule (dualemb_core.h, apply_gradients): the gradients of a key that repeats in a batch are
// summed in batch order — the first occurrence's gradient, then each later one added element by
// element in float32 — and the optimizer steps the row once with that sum. Float addition is not
// associative, so the order is part of the contract: every backend (in-memory, Redis, a GPU
// table) must produce exactly these bits. add_gradient is that one addition; DedupMap finds a
// key's first occurrence without a std::unordered_map in the hot loop.
#ifndef DUALEMB_SEMANTICS_DUPLICATES_H_
#define DUALEMB_SEMANTICS_DUPLICATES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>

namespace dualemb {

// acc[j] += g[j]: a later duplicate's gradient added to the sum so far (float32, in order).
inline void add_gradient(float* acc, const float* g, int64_t dim) {
  for (int64_t j = 0; j < dim; ++j) acc[j] += g[j];
}

// The summed gradient of every distinct key of a batch: out[group(i)] = the gradients of every
// position i with that group, summed in batch order (the first copied, the others added).
// `group(i)` is the dense index (< groups) of position i's key; out holds groups x dim floats.
template <class GroupOf>
void sum_gradients_by_group(int64_t n, const float* grads, int64_t dim, GroupOf&& group,
                            int64_t groups, float* out) {
  std::unique_ptr<uint8_t[]> seen(new uint8_t[static_cast<size_t>(groups)]());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = group(i);
    const float* g = grads + i * dim;
    float* acc = out + j * dim;
    if (!seen[j]) {
      std::memcpy(acc, g, sizeof(float) * static_cast<size_t>(dim));
      seen[j] = 1;
    } else {
      add_gradient(acc, g, dim);
    }
  }
}

// Small open-addressing map from key to a dense index (the order of first occurrence), for
// grouping a batch's duplicates. reserve() only allocates; init() (which cannot fail) empties it
// right before use, so a caller can allocate everything before it changes a row. `h` is the
// key's hash (hash.h).
//
// Emptying costs nothing per slot: each slot carries the generation (init() count) it was
// written in, and a slot of an older generation is empty (clearing 2n+ slots per batch showed in
// the step's profile: docs/benchmarks.md, "Measurements behind the code"). Key, index and
// generation share one 16-byte slot, so a probe touches one cache line.
class DedupMap {
 public:
  DedupMap() = default;
  explicit DedupMap(int64_t n) { reserve(n); }
  // Sizes the map for n keys (2n slots or more, a power of two). Allocates only when the slots
  // held are too few, so a map kept between batches (the table's step scratch) allocates once;
  // a map over fewer keys than before probes only the slots n needs. Throws std::bad_alloc (the
  // map then holds nothing) or std::length_error past 2^32 - 1 keys. init() before use.
  void reserve(int64_t n) {
    if (static_cast<uint64_t>(n) > kMaxKeys)
      throw std::length_error("duplicate grouping: more than 2^32 - 1 keys in one group");
    uint64_t cap = 16;
    while (cap < static_cast<uint64_t>(n) * 2) cap <<= 1;
    if (cap > allocated_) {
      allocated_ = 0;
      slots_.reset(new Slot[cap]());  // generation 0: empty for every init() to come
      allocated_ = cap;
      gen_ = 0;
    }
    mask_ = cap - 1;
  }
  size_t bytes() const { return allocated_ * sizeof(Slot); }
  void init() {
    if (++gen_ == 0) {  // after 2^32 - 1 batches: the old generations could come back
      for (uint64_t i = 0; i < allocated_; ++i) slots_[i].gen = 0;
      gen_ = 1;
    }
  }
  // Returns the dense index of key (`next` if it is new), and whether it was new.
  int64_t get(int64_t key, uint64_t h, int64_t next, bool* inserted) {
    for (uint64_t i = (h >> 17) & mask_;; i = (i + 1) & mask_) {
      Slot& s = slots_[i];
      if (s.gen != gen_) {
        s.key = key;
        s.id = static_cast<uint32_t>(next);
        s.gen = gen_;
        *inserted = true;
        return next;
      }
      if (s.key == key) {
        *inserted = false;
        return s.id;
      }
    }
  }

 private:
  static constexpr uint64_t kMaxKeys = 0xFFFFFFFFu;
  struct Slot {
    int64_t key;
    uint32_t id;   // dense index, < 2^32 - 1 (reserve refuses more keys)
    uint32_t gen;  // the init() this slot was written after; any other: empty
  };
  std::unique_ptr<Slot[]> slots_;
  uint64_t mask_ = 0;
  uint64_t allocated_ = 0;  // slots in slots_
  uint32_t gen_ = 0;
};

}  // namespace dualemb

#endif  // DUALEMB_SEMANTICS_DUPLICATES_H_
