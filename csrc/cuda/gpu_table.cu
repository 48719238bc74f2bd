// gpu_table.cu — GpuTable (gpu_table.h): kernels and the host-side orchestration of each op.
//
// Every write follows one pattern, so that a failure leaves the table unchanged:
//   1. dedup: positions stably sorted by key (cub radix sort), segment heads selected;
//   2. locate the distinct keys, count the missing ones, and make room (a rehash allocates the
//      whole new layout before touching the old one); every scratch buffer is allocated here;
//   3. only then the kernels that write: claim slots for missing keys, fill rows and metadata.
#include "gpu_table.h"

#include <cooperative_groups.h>
#include <thrust/iterator/counting_iterator.h>
#include <cub/cub.cuh>

#include <algorithm>
#include <cmath>

#include <stdexcept>
#include <string>

#include "bucket_math.h"
#include "config.h"
#include "initializer.h"
#include "semantics/restrict_ranking.h"

namespace dualemb {
namespace gpu {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so the next call starts clean
  if (e == cudaErrorMemoryAllocation)
    throw std::runtime_error(std::string("GPU table: out of GPU memory (") + what +
                             "); the table is unchanged");
  throw std::runtime_error(std::string("GPU table: CUDA error in ") + what + ": " +
                           cudaGetErrorString(e));
}

int blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 32 ? 65535 * 32 : b));
}

// A stream-ordered device buffer; allocation failure throws before anything is written.
template <class T>
class Buffer {
 public:
  Buffer(int64_t count, cudaStream_t stream, const char* what) : stream_(stream) {
    if (count <= 0) return;
    check(cudaMallocAsync(reinterpret_cast<void**>(&p_), sizeof(T) * count, stream), what);
  }
  ~Buffer() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* get() const { return p_; }

 private:
  T* p_ = nullptr;
  cudaStream_t stream_;
};

__global__ void iota_kernel(int64_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = i;
}

__global__ void head_flags_kernel(const int64_t* sorted, int64_t n, uint8_t* flags) {
  for (int64_t q = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; q < n;
       q += int64_t(gridDim.x) * blockDim.x)
    flags[q] = starts_segment(sorted, q) ? 1 : 0;
}

// One key per tile of kBucketSlots threads: lane l reads slot l of each bucket on the probe
// sequence, so a bucket's keys and states are one coalesced read (a thread per key reads 16
// scattered slots on its own). Visits the buckets probe_find (bucket_math.h) visits and returns
// the same slot: a key is in at most one full slot. Every lane returns the slot.
using Tile = cg::thread_block_tile<kBucketSlots>;

__device__ inline int64_t probe_find_tile(const Tile& tile, const int64_t* keys, const int32_t* occ,
                                          uint64_t buckets, int64_t key) {
  const unsigned lane = tile.thread_rank();
  uint64_t b = home_bucket(key, buckets);
  for (uint64_t visited = 0; visited < buckets; ++visited) {
    const int64_t s = static_cast<int64_t>(b) * kBucketSlots + lane;
    const int32_t st = occ[s];
    const unsigned hit = tile.ballot(st == kFull && keys[s] == key);
    if (hit) return static_cast<int64_t>(b) * kBucketSlots + (__ffs(hit) - 1);
    if (tile.any(st == kEmpty)) return -1;
    b = (b + 1) & (buckets - 1);
  }
  return -1;
}

constexpr int kTilesPerBlock = kThreads / kBucketSlots;

int tile_blocks_for(int64_t n) {
  const int64_t b = (n + kTilesPerBlock - 1) / kTilesPerBlock;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 32 ? 65535 * 32 : b));
}

// The tiles of the grid, each over keys i = its index, + the tile count, ... (uniform per tile).
#define FOR_EACH_TILE_KEY(tile, i, n)                                                          \
  const Tile tile = cg::tiled_partition<kBucketSlots>(cg::this_thread_block());                \
  for (int64_t i = blockIdx.x * int64_t(kTilesPerBlock) + threadIdx.x / kBucketSlots; i < (n); \
       i += int64_t(gridDim.x) * kTilesPerBlock)

__global__ void locate_kernel(const int64_t* keys, const int32_t* occ, uint64_t buckets,
                              const int64_t* query, int64_t n, int64_t* slot) {
  FOR_EACH_TILE_KEY(tile, i, n) {
    const int64_t s = probe_find_tile(tile, keys, occ, buckets, query[i]);
    if (tile.thread_rank() == 0) slot[i] = s;
  }
}

// find in one pass: the tile probes, then copies the row or writes the key's initial row
// (values[i]; exists[i] = found), with no slot array between a locate and a gather kernel.
__global__ void find_kernel(const int64_t* keys, const int32_t* occ, uint64_t buckets,
                            const float* rows, int64_t width, int64_t dim, const int64_t* query,
                            int64_t n, kernels::InitKernel init, float* values, uint8_t* exists) {
  FOR_EACH_TILE_KEY(tile, i, n) {
    const int64_t key = query[i];
    const int64_t s = probe_find_tile(tile, keys, occ, buckets, key);
    float* out = values + i * dim;
    if (s >= 0) {
      const float* row = rows + s * width;
      for (int64_t j = tile.thread_rank(); j < dim; j += kBucketSlots) out[j] = row[j];
    } else {
      for (int64_t j = tile.thread_rank(); j < dim; j += kBucketSlots)
        out[j] = kernels::initial_value(init, static_cast<uint64_t>(key), j);
    }
    if (exists && tile.thread_rank() == 0) exists[i] = s >= 0 ? 1 : 0;
  }
}

// Distinct key u of the sorted batch: sorted[heads[u]].
__global__ void unique_keys_kernel(const int64_t* sorted, const int64_t* heads, int64_t u_count,
                                   int64_t* out) {
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < u_count;
       u += int64_t(gridDim.x) * blockDim.x)
    out[u] = sorted[heads[u]];
}

// Missing keys that `want` (may be null: all) selects for insertion.
__global__ void count_missing_kernel(const int64_t* slot, const uint8_t* want, int64_t n,
                                     unsigned long long* count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    if (slot[i] < 0 && (!want || want[i]))
      atomicAdd(count, 1ull);  // an integer count: order does not matter
}

// Claims a slot for each missing distinct key (slot[u] < 0) that `want` (may be null) selects,
// in probe order, and writes its key, initial row, initial slots and metadata. Distinct keys
// only, so no two threads insert one key. counters[0]: keys that found no slot (a bug after
// reserve_for); counters[1]: tombstones reused.
__global__ void insert_kernel(int64_t* keys, int32_t* occ, float* rows, int64_t* last_update,
                              int64_t* count, uint64_t buckets, int64_t width, int64_t dim,
                              const int64_t* ukeys, int64_t u_count, int64_t* slot,
                              const uint8_t* want, kernels::InitKernel init, const float* slot_init,
                              int num_slots, int64_t stamp, unsigned long long* counters) {
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < u_count;
       u += int64_t(gridDim.x) * blockDim.x) {
    if (slot[u] >= 0 || (want && !want[u])) continue;
    const int64_t key = ukeys[u];
    uint64_t b = home_bucket(key, buckets);
    int64_t got = -1;
    for (uint64_t visited = 0; visited < buckets && got < 0; ++visited) {
      const int64_t base = static_cast<int64_t>(b) * kBucketSlots;
      for (int i = 0; i < kBucketSlots && got < 0; ++i) {
        if (atomicCAS(&occ[base + i], kEmpty, kBusy) == kEmpty) {
          got = base + i;
        } else if (atomicCAS(&occ[base + i], kTombstone, kBusy) == kTombstone) {
          got = base + i;
          atomicAdd(&counters[1], 1ull);
        }
      }
      b = (b + 1) & (buckets - 1);
    }
    if (got < 0) {  // cannot happen after reserve_for; reported rather than ignored
      atomicAdd(&counters[0], 1ull);
      continue;
    }
    keys[got] = key;
    float* row = rows + got * width;
    for (int64_t j = 0; j < dim; ++j)
      row[j] = kernels::initial_value(init, static_cast<uint64_t>(key), j);
    for (int s = 0; s < num_slots; ++s)
      for (int64_t j = 0; j < dim; ++j) row[dim * (1 + s) + j] = slot_init[s];
    last_update[got] = stamp;
    count[got] = 0;
    __threadfence();
    occ[got] = kFull;
    slot[u] = got;
  }
}

// find_or_insert's rows: exists[i] says whether the key was there before this call — the CPU's
// rule (semantics/row_updates.h stamped_by_this_call): a row stamped by this call is new.
__global__ void gather_after_insert_kernel(const float* rows, const int64_t* last_update,
                                           int64_t width, int64_t dim, const int64_t* after,
                                           int64_t n, int64_t stamp, float* values,
                                           uint8_t* exists) {
  const int64_t total = n * dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / dim, j = e % dim;
    values[e] = rows[after[i] * width + j];
    if (exists && j == 0) exists[i] = last_update[after[i]] == stamp ? 0 : 1;
  }
}

__device__ inline int64_t segment_end(const int64_t* heads, int64_t u, int64_t u_count, int64_t n) {
  return u + 1 < u_count ? heads[u + 1] : n;
}

__device__ inline void bump(int64_t* c, int64_t by) {
  const int64_t v = *c + by;
  *c = v > 0xffffffffll ? 0xffffffffll : v;  // the CPU's uint32 count saturates
}

// insert_or_assign: the last occurrence of each key wins; the count grows by its occurrences.
__global__ void assign_kernel(float* rows, int64_t* last_update, int64_t* count, int64_t width,
                              int64_t dim, const int64_t* slot, const int64_t* heads,
                              const int64_t* order, int64_t u_count, int64_t n, const float* values,
                              int64_t stamp) {
  const int64_t total = u_count * dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t u = e / dim, j = e % dim;
    const int64_t end = segment_end(heads, u, u_count, n);
    rows[slot[u] * width + j] = values[order[end - 1] * dim + j];
    if (j == 0) {
      last_update[slot[u]] = stamp;
      bump(&count[slot[u]], end - heads[u]);
    }
  }
}

// apply_gradients, part 1: the summed gradient of each distinct key, in batch order.
__global__ void segment_sum_kernel(const int64_t* heads, const int64_t* order, int64_t u_count,
                                   int64_t n, const float* grads, int64_t dim, float* summed) {
  const int64_t total = u_count * dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t u = e / dim, j = e % dim;
    summed[e] = segment_sum(order, heads[u], segment_end(heads, u, u_count, n), grads, dim, j);
  }
}

// apply_gradients, part 2: the optimizer step of each element (optimizer_math.h).
__global__ void apply_kernel(float* rows, int64_t* last_update, int64_t* count, int64_t width,
                             int64_t dim, const int64_t* slot, int64_t u_count, const float* summed,
                             kernels::OptimizerKernel k, kernels::StepScalars s, int64_t stamp) {
  const int64_t total = u_count * dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t u = e / dim, j = e % dim;
    float* row = rows + slot[u] * width;
    kernels::apply_element(k, s, row, row + dim, summed + u * dim, dim, j);
    if (j == 0) {
      last_update[slot[u]] = stamp;
      bump(&count[slot[u]], 1);
    }
  }
}

// accum, part 1: which missing distinct keys insert (bucket_math.h accum_inserts).
__global__ void accum_want_kernel(const int64_t* heads, const int64_t* order, int64_t u_count,
                                  int64_t n, const uint8_t* exists, uint8_t* want) {
  for (int64_t u = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; u < u_count;
       u += int64_t(gridDim.x) * blockDim.x)
    want[u] = accum_inserts(order, heads[u], segment_end(heads, u, u_count, n), exists) ? 1 : 0;
}

// accum, part 2: each key's positions in batch order (bucket_math.h accum_segment).
__global__ void accum_kernel(float* rows, int64_t* last_update, int64_t* count, int64_t width,
                             int64_t dim, const int64_t* slot, const int64_t* before,
                             const int64_t* heads, const int64_t* order, int64_t u_count, int64_t n,
                             const float* deltas, const float* old, const uint8_t* exists,
                             int64_t stamp) {
  const int64_t total = u_count * dim;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t u = e / dim, j = e % dim;
    if (slot[u] < 0) continue;  // absent and never inserted
    const int64_t applied =
        accum_segment(order, heads[u], segment_end(heads, u, u_count, n), exists, deltas, old, dim,
                      j, before[u] >= 0, rows + slot[u] * width + j);
    if (j == 0 && applied) {
      last_update[slot[u]] = stamp;
      bump(&count[slot[u]], applied);
    }
  }
}

// import: the last occurrence of each key gives its row, slots and metadata.
__global__ void import_kernel(float* rows, int64_t* last_update, int64_t* count, int64_t width,
                              int64_t dim, const int64_t* slot, const int64_t* heads,
                              const int64_t* order, int64_t u_count, int64_t n, const float* values,
                              const float* slots, const int64_t* lu_in, const int64_t* count_in,
                              int64_t stamp) {
  const int64_t total = u_count * width;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t u = e / width, c = e % width;
    const int64_t last = order[segment_end(heads, u, u_count, n) - 1];
    float* row = rows + slot[u] * width;
    if (c < dim)
      row[c] = values[last * dim + c];
    else if (slots)
      row[c] = slots[last * (width - dim) + (c - dim)];
    if (c == 0) {
      last_update[slot[u]] = lu_in ? lu_in[last] : stamp;
      const int64_t k = count_in ? count_in[last] : 0;  // imported_count: clamped to uint32
      count[slot[u]] = k < 0 ? 0 : (k > 0xffffffffll ? 0xffffffffll : k);
    }
  }
}

__global__ void meta_kernel(const int64_t* keys, const int64_t* lu, const int64_t* cnt,
                            const int64_t* full, int64_t m, int64_t* out_keys, int64_t* out_lu,
                            int64_t* out_cnt) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < m;
       r += int64_t(gridDim.x) * blockDim.x) {
    out_keys[r] = keys[full[r]];
    out_lu[r] = lu[full[r]];
    out_cnt[r] = cnt[full[r]];
  }
}

// Erases the rows at positions `pos` of the list of full slots `full`.
__global__ void erase_listed_kernel(int32_t* occ, const int64_t* full, const int64_t* pos,
                                    int64_t k) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < k;
       i += int64_t(gridDim.x) * blockDim.x)
    occ[full[pos[i]]] = kTombstone;
}

__global__ void erase_kernel(int32_t* occ, const int64_t* slot, int64_t n,
                             unsigned long long* erased) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    if (slot[i] >= 0 && atomicCAS(&occ[slot[i]], kFull, kTombstone) == kFull)
      atomicAdd(erased, 1ull);  // duplicates of a key erase it once
}

// set_optimizer on a non-empty table: the same slots, keys, values and metadata, the slot
// columns of the new width at the new optimizer's initial values (tombstones become empty).
__global__ void rewidth_kernel(const int64_t* okeys, const int32_t* oocc, const float* orows,
                               const int64_t* olu, const int64_t* ocnt, int64_t cap, int64_t owidth,
                               int64_t dim, int64_t* nkeys, int32_t* nocc, float* nrows,
                               int64_t* nlu, int64_t* ncnt, int64_t nwidth,
                               const float* slot_init) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < cap;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (oocc[i] != kFull) continue;
    nkeys[i] = okeys[i];
    for (int64_t j = 0; j < dim; ++j) nrows[i * nwidth + j] = orows[i * owidth + j];
    for (int64_t c = dim; c < nwidth; ++c) nrows[i * nwidth + c] = slot_init[(c - dim) / dim];
    nlu[i] = olu[i];
    ncnt[i] = ocnt[i];
    nocc[i] = kFull;
  }
}

__global__ void full_flags_kernel(const int32_t* occ, int64_t cap, uint8_t* flags) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < cap;
       i += int64_t(gridDim.x) * blockDim.x)
    flags[i] = occ[i] == kFull ? 1 : 0;
}

__global__ void export_kernel(const int64_t* keys, const float* rows, const int64_t* lu,
                              const int64_t* cnt, int64_t width, int64_t dim, int num_slots,
                              const int64_t* slots_in_order, int64_t m, int64_t* out_keys,
                              float* out_values, float* out_slots, int64_t* out_lu,
                              int64_t* out_cnt) {
  const int64_t total = m * width;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = e / width, c = e % width;
    const int64_t s = slots_in_order[r];
    const float v = rows[s * width + c];
    if (c < dim)
      out_values[r * dim + c] = v;
    else if (out_slots)
      out_slots[r * (width - dim) + (c - dim)] = v;
    if (c == 0) {
      out_keys[r] = keys[s];
      if (out_lu) out_lu[r] = lu[s];
      if (out_cnt) out_cnt[r] = cnt[s];
    }
  }
  (void)num_slots;
}

// Moves every full slot of the old layout into the new one (distinct keys: no duplicates).
__global__ void rehash_kernel(const int64_t* okeys, const int32_t* oocc, const float* orows,
                              const int64_t* olu, const int64_t* ocnt, int64_t ocap, int64_t* nkeys,
                              int32_t* nocc, float* nrows, int64_t* nlu, int64_t* ncnt,
                              uint64_t nbuckets, int64_t width, unsigned long long* failed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < ocap;
       i += int64_t(gridDim.x) * blockDim.x) {
    if (oocc[i] != kFull) continue;
    const int64_t key = okeys[i];
    uint64_t b = home_bucket(key, nbuckets);
    int64_t got = -1;
    for (uint64_t visited = 0; visited < nbuckets && got < 0; ++visited) {
      const int64_t base = static_cast<int64_t>(b) * kBucketSlots;
      for (int s = 0; s < kBucketSlots && got < 0; ++s)
        if (atomicCAS(&nocc[base + s], kEmpty, kBusy) == kEmpty) got = base + s;
      b = (b + 1) & (nbuckets - 1);
    }
    if (got < 0) {
      atomicAdd(failed, 1ull);
      continue;
    }
    nkeys[got] = key;
    for (int64_t c = 0; c < width; ++c) nrows[got * width + c] = orows[i * width + c];
    nlu[got] = olu[i];
    ncnt[got] = ocnt[i];
    nocc[got] = kFull;
  }
}

}  // namespace

// The device arrays of one bucket layout (capacity = buckets * kBucketSlots slots).
struct GpuTable::Arrays {
  uint64_t buckets = 0;
  int64_t cap = 0;
  int64_t* keys = nullptr;
  int32_t* occ = nullptr;
  float* rows = nullptr;
  int64_t* last_update = nullptr;
  int64_t* count = nullptr;
  float* slot_init = nullptr;

  Arrays(uint64_t b, int64_t width, const std::vector<float>& slot_init_host, cudaStream_t stream)
      : buckets(b), cap(static_cast<int64_t>(b) * kBucketSlots) {
    try {
      check(cudaMalloc(&keys, sizeof(int64_t) * cap), "allocating keys");
      check(cudaMalloc(&occ, sizeof(int32_t) * cap), "allocating slot states");
      check(cudaMalloc(&rows, sizeof(float) * cap * width), "allocating rows");
      check(cudaMalloc(&last_update, sizeof(int64_t) * cap), "allocating metadata");
      check(cudaMalloc(&count, sizeof(int64_t) * cap), "allocating metadata");
      if (!slot_init_host.empty()) {
        check(cudaMalloc(&slot_init, sizeof(float) * slot_init_host.size()),
              "allocating slot initial values");
        check(
            cudaMemcpyAsync(slot_init, slot_init_host.data(), sizeof(float) * slot_init_host.size(),
                            cudaMemcpyHostToDevice, stream),
            "copying slot initial values");
      }
      check(cudaMemsetAsync(occ, 0, sizeof(int32_t) * cap, stream), "clearing slot states");
    } catch (...) {
      release();
      throw;
    }
  }
  ~Arrays() { release(); }
  void release() {
    cudaFree(keys);
    cudaFree(occ);
    cudaFree(rows);
    cudaFree(last_update);
    cudaFree(count);
    cudaFree(slot_init);
    keys = nullptr;
    occ = nullptr;
    rows = nullptr;
    last_update = count = nullptr;
    slot_init = nullptr;
  }
};

namespace {

std::vector<float> slot_initial_values(const Optimizer* opt) {
  std::vector<float> v;
  if (opt)
    for (int s = 0; s < opt->num_slots(); ++s) v.push_back(opt->slot_initial_value(s));
  return v;
}

// The batch's positions stably sorted by key, and the start of each distinct key's segment.
struct Dedup {
  Dedup(const int64_t* keys, int64_t n, cudaStream_t stream)
      : sorted(n, stream, "dedup keys"),
        order(n, stream, "dedup order"),
        heads(n, stream, "dedup heads"),
        ukeys(n, stream, "dedup distinct keys") {
    if (n == 0) return;
    Buffer<int64_t> pos(n, stream, "dedup positions");
    Buffer<uint8_t> flags(n, stream, "dedup flags");
    Buffer<int64_t> num(1, stream, "dedup count");
    iota_kernel<<<blocks_for(n), kThreads, 0, stream>>>(pos.get(), n);
    size_t sort_bytes = 0, select_bytes = 0;
    cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, keys, sorted.get(), pos.get(), order.get(),
                                    n, 0, 64, stream);
    thrust::counting_iterator<int64_t> counting(0);
    cub::DeviceSelect::Flagged(nullptr, select_bytes, counting, flags.get(), heads.get(), num.get(),
                               n, stream);
    Buffer<unsigned char> temp(static_cast<int64_t>(std::max(sort_bytes, select_bytes)), stream,
                               "dedup scratch");
    check(cub::DeviceRadixSort::SortPairs(temp.get(), sort_bytes, keys, sorted.get(), pos.get(),
                                          order.get(), n, 0, 64, stream),
          "sorting keys");
    head_flags_kernel<<<blocks_for(n), kThreads, 0, stream>>>(sorted.get(), n, flags.get());
    check(cub::DeviceSelect::Flagged(temp.get(), select_bytes, counting, flags.get(), heads.get(),
                                     num.get(), n, stream),
          "selecting distinct keys");
    check(cudaMemcpyAsync(&count, num.get(), sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
          "reading the distinct key count");
    check(cudaStreamSynchronize(stream), "dedup");
    unique_keys_kernel<<<blocks_for(count), kThreads, 0, stream>>>(sorted.get(), heads.get(), count,
                                                                   ukeys.get());
  }
  Buffer<int64_t> sorted, order, heads, ukeys;
  int64_t count = 0;
};

// restrict's refusal of NaN scores, with the CPU's message (storage/table_options.cc
// check_restrict_scores; that file is not linked here: it pulls in the string-value code).
void check_scores(const int64_t* keys, const float* scores, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(scores[i]))
      throw std::invalid_argument("the score of key " + std::to_string(keys[i]) + " (position " +
                                  std::to_string(i) +
                                  ") is NaN; scores must be numbers (+-inf allowed)");
}

int64_t read_counter(unsigned long long* d, cudaStream_t stream, const char* what) {
  unsigned long long h = 0;
  check(cudaMemcpyAsync(&h, d, sizeof(h), cudaMemcpyDeviceToHost, stream), what);
  check(cudaStreamSynchronize(stream), what);
  return static_cast<int64_t>(h);
}

}  // namespace

// restrict's scratch and steps. Everything a ranking needs (device lists of the full slots and
// their metadata, host copies, the ranking buffer) is allocated in the constructor, so a write
// makes it before it changes a row and its capacity eviction cannot fail halfway for memory.
// The ranking itself is the shared host code (semantics/restrict_ranking.h) over the metadata
// copied back, so every row keeps or goes exactly as on the CPU.
class GpuTable::Ranking {
 public:
  // cap: the slots of the layout it will walk; rows: the most rows it will rank.
  Ranking(int64_t cap, int64_t rows, cudaStream_t stream)
      : flags_(cap, stream, "ranking flags"),
        full_(cap, stream, "ranking slots"),
        num_(1, stream, "ranking count"),
        keys_(rows, stream, "ranking keys"),
        lu_(rows, stream, "ranking stamps"),
        cnt_(rows, stream, "ranking counts"),
        pos_(rows, stream, "ranking erase list"),
        temp_(select_bytes(cap, stream), stream, "ranking scratch"),
        cap_(cap),
        rows_(rows) {
    hkeys_.reserve(rows);
    hlu_.reserve(rows);
    hcnt_.reserve(rows);
    herase_.reserve(rows);
    ranks_.reserve(rows);
    cut_.reserve(rows);
  }

  // Erases every row but the num_reserved best of `a`; returns how many it erased.
  int64_t run(const Arrays& a, int64_t num_reserved, const RestrictScorer& scorer,
              cudaStream_t stream);

 private:
  static int64_t select_bytes(int64_t cap, cudaStream_t stream) {
    size_t bytes = 0;
    thrust::counting_iterator<int64_t> counting(0);
    cub::DeviceSelect::Flagged(nullptr, bytes, counting, static_cast<uint8_t*>(nullptr),
                               static_cast<int64_t*>(nullptr), static_cast<int64_t*>(nullptr), cap,
                               stream);
    return static_cast<int64_t>(bytes);
  }
  Buffer<uint8_t> flags_;
  Buffer<int64_t> full_, num_, keys_, lu_, cnt_, pos_;
  Buffer<unsigned char> temp_;
  int64_t cap_, rows_;
  std::vector<int64_t> hkeys_, hlu_, hcnt_, herase_;
  std::vector<Ranked> ranks_, cut_;
};

int64_t GpuTable::Ranking::run(const Arrays& a, int64_t num_reserved, const RestrictScorer& scorer,
                               cudaStream_t stream) {
  if (a.cap != cap_) throw std::logic_error("GPU table: ranking made for another layout (a bug)");
  full_flags_kernel<<<blocks_for(cap_), kThreads, 0, stream>>>(a.occ, cap_, flags_.get());
  thrust::counting_iterator<int64_t> counting(0);
  size_t bytes = static_cast<size_t>(select_bytes(cap_, stream));
  check(cub::DeviceSelect::Flagged(temp_.get(), bytes, counting, flags_.get(), full_.get(),
                                   num_.get(), cap_, stream),
        "ranking rows");
  int64_t m = 0;
  check(cudaMemcpyAsync(&m, num_.get(), sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
        "ranking rows");
  check(cudaStreamSynchronize(stream), "ranking rows");
  if (m > rows_) throw std::logic_error("GPU table: more rows than the ranking expected (a bug)");
  if (m <= num_reserved) return 0;
  meta_kernel<<<blocks_for(m), kThreads, 0, stream>>>(a.keys, a.last_update, a.count, full_.get(),
                                                      m, keys_.get(), lu_.get(), cnt_.get());
  hkeys_.resize(m);  // within the reserved capacity: no allocation
  hlu_.resize(m);
  hcnt_.resize(m);
  check(cudaMemcpyAsync(hkeys_.data(), keys_.get(), 8 * m, cudaMemcpyDeviceToHost, stream),
        "ranking rows");
  check(cudaMemcpyAsync(hlu_.data(), lu_.get(), 8 * m, cudaMemcpyDeviceToHost, stream),
        "ranking rows");
  check(cudaMemcpyAsync(hcnt_.data(), cnt_.get(), 8 * m, cudaMemcpyDeviceToHost, stream),
        "ranking rows");
  check(cudaStreamSynchronize(stream), "ranking rows");
  ranks_.clear();
  for (int64_t r = 0; r < m; ++r)
    ranks_.push_back(scorer.rank(hkeys_[r], hlu_[r], static_cast<uint32_t>(hcnt_[r])));
  cut_.assign(ranks_.begin(), ranks_.end());
  const RestrictCut cut(cut_, num_reserved);
  herase_.clear();
  for (int64_t r = 0; r < m; ++r)
    if (cut.keeps_none() || !cut.keeps(ranks_[r])) herase_.push_back(r);
  const int64_t k = static_cast<int64_t>(herase_.size());
  if (k == 0) return 0;
  check(cudaMemcpyAsync(pos_.get(), herase_.data(), 8 * k, cudaMemcpyHostToDevice, stream),
        "erasing ranked rows");
  erase_listed_kernel<<<blocks_for(k), kThreads, 0, stream>>>(a.occ, full_.get(), pos_.get(), k);
  check(cudaStreamSynchronize(stream), "erasing ranked rows");
  return k;
}

GpuTable::GpuTable(const std::string& config) {
  Config c = Config::parse(config, "GPU table config");
  dim_ = c.get_int("dim", 0);
  if (dim_ < 1) throw std::invalid_argument("GPU table config: dim must be >= 1");
  max_load_ = c.get_double("max_load", 0.75);
  if (!(max_load_ > 0.0 && max_load_ <= 1.0))
    throw std::invalid_argument("GPU table config: max_load must be in (0, 1]");
  const int64_t hint = c.get_int("capacity_hint", 1024);
  capacity_ = c.get_int("capacity", 0);
  if (capacity_ < 0) throw std::invalid_argument("capacity must be >= 0 (0 = unlimited)");
  const std::string ep = c.get_string("evict_policy", "recency");
  if (ep == "recency")
    evict_policy_ = RestrictBy::kRecency;
  else if (ep == "frequency")
    evict_policy_ = RestrictBy::kFrequency;
  else
    throw std::invalid_argument("unknown evict_policy '" + ep + "' (recency, frequency)");
  init_ = Initializer::from_config(c, dim_);
  c.check_known({"dim", "max_load", "capacity_hint", "capacity", "evict_policy", "initializer",
                 "seed", "mean", "stddev", "minval", "maxval", "value", "values"},
                "GPU table config");
  init_kernel_ = init_.kernel();
  if (init_kernel_.kind == kernels::InitKernel::kVector) {
    check(cudaMalloc(&d_init_vector_, sizeof(float) * dim_), "allocating the initializer vector");
    check(cudaMemcpy(d_init_vector_, init_kernel_.vector, sizeof(float) * dim_,
                     cudaMemcpyHostToDevice),
          "copying the initializer vector");
    init_kernel_.vector = d_init_vector_;
  }
  num_buckets_ = buckets_for(hint < 1 ? 1 : hint, max_load_);
  arrays_.reset(new Arrays(num_buckets_, width(), {}, nullptr));
  check(cudaDeviceSynchronize(), "creating the table");
}

GpuTable::~GpuTable() {
  arrays_.reset();
  cudaFree(d_init_vector_);
}

void GpuTable::set_optimizer(const std::string& spec) {
  // As on the CPU (Table::set_optimizer): an empty spec detaches; the same optimizer again
  // (numbers compared by value) keeps the slots; any other change gives every row the new
  // optimizer's initial slots. The new layout is built completely before the old one goes.
  std::unique_ptr<Optimizer> opt;
  if (!spec.empty() && spec != "{}" && spec != "null") opt = make_optimizer(spec);
  const bool same = optimizer_ && opt && same_json(optimizer_->spec(), opt->spec());
  if (!same) {
    const int new_slots = opt ? opt->num_slots() : 0;
    const int64_t w = dim_ * (1 + new_slots);
    std::vector<float> init = slot_initial_values(opt.get());
    std::unique_ptr<Arrays> fresh(new Arrays(num_buckets_, w, init, nullptr));
    const Arrays& o = *arrays_;
    if (size_ > 0)
      rewidth_kernel<<<blocks_for(o.cap), kThreads>>>(
          o.keys, o.occ, o.rows, o.last_update, o.count, o.cap, width(), dim_, fresh->keys,
          fresh->occ, fresh->rows, fresh->last_update, fresh->count, w, fresh->slot_init);
    check(cudaDeviceSynchronize(), "set_optimizer");
    arrays_ = std::move(fresh);
    tombstones_ = 0;
  }
  optimizer_ = std::move(opt);
  ++clock_;  // a change of optimizer is a write, as on the CPU (checkpoint saves detect it)
}

void GpuTable::reserve(int64_t rows, cudaStream_t stream) {
  if (rows < 0) throw std::invalid_argument("reserve: rows must be >= 0");
  if (rows > size_) reserve_for(rows - size_, stream);
}

void GpuTable::locate(const int64_t* keys, int64_t n, int64_t* slots, cudaStream_t stream) const {
  if (n == 0) return;
  locate_kernel<<<tile_blocks_for(n), kThreads, 0, stream>>>(arrays_->keys, arrays_->occ,
                                                             arrays_->buckets, keys, n, slots);
  check(cudaGetLastError(), "locate");
}

void GpuTable::reserve_for(int64_t extra, cudaStream_t stream) {
  const int64_t need = size_ + extra;
  // Erased slots count against the load until a rehash drops them: probes walk past them.
  if (static_cast<double>(need + tombstones_) <= max_load_ * static_cast<double>(arrays_->cap))
    return;
  const uint64_t buckets = buckets_for(need, max_load_);
  std::unique_ptr<Arrays> fresh(
      new Arrays(buckets, width(), slot_initial_values(optimizer_.get()), stream));
  Buffer<unsigned long long> failed(1, stream, "rehash counter");
  check(cudaMemsetAsync(failed.get(), 0, sizeof(unsigned long long), stream), "rehash");
  const Arrays& o = *arrays_;
  rehash_kernel<<<blocks_for(o.cap), kThreads, 0, stream>>>(
      o.keys, o.occ, o.rows, o.last_update, o.count, o.cap, fresh->keys, fresh->occ, fresh->rows,
      fresh->last_update, fresh->count, buckets, width(), failed.get());
  if (read_counter(failed.get(), stream, "rehash") != 0)
    throw std::logic_error("GPU table: rehash lost rows (a bug); the table is unchanged");
  arrays_ = std::move(fresh);
  num_buckets_ = buckets;
  tombstones_ = 0;
}

std::unique_ptr<GpuTable::Ranking> GpuTable::eviction_for(int64_t rows_after,
                                                          cudaStream_t stream) const {
  if (capacity_ <= 0 || rows_after <= capacity_) return nullptr;
  return std::unique_ptr<Ranking>(new Ranking(arrays_->cap, rows_after, stream));
}

int64_t GpuTable::evict(Ranking* ranking, cudaStream_t stream) {
  if (!ranking) return 0;
  const RestrictScorer scorer(evict_policy_, nullptr, nullptr, 0);
  const int64_t removed = ranking->run(*arrays_, capacity_, scorer, stream);
  size_ -= removed;
  tombstones_ += removed;
  evicted_total_ += removed;
  return removed;
}

int64_t GpuTable::insert_distinct(const int64_t* ukeys, int64_t u_count, int64_t* uslot,
                                  const uint8_t* want, int64_t* before,
                                  std::unique_ptr<Ranking>* ranking, int64_t* stamp,
                                  cudaStream_t stream) {
  Buffer<unsigned long long> counters(2, stream, "counters");
  check(cudaMemsetAsync(counters.get(), 0, 2 * sizeof(unsigned long long), stream), "counters");
  locate(ukeys, u_count, uslot, stream);
  if (u_count)
    count_missing_kernel<<<blocks_for(u_count), kThreads, 0, stream>>>(uslot, want, u_count,
                                                                       counters.get());
  const int64_t missing = read_counter(counters.get(), stream, "counting new keys");
  const Arrays* layout = arrays_.get();
  reserve_for(missing, stream);
  if (arrays_.get() != layout) locate(ukeys, u_count, uslot, stream);  // rehashed
  *ranking = eviction_for(size_ + missing, stream);
  if (before && u_count)
    check(cudaMemcpyAsync(before, uslot, 8 * u_count, cudaMemcpyDeviceToDevice, stream),
          "copying located slots");
  check(cudaMemsetAsync(counters.get(), 0, 2 * sizeof(unsigned long long), stream), "counters");
  // Everything is allocated: from here on the call writes, and cannot fail for memory.
  *stamp = ++clock_;
  if (missing)
    insert_kernel<<<blocks_for(u_count), kThreads, 0, stream>>>(
        arrays_->keys, arrays_->occ, arrays_->rows, arrays_->last_update, arrays_->count,
        arrays_->buckets, width(), dim_, ukeys, u_count, uslot, want, init_kernel_,
        arrays_->slot_init, num_slots(), *stamp, counters.get());
  unsigned long long h[2] = {0, 0};
  check(cudaMemcpyAsync(h, counters.get(), sizeof(h), cudaMemcpyDeviceToHost, stream),
        "inserting keys");
  check(cudaStreamSynchronize(stream), "inserting keys");
  if (h[0] != 0)
    throw std::logic_error("GPU table: insert found no free slot after reserve (a bug)");
  size_ += missing;
  tombstones_ -= static_cast<int64_t>(h[1]);
  return missing;
}

void GpuTable::find(const int64_t* keys, int64_t n, float* values, uint8_t* exists,
                    cudaStream_t stream) {
  if (n == 0) return;
  find_kernel<<<tile_blocks_for(n), kThreads, 0, stream>>>(
      arrays_->keys, arrays_->occ, arrays_->buckets, arrays_->rows, width(), dim_, keys, n,
      init_kernel_, values, exists);
  check(cudaGetLastError(), "find");
}

int64_t GpuTable::find_or_insert(const int64_t* keys, int64_t n, float* values, uint8_t* exists,
                                 cudaStream_t stream) {
  if (n == 0) {
    ++clock_;  // a write, as on the CPU
    return 0;
  }
  Dedup d(keys, n, stream);
  Buffer<int64_t> uslot(d.count, stream, "distinct slots");
  Buffer<int64_t> after(n, stream, "slots after");
  std::unique_ptr<Ranking> ranking;
  int64_t stamp = 0;
  insert_distinct(d.ukeys.get(), d.count, uslot.get(), nullptr, nullptr, &ranking, &stamp, stream);
  locate(keys, n, after.get(), stream);
  gather_after_insert_kernel<<<blocks_for(n * dim_), kThreads, 0, stream>>>(
      arrays_->rows, arrays_->last_update, width(), dim_, after.get(), n, stamp, values, exists);
  check(cudaGetLastError(), "find_or_insert");
  return evict(ranking.get(), stream);  // after the rows are read, as the CPU returns them
}

int64_t GpuTable::insert_or_assign(const int64_t* keys, int64_t n, const float* values,
                                   cudaStream_t stream) {
  if (n == 0) {
    ++clock_;
    return 0;
  }
  Dedup d(keys, n, stream);
  Buffer<int64_t> uslot(d.count, stream, "distinct slots");
  std::unique_ptr<Ranking> ranking;
  int64_t stamp = 0;
  insert_distinct(d.ukeys.get(), d.count, uslot.get(), nullptr, nullptr, &ranking, &stamp, stream);
  assign_kernel<<<blocks_for(d.count * dim_), kThreads, 0, stream>>>(
      arrays_->rows, arrays_->last_update, arrays_->count, width(), dim_, uslot.get(),
      d.heads.get(), d.order.get(), d.count, n, values, stamp);
  check(cudaGetLastError(), "insert_or_assign");
  return evict(ranking.get(), stream);
}

int64_t GpuTable::accum(const int64_t* keys, int64_t n, const float* deltas, const float* old,
                        const uint8_t* exists, cudaStream_t stream) {
  if (n == 0) {
    ++clock_;
    return 0;
  }
  Dedup d(keys, n, stream);
  Buffer<int64_t> uslot(d.count, stream, "distinct slots"), before(d.count, stream, "before");
  Buffer<uint8_t> want(d.count, stream, "accum inserts");
  accum_want_kernel<<<blocks_for(d.count), kThreads, 0, stream>>>(d.heads.get(), d.order.get(),
                                                                  d.count, n, exists, want.get());
  std::unique_ptr<Ranking> ranking;
  int64_t stamp = 0;
  insert_distinct(d.ukeys.get(), d.count, uslot.get(), want.get(), before.get(), &ranking, &stamp,
                  stream);
  accum_kernel<<<blocks_for(d.count * dim_), kThreads, 0, stream>>>(
      arrays_->rows, arrays_->last_update, arrays_->count, width(), dim_, uslot.get(), before.get(),
      d.heads.get(), d.order.get(), d.count, n, deltas, old, exists, stamp);
  check(cudaGetLastError(), "accum");
  return evict(ranking.get(), stream);
}

int64_t GpuTable::import_rows(const int64_t* keys, int64_t n, const float* values,
                              const float* slots, const int64_t* last_update,
                              const int64_t* update_count, cudaStream_t stream) {
  if (n == 0) {
    ++clock_;
    return 0;
  }
  Dedup d(keys, n, stream);
  Buffer<int64_t> uslot(d.count, stream, "distinct slots");
  Buffer<int64_t> max_lu(1, stream, "import max stamp");
  size_t bytes = 0;
  if (last_update) cub::DeviceReduce::Max(nullptr, bytes, last_update, max_lu.get(), n, stream);
  Buffer<unsigned char> temp(static_cast<int64_t>(bytes), stream, "import scratch");
  int64_t newest = 0;
  if (last_update) {
    check(cub::DeviceReduce::Max(temp.get(), bytes, last_update, max_lu.get(), n, stream),
          "import stamps");
    check(cudaMemcpyAsync(&newest, max_lu.get(), 8, cudaMemcpyDeviceToHost, stream),
          "import stamps");
    check(cudaStreamSynchronize(stream), "import stamps");
  }
  std::unique_ptr<Ranking> ranking;
  int64_t stamp = 0;
  insert_distinct(d.ukeys.get(), d.count, uslot.get(), nullptr, nullptr, &ranking, &stamp, stream);
  import_kernel<<<blocks_for(d.count * width()), kThreads, 0, stream>>>(
      arrays_->rows, arrays_->last_update, arrays_->count, width(), dim_, uslot.get(),
      d.heads.get(), d.order.get(), d.count, n, values, num_slots() ? slots : nullptr, last_update,
      update_count, stamp);
  check(cudaGetLastError(), "import");
  if (last_update) {
    const int64_t mx = newest > 0 ? newest : 0;  // clock_after_import over the batch's maximum
    clock_ = clock_after_import(clock_, &mx, 1);
  }
  return evict(ranking.get(), stream);
}

int64_t GpuTable::apply_gradients(const int64_t* keys, int64_t n, const float* grads, float lr,
                                  int64_t step, cudaStream_t stream) {
  if (!optimizer_)
    throw std::invalid_argument("apply_gradients: this table has no optimizer attached");
  // Host-side first: validates (lr, step) and computes the per-batch scalars exactly as the CPU.
  const StepArgs args = optimizer_->prepare(lr, step);
  if (n == 0) {
    ++clock_;
    return 0;
  }
  const kernels::StepScalars scalars = step_scalars(args);
  const kernels::OptimizerKernel k = optimizer_->kernel();
  Dedup d(keys, n, stream);
  Buffer<int64_t> uslot(d.count, stream, "distinct slots");
  Buffer<float> summed(d.count * dim_, stream, "summed gradients");
  std::unique_ptr<Ranking> ranking;
  int64_t stamp = 0;
  insert_distinct(d.ukeys.get(), d.count, uslot.get(), nullptr, nullptr, &ranking, &stamp, stream);
  segment_sum_kernel<<<blocks_for(d.count * dim_), kThreads, 0, stream>>>(
      d.heads.get(), d.order.get(), d.count, n, grads, dim_, summed.get());
  apply_kernel<<<blocks_for(d.count * dim_), kThreads, 0, stream>>>(
      arrays_->rows, arrays_->last_update, arrays_->count, width(), dim_, uslot.get(), d.count,
      summed.get(), k, scalars, stamp);
  check(cudaGetLastError(), "apply_gradients");
  return evict(ranking.get(), stream);
}

int64_t GpuTable::restrict_rows(int64_t num_reserved, RestrictBy by, const int64_t* keys_host,
                                const float* scores_host, int64_t n, cudaStream_t stream) {
  if (num_reserved < 0) throw std::invalid_argument("restrict: num_reserved must be >= 0");
  if (by == RestrictBy::kCustom) check_scores(keys_host, scores_host, n);
  int64_t removed = 0;
  if (size_ > num_reserved) {
    const RestrictScorer scorer(by, keys_host, scores_host, n);
    Ranking ranking(arrays_->cap, size_, stream);
    removed = ranking.run(*arrays_, num_reserved, scorer, stream);
    size_ -= removed;
    tombstones_ += removed;
  }
  ++clock_;
  return removed;
}

void GpuTable::erase(const int64_t* keys, int64_t n, cudaStream_t stream) {
  ++clock_;
  if (n == 0) return;
  Buffer<int64_t> slot(n, stream, "erase slots");
  Buffer<unsigned long long> counter(1, stream, "counter");
  check(cudaMemsetAsync(counter.get(), 0, sizeof(unsigned long long), stream), "counter");
  locate(keys, n, slot.get(), stream);
  erase_kernel<<<blocks_for(n), kThreads, 0, stream>>>(arrays_->occ, slot.get(), n, counter.get());
  const int64_t erased = read_counter(counter.get(), stream, "erase");
  size_ -= erased;
  tombstones_ += erased;
}

void GpuTable::clear(cudaStream_t stream) {
  ++clock_;
  check(cudaMemsetAsync(arrays_->occ, 0, sizeof(int32_t) * arrays_->cap, stream), "clear");
  check(cudaStreamSynchronize(stream), "clear");
  size_ = 0;
  tombstones_ = 0;
}

int64_t GpuTable::size(cudaStream_t stream) const {
  check(cudaStreamSynchronize(stream), "size");
  return size_;
}

int64_t GpuTable::export_rows(int64_t offset, int64_t limit, int64_t* keys, float* values,
                              float* slots, int64_t* last_update, int64_t* update_count,
                              cudaStream_t stream) const {
  if (offset < 0 || limit < 0) throw std::invalid_argument("export: offset and limit must be >= 0");
  const int64_t cap = arrays_->cap;
  Buffer<uint8_t> flags(cap, stream, "export flags");
  Buffer<int64_t> full(cap, stream, "export slots");
  Buffer<int64_t> num(1, stream, "export count");
  full_flags_kernel<<<blocks_for(cap), kThreads, 0, stream>>>(arrays_->occ, cap, flags.get());
  thrust::counting_iterator<int64_t> counting(0);
  size_t bytes = 0;
  cub::DeviceSelect::Flagged(nullptr, bytes, counting, flags.get(), full.get(), num.get(), cap,
                             stream);
  Buffer<unsigned char> temp(static_cast<int64_t>(bytes), stream, "export scratch");
  check(cub::DeviceSelect::Flagged(temp.get(), bytes, counting, flags.get(), full.get(), num.get(),
                                   cap, stream),
        "export");
  int64_t total = 0;
  check(cudaMemcpyAsync(&total, num.get(), sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
        "export");
  check(cudaStreamSynchronize(stream), "export");
  if (offset >= total) return 0;
  const int64_t m = std::min(limit, total - offset);
  export_kernel<<<blocks_for(m * width()), kThreads, 0, stream>>>(
      arrays_->keys, arrays_->rows, arrays_->last_update, arrays_->count, width(), dim_,
      num_slots(), full.get() + offset, m, keys, values, slots, last_update, update_count);
  check(cudaStreamSynchronize(stream), "export");
  return m;
}

}  // namespace gpu
}  // namespace dualemb
