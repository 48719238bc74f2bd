// memory_block.h — where the table's big arrays (row chunks, hash index) get their memory, and how
// much memory a request may sensibly ask for.
//
// Blocks of kMapThreshold bytes or more are mapped straight from the OS and unmapped when freed,
// so clear(), erase() and shrinking give that memory back to the OS at once. (Freed through
// malloc, it would stay resident: glibc raises its mmap threshold after the first large free and
// serves later chunks from the heap, which it returns only on malloc_trim.) Smaller blocks come
// from malloc, so an empty table costs a few KiB, not a page per shard.
#ifndef DUALEMB_MEMORY_BLOCK_H_
#define DUALEMB_MEMORY_BLOCK_H_

#include <cstddef>
#include <cstdint>
#include <new>
#include <string>

namespace dualemb {

constexpr size_t kMapThreshold = size_t(64) << 10;
// A transparent huge page (x86-64, arm64 with 4 KiB pages). A block of a whole number of them is
// mapped on a huge-page boundary and marked MADV_HUGEPAGE: a lookup's random accesses into a
// table of gigabytes otherwise miss the TLB on nearly every index slot and row, and the page
// walks, not the cache misses, limit it (find 1.6x faster on a 16M-row table with the index
// arrays and row chunks in huge pages). Where the kernel's THP setting is "never" nothing changes.
constexpr size_t kHugePageBytes = size_t(2) << 20;

// An allocation that failed, or was refused before trying because it could never fit. Derives
// from std::bad_alloc so every allocation failure is handled alike; what() names the size.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

// Allocates `bytes` (> 0) of uninitialised memory, aligned to at least 16 bytes (to
// kHugePageBytes, in huge pages where the kernel allows, when `bytes` is a multiple of it). Throws
// OutOfMemory. `prefault`: a mapped block gets all its pages now, in one call (MAP_POPULATE),
// instead of one page fault per page on first touch: for blocks about to be written whole (a
// clone's copies), which costs about a third less CPU than faulting them in page by page.
void* allocate_block(size_t bytes, bool prefault = false);
// Allocates a slab: kHugePageBytes on a huge-page boundary, in small pages until
// use_huge_pages() is called on it (a row store fills a slab chunk by chunk: in huge pages from
// the start, a shard's first rows would make the whole slab resident). Throws OutOfMemory.
void* allocate_slab();
// Has the kernel back a slab with one huge page now (MADV_HUGEPAGE, then MADV_COLLAPSE, which
// copies its resident pages into it; kernels before 6.1 lack that and leave it to khugepaged).
// Advice only: a kernel that refuses it keeps the small pages.
void use_huge_pages(void* slab) noexcept;
// Gives the pages of [p, p + bytes) inside a slab back to the OS (whole pages only) and returns
// the slab to small pages, so that the part still in use stays resident alone.
void release_slab_pages(void* slab, unsigned char* p, size_t bytes) noexcept;
// Frees a block from allocate_block (bytes as given there). p may be null.
void release_block(void* p, size_t bytes) noexcept;
// Bytes a block of `bytes` really occupies (mapped blocks are whole pages).
size_t block_footprint(size_t bytes);
// `bytes` rounded up to whole pages.
size_t whole_pages(size_t bytes);

// The most memory this process could ever use: physical RAM, or the cgroup memory limit when
// that is lower. Requests above it are refused up front (a request below it may still fail).
uint64_t memory_limit_bytes();
// Throws OutOfMemory naming `what`, the bytes and the limit if `bytes` exceeds the limit.
void check_request(const char* what, long double bytes);

// Move-only owner of one block.
class Block {
 public:
  Block() = default;
  explicit Block(size_t bytes) : p_(allocate_block(bytes)), bytes_(bytes) {}
  // A block about to be written whole (allocate_block's prefault).
  struct Prefault {};
  Block(size_t bytes, Prefault) : p_(allocate_block(bytes, true)), bytes_(bytes) {}
  // A slab (allocate_slab), freed like any mapped block.
  struct Slab {};
  explicit Block(Slab) : p_(allocate_slab()), bytes_(kHugePageBytes) {}
  Block(Block&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; o.bytes_ = 0; }
  Block& operator=(Block&& o) noexcept {
    if (this != &o) {
      release_block(p_, bytes_);
      p_ = o.p_;
      bytes_ = o.bytes_;
      o.p_ = nullptr;
      o.bytes_ = 0;
    }
    return *this;
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
  ~Block() { release_block(p_, bytes_); }

  unsigned char* data() const { return static_cast<unsigned char*>(p_); }
  size_t footprint() const { return p_ ? block_footprint(bytes_) : 0; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace dualemb

#endif  // DUALEMB_MEMORY_BLOCK_H_
