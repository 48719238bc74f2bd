#include "initializer.h"

#include <cmath>
#include <stdexcept>

#include "normal.h"
#include "random.h"

namespace dualemb {

Initializer Initializer::from_config(const Config& c, int64_t dim) {
  Initializer init;
  init.dim_ = dim;
  std::string kind = c.get_string("initializer", "zeros");
  // Only the members a kind uses are read, so describe() lists exactly those.
  if (kind == "zeros") {
    init.kind_ = kZeros;
  } else if (kind == "constant") {
    init.kind_ = kConstant;
    init.a_ = 0.0;
    if (c.has("value")) {
      // A JSON integer is kept exactly too: an int64 table's constant may exceed 2^53.
      try {
        init.constant_int_ = c.get_int("value", 0);
        init.constant_is_int_ = true;
        init.a_ = static_cast<double>(init.constant_int_);
      } catch (const std::invalid_argument&) {
        init.a_ = c.get_double("value", 0.0);
      }
    } else {
      init.a_ = c.get_double("value", 0.0);
    }
  } else if (kind == "vector") {
    init.kind_ = kVector;
    if (!c.has("values")) throw std::invalid_argument("vector initializer needs 'values'");
    std::vector<Config::Number> v = c.get_numbers("values");
    if (v.size() == 1) v.assign(static_cast<size_t>(dim), v[0]);
    if (static_cast<int64_t>(v.size()) != dim)
      throw std::invalid_argument("vector initializer has " + std::to_string(v.size()) +
                                  " values; it needs dim=" + std::to_string(dim) + " or 1");
    for (const Config::Number& n : v) {
      init.vector_.push_back(static_cast<float>(n.d));
      ConstantValue given;
      given.d = n.d;
      given.is_int = n.is_int;
      given.i = n.i;
      init.vector_given_.push_back(given);
    }
  } else if (kind == "normal" || kind == "truncated_normal") {
    init.kind_ = kind == "normal" ? kNormal : kTruncatedNormal;
    init.seed_ = c.get_uint("seed", 0);
    init.a_ = c.get_double("mean", 0.0);
    init.b_ = c.get_double("stddev", 1.0);
    if (!(init.b_ >= 0.0)) throw std::invalid_argument("initializer stddev must be >= 0");
  } else if (kind == "uniform") {
    init.kind_ = kUniform;
    init.seed_ = c.get_uint("seed", 0);
    init.a_ = c.get_double("minval", -0.05);
    init.b_ = c.get_double("maxval", 0.05);
    if (!(init.b_ >= init.a_)) throw std::invalid_argument("initializer maxval must be >= minval");
  } else {
    throw std::invalid_argument("unknown initializer '" + kind +
                                "' (known: zeros, constant, vector, normal, truncated_normal, "
                                "uniform)");
  }
  return init;
}

const char* Initializer::kind_name() const {
  switch (kind_) {
    case kZeros: return "zeros";
    case kConstant: return "constant";
    case kVector: return "vector";
    case kNormal: return "normal";
    case kTruncatedNormal: return "truncated_normal";
    case kUniform: return "uniform";
  }
  return "unknown";
}

std::vector<ConstantValue> Initializer::constant_values() const {
  std::vector<ConstantValue> out(static_cast<size_t>(dim_));
  for (int64_t j = 0; j < dim_; ++j) {
    ConstantValue& v = out[j];
    if (kind_ == kConstant) {
      v.d = a_;
      v.is_int = constant_is_int_;
      v.i = constant_int_;
    } else if (kind_ == kVector) {
      v = vector_given_[j];
    }
  }
  return out;
}

kernels::InitKernel Initializer::kernel() const {
  kernels::InitKernel k;
  k.dim = dim_;
  k.seed = seed_;
  switch (kind_) {
    case kZeros: k.kind = kernels::InitKernel::kZeros; break;
    case kConstant:
      k.kind = kernels::InitKernel::kConstant;
      k.a = static_cast<float>(a_);
      break;
    case kVector:
      k.kind = kernels::InitKernel::kVector;
      k.vector = vector_.data();
      break;
    case kNormal:
    case kTruncatedNormal:
      k.kind = kind_ == kNormal ? kernels::InitKernel::kNormal
                                : kernels::InitKernel::kTruncatedNormal;
      k.a = static_cast<float>(a_);
      k.b = static_cast<float>(b_);
      break;
    case kUniform:
      k.kind = kernels::InitKernel::kUniform;
      k.a = static_cast<float>(a_);
      k.b = static_cast<float>(b_ - a_);
      break;
  }
  return k;
}

void Initializer::fill(uint64_t key, float* row) const {
  const int64_t dim = dim_;
  switch (kind_) {
    case kZeros:
      for (int64_t j = 0; j < dim; ++j) row[j] = 0.f;
      return;
    case kConstant: {
      const float v = static_cast<float>(a_);
      for (int64_t j = 0; j < dim; ++j) row[j] = v;
      return;
    }
    case kVector:
      for (int64_t j = 0; j < dim; ++j) row[j] = vector_[j];
      return;
    case kUniform: {
      const uint64_t s = key_stream(seed_, key);
      const float lo = static_cast<float>(a_), span = static_cast<float>(b_ - a_);
      for (int64_t j = 0; j < dim; ++j) row[j] = kernels::uniform_value(s, j, lo, span);
      return;
    }
    case kNormal:
      fill_normal(key_stream(seed_, key), static_cast<float>(a_), static_cast<float>(b_), row,
                  dim);
      return;
    case kTruncatedNormal: {
      const uint64_t s = key_stream(seed_, key);
      const float mean = static_cast<float>(a_), sd = static_cast<float>(b_);
      for (int64_t j = 0; j < dim; ++j)
        row[j] = kernels::truncated_normal_value(s, j, dim, mean, sd);
      return;
    }
  }
}

}  // namespace dualemb
