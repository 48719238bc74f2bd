// row_bytes.h — a row's byte size as a compile-time constant where it is small, and the
// prefetch of a row's cache lines.
//
// A small row's copy through memcpy with a size known only at run time is a library call that
// costs more instructions than the copy itself (a 32-byte row: ~20 instructions of call, size
// dispatch and return around two 16-byte moves). with_row_bytes(n, fn) calls fn with the size as
// a std::integral_constant for the sizes of float32 rows of dim 4 to 32 (16 to 128 bytes), so a
// memcpy of that size compiles to a few inline moves; other sizes get the plain size_t.
#ifndef DUALEMB_ROW_BYTES_H_
#define DUALEMB_ROW_BYTES_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace dualemb {

template <size_t kBytes>
using FixedRowBytes = std::integral_constant<size_t, kBytes>;

template <class Fn>
decltype(auto) with_row_bytes(size_t bytes, Fn&& fn) {
  switch (bytes) {
    case 16: return fn(FixedRowBytes<16>{});
    case 32: return fn(FixedRowBytes<32>{});
    case 64: return fn(FixedRowBytes<64>{});
    case 128: return fn(FixedRowBytes<128>{});
    default: return fn(bytes);
  }
}

// Starts loading every cache line of [p, p + bytes) (bytes > 0), also the last line of a row
// that straddles a line boundary, which a loop over p, p + 64, ... alone misses when the row
// does not start on a line (56 bytes at offset 40 cover two lines). Points 64 bytes apart cannot
// skip a line, and the last byte names the last line; for a row of at most 64 bytes of
// compile-time size that is two prefetches and no loop.
template <int kWrite = 0, class Bytes>
inline void prefetch_bytes(const void* p, Bytes bytes) {
  const char* c = static_cast<const char*>(p);
  for (size_t off = 0; off < static_cast<size_t>(bytes); off += 64)
    __builtin_prefetch(c + off, kWrite);
  __builtin_prefetch(c + static_cast<size_t>(bytes) - 1, kWrite);
}

}  // namespace dualemb

#endif  // DUALEMB_ROW_BYTES_H_
