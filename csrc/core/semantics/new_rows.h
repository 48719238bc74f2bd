// semantics/new_rows.h — what a new row holds, the same way in every backend.
//
// A key inserted without a given value (find_or_insert, apply_gradients on a new key) starts
// from its initial row, a pure function of (seed, key) (initializer.h): never of insertion
// order, shard, thread or backend. Every new row, whoever gives its value, starts its optimizer
// slots at the optimizer's initial values. Rows are `dim` elements of the table's value dtype,
// slots `dim` elements each after the value, as the Storage interface lays them out.
#ifndef DUALEMB_SEMANTICS_NEW_ROWS_H_
#define DUALEMB_SEMANTICS_NEW_ROWS_H_

#include <cstdint>
#include <cstring>
#include <vector>

#include "../initializer.h"
#include "../optimizer.h"
#include "../storage/table_options.h"
#include "../value_dtype.h"

namespace dualemb {

// The initial value row of any key, in the table's value dtype.
class NewRowValues {
 public:
  NewRowValues() = default;
  explicit NewRowValues(const TableOptions& o)
      : init_(o.init),
        initial_row_(o.initial_row),
        dim_(o.dim),
        value_dtype_(o.value_dtype),
        row_bytes_(o.value_size * static_cast<size_t>(o.dim)) {}

  // Writes key's initial row (dim elements of the value dtype) to out. Inline: the in-memory
  // table calls it per new key.
  void fill(uint64_t key, void* out) const {
    if (value_dtype_ == DE_VALUE_FLOAT32)
      init_.fill(key, static_cast<float*>(out));
    else
      fill_converted(key, out);
  }
  // The initial rows of n keys, row after row.
  void fill(const int64_t* keys, int64_t n, void* out) const {
    unsigned char* p = static_cast<unsigned char*>(out);
    for (int64_t i = 0; i < n; ++i) fill(static_cast<uint64_t>(keys[i]), p + i * row_bytes_);
  }

 private:
  void fill_converted(uint64_t key, void* out) const {
    if (!initial_row_.empty()) {
      std::memcpy(out, initial_row_.data(), initial_row_.size());
      return;
    }
    // A random initializer on a float16/bfloat16/float64 table: the float32 row of (seed, key),
    // converted, so every dtype starts from the same draws. (Integer tables refuse these.)
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<size_t>(dim_));
    init_.fill(key, scratch.data());
    floats_to_values(value_dtype_, scratch.data(), out, dim_);
  }

  Initializer init_;
  std::vector<unsigned char> initial_row_;  // see TableOptions::initial_row
  int64_t dim_ = 0;
  int value_dtype_ = DE_VALUE_FLOAT32;
  size_t row_bytes_ = 0;
};

// A new row's slot columns (after the `dim` values at `row`), each at the optimizer's initial
// value in the value dtype; nothing without an optimizer.
inline void fill_new_slots(void* row, int64_t dim, int value_dtype, const Optimizer* opt) {
  if (!opt) return;
  const int ns = opt->num_slots();
  // float32 without a call: the in-memory table runs this per inserted row.
  const size_t size =
      value_dtype == DE_VALUE_FLOAT32 ? sizeof(float) : value_dtype_size(value_dtype);
  unsigned char* base = static_cast<unsigned char*>(row);
  for (int s = 0; s < ns; ++s) {
    const float v = opt->slot_initial_value(s);
    unsigned char* slot = base + size * static_cast<size_t>(dim) * (1 + s);
    if (value_dtype == DE_VALUE_FLOAT32) {
      float* p = reinterpret_cast<float*>(slot);
      for (int64_t j = 0; j < dim; ++j) p[j] = v;
    } else {
      for (int64_t j = 0; j < dim; ++j) floats_to_values(value_dtype, &v, slot + size * j, 1);
    }
  }
}

}  // namespace dualemb

#endif  // DUALEMB_SEMANTICS_NEW_ROWS_H_
