// small_row_layout.cc — what a small-row layout could gain for `find` (issue 22), measured
// against the real table in one process. Built and run by bench_small_row_layout.py.
//
// Three lookups of the same random present keys, dim 4 or 8 float32, one thread, 64 shards:
//   table     the real core (de_find through the C ABI): 16-byte index slots {key, row}, rows
//             {RowMeta 24 bytes | values} in dense chunks (the row is a second cache miss);
//   separate  a minimal model of that layout (the same hash, shards, load and prefetch blocks,
//             none of the core's checks): the floor of today's design;
//   inline    the layout the issue asks about: the values in the index slot itself
//             ({key, row, values} in 32 bytes at dim 4, 64 at dim 8), so the probe's line is
//             the row's line (one miss); metadata and slots would stay in the row store;
//   gather    out[i] = values[idx[i]] over a dense array of the same rows (no hash, no probe).
// Every lookup writes into a reused output buffer (no allocation timed). The three hashed
// lookups must return the same bytes; the program fails otherwise.
//
// Prints one JSON object per line (M keys/s, median of 9 runs of `calls` batches) and each
// layout's bytes per key. Usage: small_row_layout ROWS DIM [REPEATS]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "dualemb_core.h"
#include "random.h"

namespace {

constexpr int kShards = 64;  // as the core (hash.h): the top 6 hash bits pick the shard
constexpr int kBlock = 16;   // as the core's find: keys per prefetch block
constexpr uint32_t kEmpty = 0xFFFFFFFFu;

uint64_t hash_of(int64_t k) { return dualemb::mix64(static_cast<uint64_t>(k)); }
int shard_of(uint64_t h) { return static_cast<int>(h >> 58); }

// Mapped and written once (as the core's blocks are: small pages, resident).
void* mapped(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  std::memset(p, 0, bytes);
  return p;
}

void row_values(int64_t key, int dim, float* v) {
  for (int j = 0; j < dim; ++j) v[j] = static_cast<float>(key % 1000) * 0.5f + j;
}

// The open-addressing steps both models share (Slot: any struct with `key` and `row`).
// A free slot for a new key with hash h in shard array t (linear probing from its home).
template <class Slot>
Slot* free_slot(Slot* t, uint64_t mask, uint64_t h) {
  uint64_t j = h & mask;
  while (t[j].row != kEmpty) j = (j + 1) & mask;
  return &t[j];
}
// The slot holding `key` in shard array t, or nullptr.
template <class Slot>
const Slot* probe(const Slot* t, uint64_t mask, uint64_t h, int64_t key) {
  for (uint64_t j = h & mask;; j = (j + 1) & mask) {
    if (t[j].row == kEmpty) return nullptr;
    if (t[j].key == key) return &t[j];
  }
}
// A block's first pass: hash each key and start loading its home slot.
template <class Slot>
void hash_and_prefetch(const int64_t* keys, int m, Slot* const* slots, uint64_t mask, uint64_t* h) {
  for (int i = 0; i < m; ++i) {
    h[i] = hash_of(keys[i]);
    __builtin_prefetch(&slots[shard_of(h[i])][h[i] & mask]);
  }
}

// Today's layout, without the core's checks: index slots {key, row} and rows
// {24 bytes of metadata | values}, the row stride padded as RowStore::stride_for does.
struct Separate {
  struct Slot {
    int64_t key;
    uint32_t row;
    uint32_t pad;
  };
  Separate(int dim, uint64_t cap, int64_t rows_per_shard) : dim(dim), vb(4 * dim), mask(cap - 1) {
    const size_t s = 24 + ((vb + 7) & ~size_t(7));
    stride = s > 48 && s < 64 ? 64 : s;
    for (int i = 0; i < kShards; ++i) {
      slots[i] = static_cast<Slot*>(mapped(cap * sizeof(Slot)));
      for (uint64_t j = 0; j < cap; ++j) slots[i][j].row = kEmpty;
      rows[i] = static_cast<unsigned char*>(mapped(rows_per_shard * stride));
    }
  }
  void insert(int64_t key) {
    const uint64_t h = hash_of(key);
    const int s = shard_of(h);
    const uint32_t r = used[s]++;
    *free_slot(slots[s], mask, h) = Slot{key, r, 0};
    float v[16];
    row_values(key, dim, v);
    std::memcpy(rows[s] + r * stride + 24, v, vb);
  }
  template <size_t kVb>
  void find(const int64_t* keys, int64_t n, unsigned char* out) const {
    uint64_t h[kBlock];
    const unsigned char* rp[kBlock];
    for (int64_t b = 0; b < n; b += kBlock) {
      const int m = static_cast<int>(std::min<int64_t>(kBlock, n - b));
      hash_and_prefetch(keys + b, m, slots, mask, h);
      for (int i = 0; i < m; ++i) {
        const int s = shard_of(h[i]);
        const Slot* slot = probe(slots[s], mask, h[i], keys[b + i]);
        rp[i] = slot ? rows[s] + slot->row * stride + 24 : nullptr;
        if (rp[i]) {
          __builtin_prefetch(rp[i]);
          __builtin_prefetch(rp[i] + kVb - 1);
        }
      }
      for (int i = 0; i < m; ++i) {
        if (rp[i])
          std::memcpy(out + (b + i) * kVb, rp[i], kVb);
        else
          std::memset(out + (b + i) * kVb, 0, kVb);
      }
    }
  }
  size_t bytes(uint64_t cap, int64_t rows_per_shard) const {
    return kShards * (cap * sizeof(Slot) + rows_per_shard * stride);
  }
  int dim;
  size_t vb;
  uint64_t mask;
  size_t stride;
  Slot* slots[kShards];
  unsigned char* rows[kShards];
  uint32_t used[kShards] = {};
};

// The values in the index slot: {key, row, values}, kSlot bytes (32 or 64: one line holds
// whole slots).
template <size_t kSlot>
struct Inline {
  struct Slot {
    int64_t key;
    uint32_t row;
    uint32_t pad;
    unsigned char v[kSlot - 16];
  };
  static_assert(sizeof(Slot) == kSlot, "slot size");
  Inline(int dim, uint64_t cap) : dim(dim), vb(4 * dim), mask(cap - 1) {
    for (int i = 0; i < kShards; ++i) {
      slots[i] = static_cast<Slot*>(mapped(cap * sizeof(Slot)));
      for (uint64_t j = 0; j < cap; ++j) slots[i][j].row = kEmpty;
    }
  }
  void insert(int64_t key) {
    const uint64_t h = hash_of(key);
    Slot* slot = free_slot(slots[shard_of(h)], mask, h);
    slot->key = key;
    slot->row = 0;
    float v[16];
    row_values(key, dim, v);
    std::memcpy(slot->v, v, vb);
  }
  template <size_t kVb>
  void find(const int64_t* keys, int64_t n, unsigned char* out) const {
    uint64_t h[kBlock];
    for (int64_t b = 0; b < n; b += kBlock) {
      const int m = static_cast<int>(std::min<int64_t>(kBlock, n - b));
      hash_and_prefetch(keys + b, m, slots, mask, h);
      for (int i = 0; i < m; ++i) {
        const Slot* slot = probe(slots[shard_of(h[i])], mask, h[i], keys[b + i]);
        const unsigned char* v = slot ? slot->v : nullptr;
        if (v)
          std::memcpy(out + (b + i) * kVb, v, kVb);
        else
          std::memset(out + (b + i) * kVb, 0, kVb);
      }
    }
  }
  // The slots alone; the row store that keeps metadata (and slots, with an optimizer) comes on
  // top: the caller adds it.
  size_t bytes(uint64_t cap) const { return kShards * cap * sizeof(Slot); }
  int dim;
  size_t vb;
  uint64_t mask;
  Slot* slots[kShards];
};

template <class F>
double median_seconds(F&& f) {
  std::vector<double> t;
  for (int r = 0; r < 9; ++r) {
    const auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

template <size_t kVb, size_t kSlot>
int run(int64_t rows, int repeats) {
  constexpr int dim = static_cast<int>(kVb / 4);
  std::mt19937_64 rng(7);
  std::vector<int64_t> keys(rows);
  for (auto& k : keys) k = static_cast<int64_t>(rng() >> 2);  // distinct with near certainty
  // The core's index capacity for its share of rows at 3/4 load (key_index.h capacity_for),
  // and the model's per-shard row room (hash shares vary around rows / 64).
  const int64_t per_shard = rows / kShards;
  uint64_t cap = 16;
  while (cap * 3 < static_cast<uint64_t>(per_shard) * 4) cap <<= 1;
  const int64_t room = per_shard + per_shard / 4 + 1024;
  Separate sep(dim, cap, room);
  Inline<kSlot> inl(dim, cap);
  std::vector<float> vals(static_cast<size_t>(rows) * dim);
  for (int64_t i = 0; i < rows; ++i) {
    sep.insert(keys[i]);
    inl.insert(keys[i]);
    row_values(keys[i], dim, &vals[i * dim]);
  }
  int64_t id = 0, evicted = 0;
  char config[96];
  std::snprintf(config, sizeof config, "{\"dim\":%d,\"num_threads\":1}", dim);
  if (de_table_create(0, config, &id) != 0) return std::fprintf(stderr, "de_table_create\n"), 1;
  for (int64_t s = 0; s < rows; s += 131072) {
    const int64_t m = std::min<int64_t>(131072, rows - s);
    if (de_insert_or_assign(id, DE_KEY_INT64, &keys[s], m, &vals[s * dim], &evicted) != 0)
      return std::fprintf(stderr, "de_insert_or_assign\n"), 1;
  }
  float* dense = static_cast<float*>(mapped(static_cast<size_t>(rows) * kVb));
  std::memcpy(dense, vals.data(), static_cast<size_t>(rows) * kVb);

  const int64_t batch = 65536;
  const int calls = 20;
  std::vector<int64_t> idx(batch * calls), q(batch * calls);
  for (size_t i = 0; i < idx.size(); ++i) {
    idx[i] = static_cast<int64_t>(rng() % rows);
    q[i] = keys[idx[i]];
  }
  std::vector<unsigned char> o1(batch * kVb), o2(batch * kVb), o3(batch * kVb), o4(batch * kVb);
  std::vector<uint8_t> exists(batch);
  // Same answers from all: a model that looked up something else would measure nothing.
  if (de_find(id, DE_KEY_INT64, q.data(), batch, o1.data(), exists.data()) != 0)
    return std::fprintf(stderr, "de_find\n"), 1;
  sep.find<kVb>(q.data(), batch, o2.data());
  inl.template find<kVb>(q.data(), batch, o3.data());
  for (int64_t i = 0; i < batch; ++i) std::memcpy(o4.data() + i * kVb, dense + idx[i] * dim, kVb);
  if (std::memcmp(o1.data(), o2.data(), o1.size()) ||
      std::memcmp(o1.data(), o3.data(), o1.size()) || std::memcmp(o1.data(), o4.data(), o1.size()))
    return std::fprintf(stderr, "the lookups disagree\n"), 1;

  const double mkeys = static_cast<double>(batch) * calls / 1e6;
  for (int r = 0; r < repeats; ++r) {
    const double t_table = median_seconds([&] {
      for (int c = 0; c < calls; ++c)
        de_find(id, DE_KEY_INT64, &q[c * batch], batch, o1.data(), exists.data());
    });
    const double t_sep = median_seconds([&] {
      for (int c = 0; c < calls; ++c) sep.find<kVb>(&q[c * batch], batch, o2.data());
    });
    const double t_inl = median_seconds([&] {
      for (int c = 0; c < calls; ++c) inl.template find<kVb>(&q[c * batch], batch, o3.data());
    });
    const double t_gather = median_seconds([&] {
      for (int c = 0; c < calls; ++c) {
        const int64_t* ix = &idx[c * batch];
        for (int64_t i = 0; i < batch; ++i)
          std::memcpy(o4.data() + i * kVb, dense + ix[i] * dim, kVb);
      }
    });
    std::printf(
        "{\"rows\": %lld, \"dim\": %d, \"repeat\": %d, \"mkeys_per_s\": {\"table\": %.2f, "
        "\"separate\": %.2f, \"inline\": %.2f, \"gather\": %.2f}, \"bytes_per_key\": "
        "{\"separate\": %.1f, \"inline\": %.1f, \"inline_slot\": %d, \"gather\": %d}}\n",
        static_cast<long long>(rows), dim, r, mkeys / t_table, mkeys / t_sep, mkeys / t_inl,
        mkeys / t_gather, static_cast<double>(sep.bytes(cap, per_shard)) / rows,
        // inline: its slots plus the row store's metadata row (24 bytes) it would still keep
        static_cast<double>(inl.bytes(cap)) / rows + 24.0, static_cast<int>(kSlot),
        static_cast<int>(kVb));
    std::fflush(stdout);
  }
  de_table_destroy(id);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return std::fprintf(stderr, "usage: small_row_layout ROWS DIM [REPEATS]\n"), 2;
  const int64_t rows = std::atoll(argv[1]);
  const int dim = std::atoi(argv[2]);
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 3;
  if (rows < 1024) return std::fprintf(stderr, "ROWS must be at least 1024\n"), 2;
  switch (dim) {
    case 4: return run<16, 32>(rows, repeats);
    case 8: return run<32, 64>(rows, repeats);
    default: return std::fprintf(stderr, "DIM must be 4 or 8 (rows that fit a 64-byte slot)\n"), 2;
  }
}
