#include "table_options.h"

#include "../string_values.h"
#include "../value_dtype.h"
#include "../dualemb_core.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace dualemb {
namespace {

int parse_key_dtype(const std::string& s) {
  if (s == "int64") return 0;
  if (s == "int32") return 1;
  if (s == "string") return 2;  // DE_KEY_STRING: the registry adds the StringKeys map
  throw std::invalid_argument("unsupported key_dtype '" + s +
                              "' (supported: int64, int32, string)");
}

TableOptions read_rest(const Config& c, TableOptions o);

}  // namespace

const std::set<std::string>& table_option_names() {
  static const std::set<std::string> names = {
      "dim",    "key_dtype", "value_dtype", "initializer", "seed",         "mean",
      "stddev", "minval",    "maxval",      "value",       "values",       "capacity",
      "evict_policy", "num_threads", "backend"};
  return names;
}

TableOptions read_table_options(const Config& c) {
  TableOptions o;
  if (!c.has("dim")) throw std::invalid_argument("table config needs dim");
  o.dim = c.get_int("dim", 0);
  if (o.dim <= 0 || o.dim > kMaxDim)
    throw std::invalid_argument("dim must be in [1, " + std::to_string(kMaxDim) + "], got " +
                                std::to_string(o.dim));
  o.key_dtype = parse_key_dtype(c.get_string("key_dtype", "int64"));
  const std::string vdt = c.get_string("value_dtype", "float32");
  o.value_dtype = parse_value_dtype(vdt);
  o.value_size = value_dtype_size(o.value_dtype);
  if (o.value_dtype == DE_VALUE_STRING) {
    // Rows hold handles into the table's string pool (string_values.h); handle 0 is the
    // column's default string, so every initial row is all zero bytes.
    if (o.key_dtype == DE_KEY_STRING)
      throw std::invalid_argument("value dtype string needs int64 or int32 keys (string keys with "
                                  "string values are not supported; TFRA has no such table either)");
    string_default_row(c, o.dim);  // checks (and echoes) the initializer members
    o.initial_row.assign(o.value_size * static_cast<size_t>(o.dim), 0);
    return read_rest(c, o);
  }
  o.init = Initializer::from_config(c, o.dim);
  if (value_dtype_is_integer(o.value_dtype) && !o.init.is_constant())
    throw std::invalid_argument("a table of value dtype " + vdt + " takes only a constant " +
                                "initializer (zeros, constant or vector with values exact in " +
                                vdt + "); initializer '" + o.init.kind_name() +
                                "' draws random floats");
  if (o.value_dtype != DE_VALUE_FLOAT32 && o.init.is_constant())
    o.initial_row = constant_row(o.value_dtype, o.init.constant_values());
  return read_rest(c, o);
}

namespace {
// The members after the initializer (capacity, eviction, threads).
TableOptions read_rest(const Config& c, TableOptions o) {
  o.capacity = c.get_int("capacity", 0);
  if (o.capacity < 0) throw std::invalid_argument("capacity must be >= 0 (0 = unlimited)");
  std::string ep = c.get_string("evict_policy", "recency");
  if (ep == "recency") o.evict_policy = RestrictBy::kRecency;
  else if (ep == "frequency") o.evict_policy = RestrictBy::kFrequency;
  else throw std::invalid_argument("unknown evict_policy '" + ep + "' (recency, frequency)");
  o.num_threads = static_cast<int>(c.get_int("num_threads", 0));
  if (o.num_threads < 0)
    throw std::invalid_argument("num_threads must be >= 0 (0 = all cores)");
  // A setting of this process (de_set_num_threads changes it), not part of the description.
  c.drop_echo("num_threads");
  return o;
}
}  // namespace

void refuse_unused(const Config& c) {
  const std::string unused = c.first_unread();
  if (!unused.empty())
    throw std::invalid_argument("table config: '" + unused + "' does not apply to initializer '" +
                                c.get_string("initializer", "zeros") + "'");
}

void check_restrict_scores(const int64_t* keys, const float* scores, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (std::isnan(scores[i]))
      throw std::invalid_argument("the score of key " + std::to_string(keys[i]) +
                                  " (position " + std::to_string(i) +
                                  ") is NaN; scores must be numbers (+-inf allowed)");
}

}  // namespace dualemb
