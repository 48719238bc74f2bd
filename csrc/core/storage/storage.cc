// storage.cc — the defaults that backends may override.
#include "storage/storage.h"

#include <stdexcept>
#include <vector>

#include "value_dtype.h"

namespace dualemb {

int64_t Storage::accum_rows(const int64_t* keys, int64_t n, const void* old_values,
                            const void* new_values, const uint8_t* exists) {
  // Allocated before the table is touched: a std::bad_alloc leaves it unchanged.
  std::vector<unsigned char> deltas(value_dtype_size(value_dtype()) *
                                    static_cast<size_t>(dim()) * static_cast<size_t>(n));
  accum_deltas(value_dtype(), old_values, new_values, exists, n, dim(), deltas.data());
  return accum(keys, n, deltas.data(), exists);
}

std::shared_ptr<Storage> Storage::clone() const {
  throw std::invalid_argument(
      "this table's storage backend cannot be copied: only in-memory tables can be cloned (a "
      "Redis table's rows live in the server; a background save of it is not supported)");
}

}  // namespace dualemb
