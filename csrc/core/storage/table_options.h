// table_options.h — the table config members every backend shares (dim, dtypes, initializer,
// capacity, eviction, threads), read one way for all of them.
#ifndef DUALEMB_STORAGE_TABLE_OPTIONS_H_
#define DUALEMB_STORAGE_TABLE_OPTIONS_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "../config.h"
#include "../initializer.h"
#include "storage.h"

namespace dualemb {

constexpr int64_t kMaxDim = 1 << 16;

struct TableOptions {
  int64_t dim = 0;
  int key_dtype = 0;  // DE_KEY_INT64 / DE_KEY_INT32
  int value_dtype = 0;  // DE_VALUE_*
  size_t value_size = 4;  // bytes per element of value_dtype
  Initializer init;
  // For a value dtype other than float32 and a constant initializer: the initial row's bytes in
  // the value dtype (empty otherwise: rows are drawn as float32 and converted).
  std::vector<unsigned char> initial_row;
  int64_t capacity = 0;
  RestrictBy evict_policy = RestrictBy::kRecency;
  int num_threads = 0;
};

// The member names read_table_options reads (a backend adds its own to check_known).
const std::set<std::string>& table_option_names();

// Reads the shared members from `c` (recording them for describe(); num_threads is left out of
// the description). Throws std::invalid_argument naming a bad member.
TableOptions read_table_options(const Config& c);

// Refuses a member given but not read: a known member the config does not use (a seed for
// zeros, minval for normal) is refused rather than ignored.
void refuse_unused(const Config& c);

// restrict(by=custom)'s scores, checked the same way by every backend: NaN has no place in a
// ranking (every comparison with it is false), so it is refused rather than given an arbitrary
// rank. Throws std::invalid_argument naming the key and position.
void check_restrict_scores(const int64_t* keys, const float* scores, int64_t n);

}  // namespace dualemb

#endif  // DUALEMB_STORAGE_TABLE_OPTIONS_H_
