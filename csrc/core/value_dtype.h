// value_dtype.h — the element types a table's rows (and optimizer slots) are stored in.
//
// A table keeps its values in one dtype (DE_VALUE_* in dualemb_core.h): float32 (the default),
// float16, bfloat16, float64, int8, int32, int64 or string (string_values.h: the storage holds
// one int64 handle per element, the pool the bytes). Rows cross the C ABI in that dtype, as raw
// bytes; only gradients (and restrict scores) are always float32. Helpers here convert whole rows
// so that the table's per-key loops dispatch on the dtype once per row, never per element.
//
// float16/bfloat16 arithmetic (accum, optimizer steps) is done in float32 and rounded back to the
// nearest representable value, ties to even (IEEE round-to-nearest, what numpy's and ml_dtypes'
// astype do).
#ifndef DUALEMB_VALUE_DTYPE_H_
#define DUALEMB_VALUE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dualemb_core.h"

namespace dualemb {

// DE_VALUE_* from its name ("float32", ...); throws std::invalid_argument listing the names.
int parse_value_dtype(const std::string& name);
const char* value_dtype_name(int dtype);
// Bytes of one element.
size_t value_dtype_size(int dtype);
// Whether fused optimizers can train a table of this dtype (float32, float16, bfloat16).
bool value_dtype_trainable(int dtype);
bool value_dtype_is_integer(int dtype);

// Scalar conversions, rounding to nearest, ties to even. NaN stays NaN, overflow gives +-inf.
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bfloat16(float f);
float bfloat16_to_float(uint16_t b);

// n floats -> n elements of a float dtype (float32, float16, bfloat16, float64).
void floats_to_values(int dtype, const float* src, void* dst, int64_t n);
// n elements of a float dtype -> n floats (float64 is rounded; only used for float32/16/bf16).
void values_to_floats(int dtype, const void* src, float* dst, int64_t n);
// row[j] += delta[j] for n elements: integers wrap around (two's complement), float16/bfloat16
// add in float32 and round, float32 in float32, float64 in double.
void add_values(int dtype, void* row, const void* delta, int64_t n);
// TFRA's accum deltas, in the dtype's arithmetic: for each of `rows` rows of `dim` elements,
// out = new - old where exists, else new (integers wrap; float16/bfloat16 subtract in float32
// and round, as TF's Sub does).
void accum_deltas(int dtype, const void* old_rows, const void* new_rows, const uint8_t* exists,
                  int64_t rows, int64_t dim, void* out);
// row[j] += (a[j] - b[j]) for n elements, the difference rounded to the dtype before the add:
// the same bits as accum_deltas followed by add_values, without a buffer for the deltas.
void add_difference(int dtype, void* row, const void* a, const void* b, int64_t n);

// One column of a constant initializer: a JSON integer keeps its exact int64 value (an int64 table
// may hold integers beyond double's 2^53).
struct ConstantValue {
  double d = 0.0;
  bool is_int = false;
  int64_t i = 0;
};

// The bytes of a row of `dtype` holding `values` (one per column), for constant initializers.
// Integer dtypes need every value exactly representable (integral and in range); throws
// std::invalid_argument naming the value and dtype otherwise. float16/bfloat16 go through
// float32 (as every initializer's row does); float64 takes the value as given.
std::vector<unsigned char> constant_row(int dtype, const std::vector<ConstantValue>& values);

}  // namespace dualemb

#endif  // DUALEMB_VALUE_DTYPE_H_
