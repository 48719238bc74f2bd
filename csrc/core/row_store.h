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

// Where the chunks' memory comes from: slabs, blocks of one huge page (memory_block.h) holding
// several whole chunks, filled in small pages and moved into one huge page once rows fill all
// their chunks. A big table's rows then sit in huge pages, so a random row's access rarely misses
// the TLB (find on a 16M-row dim-8 table 1.6x faster with the rows and the index in huge pages),
// while a small table's shard still holds only the pages its chunks touched. A chunk larger than
// half a huge page gets a block of its own. The chunk addressing (row >> shift) is the same
// either way.
class RowStore {
  // A block holding chunks first_chunk, first_chunk + 1, ... (one chunk, or a slab's);
  // `huge`: a slab moved into a huge page (rows fill all its chunks).
  struct Owned {
    Block block;
    int64_t first_chunk;
    bool huge;
  };

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
    Fresh fresh = allocate_chunks(used, /*prefault=*/true);
    adopt(fresh);
    promote_full_slabs(size_);  // before the copy: the rows go into the huge pages, not moved there
    for (int64_t c = 0; c < used; ++c) {
      const int64_t rows = std::min<int64_t>(size_ - (c << shift_), int64_t(1) << shift_);
      std::memcpy(chunks_[static_cast<size_t>(c)], o.chunks_[static_cast<size_t>(c)],
                  static_cast<size_t>(rows) * stride_);
    }
  }
  RowStore& operator=(const RowStore&) = delete;

  // Chunks allocated but not yet part of the store (chunks_for, then adopt): the blocks that
  // hold them and each chunk's start.
  struct Fresh {
    std::vector<Owned> blocks;
    std::vector<unsigned char*> chunks;
  };

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
    if ((size_ >> shift_) >= static_cast<int64_t>(chunks_.size())) {
      Fresh fresh = chunks_for(size_ + 1);
      adopt(fresh);
    }
    if ((size_ & mask_) == mask_) promote_full_slabs(size_ + 1);  // a chunk's last row
    return size_++;
  }
  // Moves the last row into row i (i < size) and drops the last row.
  void move_last_into(int64_t i) {
    int64_t last = size_ - 1;
    if (i != last) std::memcpy(at(i), at(last), stride_);
    --size_;
    // Keep one spare chunk at most, so erase-heavy workloads give memory back.
    drop_chunks_past(((size_ + mask()) >> shift_) + 1);
  }
  // Drops every row and frees every chunk.
  void clear() noexcept {
    std::vector<unsigned char*>().swap(chunks_);
    std::vector<Owned>().swap(owned_);
    size_ = 0;
  }
  // Drops every row, keeping the chunks that n rows need (freeing the others): a refill of up
  // to n rows writes into memory that is already resident instead of faulting in fresh pages.
  void clear_keeping(int64_t n) noexcept {
    drop_chunks_past((n + mask()) >> shift_);
    size_ = 0;
  }
  // Frees the chunk tables' spare capacity (as an emptied table's would be): optional, a
  // failed reallocation keeps the larger tables.
  void shrink_chunk_table() noexcept {
    chunks_.shrink_to_fit();
    owned_.shrink_to_fit();
  }
  // Makes room for n rows: all missing chunks are allocated first, then adopted, so a failure
  // changes nothing.
  void reserve(int64_t n) {
    Fresh fresh = chunks_for(n);
    adopt(fresh);
  }
  // The chunks missing for n rows, allocated but not yet adopted (also makes room for them in
  // the chunk tables, so adopt cannot fail). Throws std::bad_alloc with the store unchanged.
  Fresh chunks_for(int64_t n) { return allocate_chunks((n + mask()) >> shift_, false); }
  void adopt(Fresh& fresh) noexcept {
    // capacity reserved by allocate_chunks: no throw
    for (Owned& b : fresh.blocks) owned_.push_back(std::move(b));
    for (unsigned char* c : fresh.chunks) chunks_.push_back(c);
    fresh.blocks.clear();
    fresh.chunks.clear();
  }
  // Bytes of memory held: whole slabs once in huge pages, else the pages of the chunks in use
  // (a slab's other pages are not touched), and the chunk tables.
  size_t bytes() const {
    size_t b = chunks_.capacity() * sizeof(unsigned char*) + owned_.capacity() * sizeof(Owned);
    const int64_t per_slab = chunks_per_slab(), have = static_cast<int64_t>(chunks_.size());
    for (const Owned& o : owned_) {
      if (per_slab == 0) {
        b += o.block.footprint();
      } else if (o.huge) {
        b += kHugePageBytes;
      } else {
        const int64_t in_use = std::min(per_slab, have - o.first_chunk);
        b += whole_pages(static_cast<size_t>(in_use) * chunk_bytes());
      }
    }
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
    return chunks_[static_cast<size_t>(i >> shift_)] + static_cast<size_t>(i & mask()) * stride_;
  }
  size_t chunk_bytes() const { return (size_t(1) << shift_) * stride_; }
  // Chunks per slab; 0 where a chunk is larger than half a huge page (no slabs then).
  int64_t chunks_per_slab() const {
    const size_t per = kHugePageBytes / chunk_bytes();
    return per >= 2 ? static_cast<int64_t>(per) : 0;
  }
  // Allocates what chunks [chunks_.size(), need) lack: those inside the last slab need no memory
  // (a slab outlives its dropped chunks until all of them are gone), the others a new slab (or a
  // block of their own). Reserves room in both tables. Throws std::bad_alloc, unchanged.
  Fresh allocate_chunks(int64_t need, bool prefault) {
    Fresh fresh;
    const int64_t have = static_cast<int64_t>(chunks_.size());
    if (need <= have) return fresh;
    const int64_t per_slab = chunks_per_slab();
    fresh.chunks.reserve(static_cast<size_t>(need - have));
    for (int64_t c = have; c < need; ++c) {
      const Owned* in = !fresh.blocks.empty() ? &fresh.blocks.back()
                                              : owned_.empty() ? nullptr : &owned_.back();
      if (in && per_slab > 0 && c < in->first_chunk + per_slab) {
        fresh.chunks.push_back(in->block.data() +
                               static_cast<size_t>(c - in->first_chunk) * chunk_bytes());
        continue;
      }
      if (per_slab > 0) {
        fresh.blocks.push_back(Owned{Block(Block::Slab{}), c, false});
      } else if (prefault) {
        fresh.blocks.push_back(Owned{Block(chunk_bytes(), Block::Prefault{}), c, false});
      } else {
        fresh.blocks.push_back(Owned{Block(chunk_bytes()), c, false});
      }
      fresh.chunks.push_back(fresh.blocks.back().block.data());
    }
    chunks_.reserve(static_cast<size_t>(need));
    owned_.reserve(owned_.size() + fresh.blocks.size());
    return fresh;
  }
  // Moves the slabs that `rows` rows fill into huge pages (only the last ones can be new: a slab
  // leaves huge pages only when drop_chunks_past frees part of it, and then it is the last).
  // Not earlier: reserve() allocates chunks for rows that may never come.
  void promote_full_slabs(int64_t rows) noexcept {
    const int64_t per_slab = chunks_per_slab();
    const int64_t full_chunks = rows >> shift_;
    for (size_t k = owned_.size(); per_slab > 0 && k-- > 0;) {
      Owned& o = owned_[k];
      if (o.first_chunk + per_slab > full_chunks) continue;  // not full yet
      if (o.huge) break;
      use_huge_pages(o.block.data());
      o.huge = true;
    }
  }
  // Keeps chunks [0, keep), freeing every block none of them lies in, and the pages of the
  // dropped chunks in the last slab kept.
  void drop_chunks_past(int64_t keep) noexcept {
    if (static_cast<int64_t>(chunks_.size()) <= keep) return;
    chunks_.resize(static_cast<size_t>(keep));
    while (!owned_.empty() && owned_.back().first_chunk >= keep) owned_.pop_back();
    const int64_t per_slab = chunks_per_slab();
    if (per_slab > 0 && !owned_.empty() && owned_.back().first_chunk + per_slab > keep) {
      Owned& last = owned_.back();
      unsigned char* from = last.block.data() +
                            static_cast<size_t>(keep - last.first_chunk) * chunk_bytes();
      release_slab_pages(last.block.data(), from,
                         static_cast<size_t>(last.block.data() + kHugePageBytes - from));
      last.huge = false;
    }
  }

  int64_t width_;
  int64_t shift_;
  int64_t mask_;   // rows per chunk - 1, kept: every row access needs it
  size_t stride_;  // bytes per row (stride_for)
  int64_t size_ = 0;
  std::vector<unsigned char*> chunks_;  // chunk c's first row
  std::vector<Owned> owned_;            // the blocks behind chunks_, in chunk order
};

}  // namespace dualemb

#endif  // DUALEMB_ROW_STORE_H_
