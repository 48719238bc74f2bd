// bucket_math.h — the GPU table's probe and duplicate-summing logic over plain arrays (DE_HD), so
// the CPU can unit-test what the device runs (csrc/cuda/tests/host_math_tests.cc).
//
// Layout (gpu_table.h): `num_buckets` (a power of two) buckets of kBucketSlots slots; slot s holds
// keys[s] and its state occ[s]: kEmpty, kFull, kTombstone (erased: probes go on past it), or
// kBusy (claimed by an insert that has not published its key yet; only inside one kernel).
// A key's home bucket comes from the core's key hash (hash.h's mix64); probing visits buckets
// home, home+1, ... (mod num_buckets) and stops at the first bucket with an empty slot. Every
// operation on one table runs on one stream, one kernel after another, so a batch's lookups never
// race with its inserts; inserts of *distinct* keys race only for free slots (atomicCAS on occ).
//
// Duplicate ids: a batch's positions are stably sorted by key (cub's radix sort is stable), so
// each key's positions form a segment in batch order; its summed gradient is
// g[p0] + g[p1] + ... added left to right, element by element — exactly the CPU table's sum (a
// copy of the first occurrence's gradient, then += each later one). No float atomics anywhere.
#ifndef DUALEMB_CUDA_BUCKET_MATH_H_
#define DUALEMB_CUDA_BUCKET_MATH_H_

#include <cstdint>

#include "de_hd.h"
#include "random.h"
#include "semantics/row_updates.h"

namespace dualemb {
namespace gpu {

constexpr int kBucketSlots = 16;
enum SlotState : int32_t { kEmpty = 0, kFull = 1, kTombstone = 2, kBusy = 3 };

// The core's key hash (hash.h: hash_key), taken modulo the bucket count.
DE_HD inline uint64_t home_bucket(int64_t key, uint64_t num_buckets) {
  return mix64(static_cast<uint64_t>(key)) & (num_buckets - 1);
}

// The slot holding `key`, or -1. Reads occ/keys as they are (no concurrent writer: see above).
DE_HD inline int64_t probe_find(const int64_t* keys, const int32_t* occ, uint64_t num_buckets,
                                int64_t key) {
  uint64_t b = home_bucket(key, num_buckets);
  for (uint64_t visited = 0; visited < num_buckets; ++visited) {
    const int64_t base = static_cast<int64_t>(b) * kBucketSlots;
    bool has_empty = false;
    for (int i = 0; i < kBucketSlots; ++i) {
      const int32_t st = occ[base + i];
      if (st == kFull && keys[base + i] == key) return base + i;
      has_empty |= st == kEmpty;
    }
    if (has_empty) return -1;
    b = (b + 1) & (num_buckets - 1);
  }
  return -1;
}

// Sequential insert of a key known to be absent (host tests; rehash on the host side of a test):
// claims the first empty or tombstone slot along the probe sequence. -1 when the table is full.
// The device version (gpu_table.cu) claims slots in the same order with atomicCAS.
DE_HD inline int64_t probe_insert_serial(int64_t* keys, int32_t* occ, uint64_t num_buckets,
                                         int64_t key) {
  uint64_t b = home_bucket(key, num_buckets);
  for (uint64_t visited = 0; visited < num_buckets; ++visited) {
    const int64_t base = static_cast<int64_t>(b) * kBucketSlots;
    for (int i = 0; i < kBucketSlots; ++i) {
      const int32_t st = occ[base + i];
      if (st == kEmpty || st == kTombstone) {
        occ[base + i] = kFull;
        keys[base + i] = key;
        return base + i;
      }
    }
    b = (b + 1) & (num_buckets - 1);
  }
  return -1;
}

// Element j of the summed gradient of one key: the positions of its segment, in batch order,
// are order[seg_begin .. seg_end). g[p] is row p of the batch's gradients ([n, dim]).
DE_HD inline float segment_sum(const int64_t* order, int64_t seg_begin, int64_t seg_end,
                               const float* grads, int64_t dim, int64_t j) {
  float acc = grads[order[seg_begin] * dim + j];
  for (int64_t q = seg_begin + 1; q < seg_end; ++q) acc += grads[order[q] * dim + j];
  return acc;
}

// accum (TFRA's rule, semantics/row_updates.h accum_action) for one key: whether a key absent
// before the call gets inserted — some position of its segment has exists = 0 (earlier
// positions with exists = 1 are ignored while it is absent).
DE_HD inline bool accum_inserts(const int64_t* order, int64_t seg_begin, int64_t seg_end,
                                const uint8_t* exists) {
  for (int64_t q = seg_begin; q < seg_end; ++q)
    if (!exists[order[q]]) return true;
  return false;
}

// accum for element j of one key's row: its positions walked in batch order, as the CPU walks
// them, each position's action depending on whether the key is present by then. *cell is the
// row's element (read only once present); deltas (and old, may be null: delta = new - old,
// rounded to float32 before the add) are [n, dim]. Returns how many positions applied (the
// update count grows by that much).
DE_HD inline int64_t accum_segment(const int64_t* order, int64_t seg_begin, int64_t seg_end,
                                   const uint8_t* exists, const float* deltas, const float* old,
                                   int64_t dim, int64_t j, bool present, float* cell) {
  int64_t applied = 0;
  for (int64_t q = seg_begin; q < seg_end; ++q) {
    const int64_t i = order[q];
    switch (accum_action(present, exists[i] != 0)) {
      case AccumAction::kInsert:
        *cell = deltas[i * dim + j];
        present = true;
        ++applied;
        break;
      case AccumAction::kAdd: {
        float d = deltas[i * dim + j];
        if (old) d = d - old[i * dim + j];
        *cell += d;
        ++applied;
        break;
      }
      case AccumAction::kIgnore: break;
    }
  }
  return applied;
}

// Whether position q of the key-sorted batch starts a new segment (a new distinct key).
DE_HD inline bool starts_segment(const int64_t* sorted_keys, int64_t q) {
  return q == 0 || sorted_keys[q] != sorted_keys[q - 1];
}

// The smallest power-of-two bucket count whose slots hold `rows` at `max_load` or less.
inline uint64_t buckets_for(int64_t rows, double max_load) {
  uint64_t b = 1;
  while (static_cast<double>(b) * kBucketSlots * max_load < static_cast<double>(rows)) b <<= 1;
  return b;
}

}  // namespace gpu
}  // namespace dualemb

#endif  // DUALEMB_CUDA_BUCKET_MATH_H_
