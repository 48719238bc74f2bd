#include "value_dtype.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "config.h"

namespace dualemb {
namespace {

struct DtypeInfo {
  const char* name;
  size_t size;
};
// Indexed by DE_VALUE_*.
constexpr DtypeInfo kDtypes[] = {{"float32", 4}, {"float16", 2}, {"bfloat16", 2}, {"float64", 8},
                                 {"int8", 1},    {"int32", 4},   {"int64", 8},
                                 // string: the storage holds an 8-byte handle per element
                                 // (string_values.h); the bytes live in the table's pool.
                                 {"string", 8}};
constexpr int kNumDtypes = sizeof(kDtypes) / sizeof(kDtypes[0]);

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void check_dtype(int dtype) {
  if (dtype < 0 || dtype >= kNumDtypes)
    throw std::invalid_argument("unknown value dtype code " + std::to_string(dtype));
}

// Integers add through their unsigned type: wrap-around is defined there, not in the signed one.
template <class T, class U>
void add_wrapping(void* row, const void* delta, int64_t n) {
  T* r = static_cast<T*>(row);
  const T* d = static_cast<const T*>(delta);
  for (int64_t j = 0; j < n; ++j)
    r[j] = static_cast<T>(static_cast<U>(static_cast<U>(r[j]) + static_cast<U>(d[j])));
}

template <class T>
void add_plain(void* row, const void* delta, int64_t n) {
  T* r = static_cast<T*>(row);
  const T* d = static_cast<const T*>(delta);
  for (int64_t j = 0; j < n; ++j) r[j] += d[j];
}

template <uint16_t (*Narrow)(float), float (*Widen)(uint16_t)>
void add_half(void* row, const void* delta, int64_t n) {
  uint16_t* r = static_cast<uint16_t*>(row);
  const uint16_t* d = static_cast<const uint16_t*>(delta);
  for (int64_t j = 0; j < n; ++j) r[j] = Narrow(Widen(r[j]) + Widen(d[j]));
}

template <class T, class U>
U difference_wrapping(T a, T b) { return static_cast<U>(static_cast<U>(a) - static_cast<U>(b)); }

template <class T, class U>
void add_difference_wrapping(void* row, const void* a, const void* b, int64_t n) {
  T* r = static_cast<T*>(row);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (int64_t j = 0; j < n; ++j)
    r[j] = static_cast<T>(static_cast<U>(static_cast<U>(r[j]) + difference_wrapping<T, U>(x[j], y[j])));
}

template <class T>
void add_difference_plain(void* row, const void* a, const void* b, int64_t n) {
  T* r = static_cast<T*>(row);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (int64_t j = 0; j < n; ++j) {
    const T d = x[j] - y[j];  // rounded to T before the add (-ffp-contract=off: no fused op)
    r[j] += d;
  }
}

template <uint16_t (*Narrow)(float), float (*Widen)(uint16_t)>
void add_difference_half(void* row, const void* a, const void* b, int64_t n) {
  uint16_t* r = static_cast<uint16_t*>(row);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t d = Narrow(Widen(x[j]) - Widen(y[j]));
    r[j] = Narrow(Widen(r[j]) + Widen(d));
  }
}

template <class T, class U>
void difference_wrapping_into(void* out, const void* a, const void* b, int64_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (int64_t j = 0; j < n; ++j) o[j] = static_cast<T>(difference_wrapping<T, U>(x[j], y[j]));
}

template <class T>
void difference_plain_into(void* out, const void* a, const void* b, int64_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (int64_t j = 0; j < n; ++j) o[j] = x[j] - y[j];
}

template <uint16_t (*Narrow)(float), float (*Widen)(uint16_t)>
void difference_half_into(void* out, const void* a, const void* b, int64_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (int64_t j = 0; j < n; ++j) o[j] = Narrow(Widen(x[j]) - Widen(y[j]));
}

template <class T>
void store_integer(const ConstantValue& v, unsigned char* out, const char* dtype_name) {
  const auto lo = std::numeric_limits<T>::min();
  const auto hi = std::numeric_limits<T>::max();
  int64_t x;
  if (v.is_int) {
    x = v.i;
  } else {
    // 2^63 itself is not an int64; every double below it in magnitude that is integral is.
    if (!(std::floor(v.d) == v.d))
      throw std::invalid_argument("initializer value " + format_double(v.d) +
                                  " is not exactly representable as " + dtype_name);
    if (!(std::fabs(v.d) < 9223372036854775808.0))
      throw std::invalid_argument("initializer value " + format_double(v.d) +
                                  " is out of the range of " + dtype_name);
    // A JSON number that is not an integer literal came through a double: from 2^53 on it may
    // already have been rounded, so it is refused rather than stored possibly wrong.
    if (sizeof(T) == 8 && std::fabs(v.d) >= 9007199254740992.0)
      throw std::invalid_argument("initializer value " + format_double(v.d) +
                                  " is beyond 2^53 and not given as an integer; an int64 "
                                  "value that large must be a JSON integer");
    x = static_cast<int64_t>(v.d);
  }
  if (x < static_cast<int64_t>(lo) || x > static_cast<int64_t>(hi))
    throw std::invalid_argument("initializer value " +
                                (v.is_int ? std::to_string(v.i) : format_double(v.d)) +
                                " is out of the range of " + dtype_name);
  const T t = static_cast<T>(x);
  std::memcpy(out, &t, sizeof(T));
}

}  // namespace

int parse_value_dtype(const std::string& name) {
  for (int d = 0; d < kNumDtypes; ++d)
    if (name == kDtypes[d].name) return d;
  throw std::invalid_argument("unsupported value_dtype '" + name +
                              "' (supported: float32, float16, bfloat16, float64, int8, int32, "
                              "int64, string)");
}

const char* value_dtype_name(int dtype) {
  return dtype >= 0 && dtype < kNumDtypes ? kDtypes[dtype].name : "unknown";
}

size_t value_dtype_size(int dtype) {
  check_dtype(dtype);
  return kDtypes[dtype].size;
}

bool value_dtype_trainable(int dtype) {
  return dtype == DE_VALUE_FLOAT32 || dtype == DE_VALUE_FLOAT16 || dtype == DE_VALUE_BFLOAT16;
}

bool value_dtype_is_integer(int dtype) {
  return dtype == DE_VALUE_INT8 || dtype == DE_VALUE_INT32 || dtype == DE_VALUE_INT64;
}

uint16_t float_to_half(float f) {
  uint32_t u = bits_of(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u)  // inf, or NaN (kept quiet, with the top of its payload)
    return sign | (u == 0x7f800000u ? 0x7c00 : static_cast<uint16_t>(0x7e00 | ((u >> 13) & 0x3ff)));
  if (u >= 0x47800000u) return sign | 0x7c00;  // >= 2^16: beyond half's range
  if (u < 0x38800000u) {
    // Below half's smallest normal (2^-14): the result is a subnormal multiple of 2^-24. Adding
    // 0.5 puts 2^-24 at the float's last mantissa bit, so the FPU's own round-to-nearest-even
    // does the rounding; the sum is a normal float, unaffected by flush-to-zero modes.
    const float shifted = float_of(u) + 0.5f;
    return sign | static_cast<uint16_t>(bits_of(shifted) - bits_of(0.5f));
  }
  // Normal: rebias the exponent (127 -> 15) and drop 13 mantissa bits, rounding to nearest even
  // (a carry out of the mantissa correctly bumps the exponent, up to infinity).
  const uint32_t odd = (u >> 13) & 1u;
  u += 0xc8000fffu + odd;  // (15 - 127) << 23, plus the rounding bias; wraps as intended
  return sign | static_cast<uint16_t>(u >> 13);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return float_of(sign | 0x7f800000u | (mant << 13));
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in float (and a normal float, so no flush).
    const float m = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return float_of(sign | bits_of(m));
  }
  return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t float_to_bfloat16(float f) {
  const uint32_t u = bits_of(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float bfloat16_to_float(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }

void floats_to_values(int dtype, const float* src, void* dst, int64_t n) {
  switch (dtype) {
    case DE_VALUE_FLOAT32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case DE_VALUE_FLOAT16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t j = 0; j < n; ++j) d[j] = float_to_half(src[j]);
      return;
    }
    case DE_VALUE_BFLOAT16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t j = 0; j < n; ++j) d[j] = float_to_bfloat16(src[j]);
      return;
    }
    case DE_VALUE_FLOAT64: {
      double* d = static_cast<double*>(dst);
      for (int64_t j = 0; j < n; ++j) d[j] = src[j];
      return;
    }
  }
  throw std::invalid_argument(std::string("no float conversion to value dtype ") +
                              value_dtype_name(dtype));
}

void values_to_floats(int dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DE_VALUE_FLOAT32:
      std::memcpy(dst, src, sizeof(float) * n);
      return;
    case DE_VALUE_FLOAT16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t j = 0; j < n; ++j) dst[j] = half_to_float(s[j]);
      return;
    }
    case DE_VALUE_BFLOAT16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t j = 0; j < n; ++j) dst[j] = bfloat16_to_float(s[j]);
      return;
    }
  }
  throw std::invalid_argument(std::string("no float32 view of value dtype ") +
                              value_dtype_name(dtype));
}

void add_values(int dtype, void* row, const void* delta, int64_t n) {
  switch (dtype) {
    case DE_VALUE_FLOAT32: return add_plain<float>(row, delta, n);
    case DE_VALUE_FLOAT64: return add_plain<double>(row, delta, n);
    case DE_VALUE_FLOAT16: return add_half<float_to_half, half_to_float>(row, delta, n);
    case DE_VALUE_BFLOAT16: return add_half<float_to_bfloat16, bfloat16_to_float>(row, delta, n);
    case DE_VALUE_INT8: return add_wrapping<int8_t, uint8_t>(row, delta, n);
    case DE_VALUE_INT32: return add_wrapping<int32_t, uint32_t>(row, delta, n);
    case DE_VALUE_INT64: return add_wrapping<int64_t, uint64_t>(row, delta, n);
    case DE_VALUE_STRING:
      throw std::invalid_argument("accum is not defined for a table of value dtype string");
  }
  check_dtype(dtype);
}

void add_difference(int dtype, void* row, const void* a, const void* b, int64_t n) {
  switch (dtype) {
    case DE_VALUE_FLOAT32: return add_difference_plain<float>(row, a, b, n);
    case DE_VALUE_FLOAT64: return add_difference_plain<double>(row, a, b, n);
    case DE_VALUE_FLOAT16:
      return add_difference_half<float_to_half, half_to_float>(row, a, b, n);
    case DE_VALUE_BFLOAT16:
      return add_difference_half<float_to_bfloat16, bfloat16_to_float>(row, a, b, n);
    case DE_VALUE_INT8: return add_difference_wrapping<int8_t, uint8_t>(row, a, b, n);
    case DE_VALUE_INT32: return add_difference_wrapping<int32_t, uint32_t>(row, a, b, n);
    case DE_VALUE_INT64: return add_difference_wrapping<int64_t, uint64_t>(row, a, b, n);
    case DE_VALUE_STRING:
      throw std::invalid_argument("accum is not defined for a table of value dtype string");
  }
  check_dtype(dtype);
}

void accum_deltas(int dtype, const void* old_rows, const void* new_rows, const uint8_t* exists,
                  int64_t rows, int64_t dim, void* out) {
  void (*diff)(void*, const void*, const void*, int64_t) = nullptr;
  switch (dtype) {
    case DE_VALUE_FLOAT32: diff = difference_plain_into<float>; break;
    case DE_VALUE_FLOAT64: diff = difference_plain_into<double>; break;
    case DE_VALUE_FLOAT16: diff = difference_half_into<float_to_half, half_to_float>; break;
    case DE_VALUE_BFLOAT16:
      diff = difference_half_into<float_to_bfloat16, bfloat16_to_float>;
      break;
    case DE_VALUE_INT8: diff = difference_wrapping_into<int8_t, uint8_t>; break;
    case DE_VALUE_INT32: diff = difference_wrapping_into<int32_t, uint32_t>; break;
    case DE_VALUE_INT64: diff = difference_wrapping_into<int64_t, uint64_t>; break;
    case DE_VALUE_STRING:
      throw std::invalid_argument("accum is not defined for a table of value dtype string");
    default: check_dtype(dtype);
  }
  const size_t rb = value_dtype_size(dtype) * static_cast<size_t>(dim);
  const auto* o = static_cast<const unsigned char*>(old_rows);
  const auto* v = static_cast<const unsigned char*>(new_rows);
  auto* d = static_cast<unsigned char*>(out);
  for (int64_t i = 0; i < rows; ++i) {
    if (exists[i])
      diff(d + i * rb, v + i * rb, o + i * rb, dim);
    else
      std::memcpy(d + i * rb, v + i * rb, rb);
  }
}

std::vector<unsigned char> constant_row(int dtype, const std::vector<ConstantValue>& values) {
  const size_t size = value_dtype_size(dtype);
  std::vector<unsigned char> row(size * values.size());
  for (size_t j = 0; j < values.size(); ++j) {
    unsigned char* out = row.data() + j * size;
    const ConstantValue& v = values[j];
    const double d = v.is_int ? static_cast<double>(v.i) : v.d;
    switch (dtype) {
      case DE_VALUE_INT8: store_integer<int8_t>(v, out, "int8"); break;
      case DE_VALUE_INT32: store_integer<int32_t>(v, out, "int32"); break;
      case DE_VALUE_INT64: store_integer<int64_t>(v, out, "int64"); break;
      case DE_VALUE_FLOAT64: std::memcpy(out, &d, 8); break;
      default: {
        const float f = static_cast<float>(d);
        floats_to_values(dtype, &f, out, 1);
      }
    }
  }
  return row;
}

}  // namespace dualemb
