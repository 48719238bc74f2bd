// hash.h — the key hash. Its top bits pick the shard, its low bits the bucket in the shard.
#ifndef DUALEMB_HASH_H_
#define DUALEMB_HASH_H_

#include <cstdint>

#include "random.h"

namespace dualemb {

constexpr int kShardBits = 6;
constexpr int kNumShards = 1 << kShardBits;

inline uint64_t hash_key(int64_t key) { return mix64(static_cast<uint64_t>(key)); }
inline int shard_of(uint64_t h) { return static_cast<int>(h >> (64 - kShardBits)); }

}  // namespace dualemb

#endif  // DUALEMB_HASH_H_
