// initializer.h — initial rows as a pure function of (seed, key).
//
// A key's initial row never depends on insertion order, shard count, thread count or framework:
// each column draws from a counter-based generator keyed by (seed, key, column), so TF, JAX and
// any resharding of a table agree bit for bit.
#ifndef DUALEMB_INITIALIZER_H_
#define DUALEMB_INITIALIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"
#include "init_math.h"
#include "value_dtype.h"

namespace dualemb {

class Initializer {
 public:
  enum Kind { kZeros, kConstant, kVector, kNormal, kTruncatedNormal, kUniform };

  // Reads the members initializer, and those of its kind (seed, mean, stddev, minval, maxval,
  // value, values), from the table config `c` (which records them for describe()).
  // Throws std::invalid_argument naming a bad kind or parameter.
  static Initializer from_config(const Config& c, int64_t dim);

  // Writes the initial row of `key` (dim floats).
  void fill(uint64_t key, float* row) const;
  Kind kind() const { return kind_; }
  const char* kind_name() const;
  // zeros, constant and vector: the same row for every key, with no random draw.
  bool is_constant() const { return kind_ == kZeros || kind_ == kConstant || kind_ == kVector; }
  // A constant kind's row (dim columns), each value as given (a JSON integer exactly).
  std::vector<ConstantValue> constant_values() const;
  // The same initializer as plain data for kernels::initial_value() (init_math.h), which gives
  // fill()'s values column by column (the GPU table's form). For kVector, `vector` points into
  // this Initializer: valid while it lives (the GPU table copies it to the device).
  kernels::InitKernel kernel() const;

 private:
  Kind kind_ = kZeros;
  int64_t dim_ = 1;
  uint64_t seed_ = 0;
  double a_ = 0.0, b_ = 1.0;  // mean/stddev, minval/maxval, or the constant in a_
  std::vector<float> vector_;   // kVector: dim values
  // kVector: the values as given (before float rounding; JSON integers exactly).
  std::vector<ConstantValue> vector_given_;
  bool constant_is_int_ = false;  // kConstant given as a JSON integer: exact in constant_int_
  int64_t constant_int_ = 0;
};

}  // namespace dualemb

#endif  // DUALEMB_INITIALIZER_H_
