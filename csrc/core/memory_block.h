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

// An allocation that failed, or was refused before trying because it could never fit. Derives
// from std::bad_alloc so every allocation failure is handled alike; what() names the size.
class OutOfMemory : public std::bad_alloc {
 public:
  explicit OutOfMemory(std::string msg) : msg_(std::move(msg)) {}
  const char* what() const noexcept override { return msg_.c_str(); }

 private:
  std::string msg_;
};

// Allocates `bytes` (> 0) of uninitialised memory, aligned to at least 16 bytes. Throws
// OutOfMemory. `prefault`: a mapped block gets all its pages now, in one call (MAP_POPULATE),
// instead of one page fault per page on first touch: for blocks about to be written whole (a
// clone's copies), which costs about a third less CPU than faulting them in page by page.
void* allocate_block(size_t bytes, bool prefault = false);
// Frees a block from allocate_block (bytes as given there). p may be null.
void release_block(void* p, size_t bytes) noexcept;
// Bytes a block of `bytes` really occupies (mapped blocks are whole pages).
size_t block_footprint(size_t bytes);

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
