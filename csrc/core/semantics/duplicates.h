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
// grouping a batch's duplicates. The constructor only allocates; init() (which cannot fail)
// clears it right before use, so a caller can allocate everything before it changes a row and
// clear the map while the keys it will probe are in cache. `h` is the key's hash (hash.h).
class DedupMap {
 public:
  explicit DedupMap(int64_t n) {
    uint64_t cap = 16;
    while (cap < static_cast<uint64_t>(n) * 2) cap <<= 1;
    keys_.reset(new int64_t[cap]);
    ids_.reset(new int64_t[cap]);
    mask_ = cap - 1;
  }
  void init() { std::fill(ids_.get(), ids_.get() + mask_ + 1, int64_t(-1)); }
  // Returns the dense index of key (`next` if it is new), and whether it was new.
  int64_t get(int64_t key, uint64_t h, int64_t next, bool* inserted) {
    for (uint64_t i = (h >> 17) & mask_;; i = (i + 1) & mask_) {
      if (ids_[i] < 0) {
        keys_[i] = key;
        ids_[i] = next;
        *inserted = true;
        return next;
      }
      if (keys_[i] == key) {
        *inserted = false;
        return ids_[i];
      }
    }
  }

 private:
  std::unique_ptr<int64_t[]> keys_;
  std::unique_ptr<int64_t[]> ids_;
  uint64_t mask_;
};

}  // namespace dualemb

#endif  // DUALEMB_SEMANTICS_DUPLICATES_H_
