// string_batch.h — the strings of a batch as the C ABI passes them (dualemb_core.h): string i is
// bytes[offsets[i], offsets[i+1]). String keys (de_string_keys) and string values
// (de_string_values, the same struct) are read and checked the same way.
#ifndef DUALEMB_STRING_BATCH_H_
#define DUALEMB_STRING_BATCH_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "dualemb_core.h"

namespace dualemb {

// The `count` strings of `batch` (a de_string_keys*), checked; views into the caller's bytes.
// `what` names the batch in messages ("string keys"), `unit` its items ("position").
inline std::vector<std::string_view> read_string_batch(const void* batch, int64_t count,
                                                       const char* what, const char* unit) {
  std::vector<std::string_view> out;
  if (count == 0) return out;
  const auto* b = static_cast<const de_string_keys*>(batch);
  const std::string w(what);
  if (!b->offsets) throw std::invalid_argument(w + ": offsets pointer is null");
  if (b->offsets[0] < 0) throw std::invalid_argument(w + ": offsets[0] is negative");
  for (int64_t i = 0; i < count; ++i)
    if (b->offsets[i + 1] < b->offsets[i])
      throw std::invalid_argument(w + ": offsets decrease at " + unit + " " + std::to_string(i));
  if (b->offsets[count] > b->offsets[0] && !b->bytes)
    throw std::invalid_argument(w + ": bytes pointer is null");
  out.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i)
    out.emplace_back(b->bytes + b->offsets[i],
                     static_cast<size_t>(b->offsets[i + 1] - b->offsets[i]));
  return out;
}

}  // namespace dualemb

#endif  // DUALEMB_STRING_BATCH_H_
