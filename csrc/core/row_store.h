// row_store.h — dense, chunked storage of a shard's rows.
//
// Row i holds its RowMeta (key, last update, count) then [value (dim) | slots (num_slots * dim)],
// `width` elements of `elem_size` bytes each (the table's value dtype). Rows stay dense
// (erase moves the last row into the hole), so export pages are plain index ranges. Storage
// grows by fixed-size chunks: no 2x reallocation peaks, and row pointers stay valid as it grows.
// Chunks come from memory_block.h (mapped from the OS), so dropping one returns its memory at once.
// Growth allocates before it changes anything: a std::bad_alloc leaves the store as it was.
#ifndef DUALEMB_ROW_STORE_H_
#define DUALEMB_ROW_STORE_H_

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "memory_block.h"
#include "row_bytes.h"

namespace dualemb {

// Per-row metadata, stored in front of the row's elements so one cache-line stream brings both.
// `unused` is shared bit by bit: bit 31 is the "stepped" flag (an optimizer step has updated
// this row's slots since they were last initialised: what a slot view lists, as TFRA's slot
// tables hold every key the optimizer touched); touch it only through the accessors, the low 31
// bits are not this flag's.
struct RowMeta {
  int64_t key;
  int64_t last_update;
  uint32_t count;
  uint32_t unused;  // low 31 bits: the change generation (below); bit 31: stepped

  static constexpr uint32_t kSteppedBit = uint32_t(1) << 31;
  bool stepped() const { return (unused & kSteppedBit) != 0; }
  void set_stepped(bool on) { unused = on ? (unused | kSteppedBit) : (unused & ~kSteppedBit); }
};

// Change tracking (delta checkpoints, table.h): every write stamps the row with the table's
// current write generation, in the low 31 bits of RowMeta::unused, beside the last_update it
// writes anyway (same cache line: the stamp costs one store). Only these accessors touch them,
// and they keep bit 31 as it is.
constexpr uint32_t kChangeGenMask = 0x7FFFFFFFu;
inline uint32_t change_gen(const RowMeta& m) { return m.unused & kChangeGenMask; }
inline void set_change_gen(RowMeta& m, uint32_t gen) {
  m.unused = (m.unused & ~kChangeGenMask) | (gen & kChangeGenMask);
}
// What an optimizer step leaves in `unused`: the generation and the stepped mark, the same bits
// as set_change_gen(m, gen) then m.set_stepped(true), written as one store instead of two
// read-modify-writes (the fused step's per-row loop runs this for every distinct key).
inline void set_change_gen_stepped(RowMeta& m, uint32_t gen) {
  m.unused = (gen & kChangeGenMask) | RowMeta::kSteppedBit;
}

class RowStore {
 public:
  RowStore(int64_t width, size_t elem_size, int64_t chunk_shift)
      : width_(width),
        shift_(chunk_shift),
        mask_((int64_t(1) << chunk_shift) - 1),
        stride_(stride_for(width, elem_size)) {}
  RowStore(RowStore&&) noexcept = default;
  RowStore& operator=(RowStore&&) noexcept = default;
  // A deep copy of the rows in use (a table's clone, storage/storage.h); the spare chunk is not
  // copied. The chunks are written whole at once, so they are prefaulted (memory_block.h).
  // Throws std::bad_alloc.
  RowStore(const RowStore& o)
      : width_(o.width_), shift_(o.shift_), mask_(o.mask_), stride_(o.stride_), size_(o.size_) {
    const int64_t used = (size_ + mask()) >> shift_;
    chunks_.reserve(static_cast<size_t>(used));
    for (int64_t c = 0; c < used; ++c) {
      chunks_.emplace_back(chunk_bytes(), Block::Prefault{});
      const int64_t rows = std::min<int64_t>(size_ - (c << shift_), int64_t(1) << shift_);
      std::memcpy(chunks_.back().data(), o.chunks_[c].data(), static_cast<size_t>(rows) * stride_);
    }
  }
  RowStore& operator=(const RowStore&) = delete;

  int64_t size() const { return size_; }
  int64_t capacity() const { return static_cast<int64_t>(chunks_.size()) << shift_; }
  int64_t width() const { return width_; }

  // Row i's elements: as raw bytes, or typed (T must be the table's element type).
  unsigned char* row(int64_t i) { return at(i) + sizeof(RowMeta); }
  const unsigned char* row(int64_t i) const { return at(i) + sizeof(RowMeta); }
  template <class T>
  T* row_as(int64_t i) { return reinterpret_cast<T*>(at(i) + sizeof(RowMeta)); }
  RowMeta& meta(int64_t i) { return *reinterpret_cast<RowMeta*>(at(i)); }
  // The elements of the row whose metadata is m (row(i) == elements(meta(i))).
  static unsigned char* elements(RowMeta& m) {
    return reinterpret_cast<unsigned char*>(&m) + sizeof(RowMeta);
  }
  const RowMeta& meta(int64_t i) const { return *reinterpret_cast<const RowMeta*>(at(i)); }

  // Starts loading row i (metadata, values and slots) into the cache, for writing: every line
  // it covers, also the last one of a row that straddles a line boundary.
  void prefetch(int64_t i) const { prefetch_bytes</*kWrite=*/1>(at(i), stride_); }

  // Appends an uninitialised row and returns its index.
  int64_t push_back() {
    if ((size_ >> shift_) >= static_cast<int64_t>(chunks_.size())) add_chunk();
    return size_++;
  }
  // Moves the last row into row i (i < size) and drops the last row.
  void move_last_into(int64_t i) {
    int64_t last = size_ - 1;
    if (i != last) std::memcpy(at(i), at(last), stride_);
    --size_;
    // Keep one spare chunk at most, so erase-heavy workloads give memory back.
    while (static_cast<int64_t>(chunks_.size()) > ((size_ + mask()) >> shift_) + 1)
      chunks_.pop_back();
  }
  // Drops every row and frees every chunk.
  void clear() noexcept {
    std::vector<Block>().swap(chunks_);
    size_ = 0;
  }
  // Drops every row, keeping the chunks that n rows need (freeing the others): a refill of up
  // to n rows writes into memory that is already resident instead of faulting in fresh pages.
  void clear_keeping(int64_t n) noexcept {
    const int64_t keep = (n + mask()) >> shift_;
    while (static_cast<int64_t>(chunks_.size()) > keep) chunks_.pop_back();
    size_ = 0;
  }
  // Frees the chunk table's spare capacity (as an emptied table's would be): optional, a
  // failed reallocation keeps the larger table.
  void shrink_chunk_table() noexcept { chunks_.shrink_to_fit(); }
  // Makes room for n rows: all missing chunks are allocated first, then adopted, so a failure
  // changes nothing.
  void reserve(int64_t n) {
    std::vector<Block> fresh = chunks_for(n);
    adopt(fresh);
  }
  // The chunks missing for n rows, allocated but not yet adopted (also makes room for them in
  // the chunk table, so adopt cannot fail). Throws std::bad_alloc with the store unchanged.
  std::vector<Block> chunks_for(int64_t n) {
    const int64_t have = static_cast<int64_t>(chunks_.size());
    const int64_t need = (n + mask()) >> shift_;
    std::vector<Block> fresh;
    if (need <= have) return fresh;
    fresh.reserve(need - have);
    for (int64_t c = have; c < need; ++c) fresh.emplace_back(chunk_bytes());
    chunks_.reserve(need);
    return fresh;
  }
  void adopt(std::vector<Block>& fresh) noexcept {
    for (Block& b : fresh) chunks_.push_back(std::move(b));  // capacity reserved: no throw
    fresh.clear();
  }
  // Bytes of memory held (chunks, whole pages, and the chunk table).
  size_t bytes() const {
    size_t b = chunks_.capacity() * sizeof(Block);
    if (!chunks_.empty()) b += chunks_.size() * chunks_[0].footprint();
    return b;
  }
  size_t stride() const { return stride_; }
  // Bytes per row: RowMeta + width elements, padded to 8. A row of 56 bytes (25-32 bytes of
  // elements: float32 rows of dim 7 and 8 without slots, float16 of dim 13-16) is padded to a
  // whole cache line: in a chunk mapped from the OS (page-aligned) every row then sits in one
  // line instead of straddling two, which 3 of 8 rows' values (what a read copies) and 6 of 8
  // whole rows (what a write touches) do at 56 bytes; 8 bytes more per row. Shorter rows would
  // pay more memory than the misses are worth; longer ones straddle lines anyway.
  static size_t stride_for(int64_t width, size_t elem_size) {
    const size_t s = sizeof(RowMeta) + ((elem_size * static_cast<size_t>(width) + 7) & ~size_t(7));
    return s > 48 && s < 64 ? 64 : s;
  }
  // Bytes n rows of this width take in chunks.
  long double bytes_for(int64_t n) const {
    return static_cast<long double>((n + mask()) >> shift_) * chunk_bytes();
  }

 private:
  int64_t mask() const { return mask_; }
  unsigned char* at(int64_t i) const {
    return chunks_[i >> shift_].data() + static_cast<size_t>(i & mask()) * stride_;
  }
  size_t chunk_bytes() const { return (size_t(1) << shift_) * stride_; }
  void add_chunk() {
    // Blocks are aligned to at least 16 bytes and the stride is a multiple of 8, so every
    // RowMeta and element (at most 8 bytes) in a chunk is properly aligned. The block is owned before the chunk
    // table may grow, so a failure there frees it.
    Block b(chunk_bytes());
    chunks_.push_back(std::move(b));
  }

  int64_t width_;
  int64_t shift_;
  int64_t mask_;   // rows per chunk - 1, kept: every row access needs it
  size_t stride_;  // bytes per row (stride_for)
  int64_t size_ = 0;
  std::vector<Block> chunks_;
};

}  // namespace dualemb

#endif  // DUALEMB_ROW_STORE_H_
