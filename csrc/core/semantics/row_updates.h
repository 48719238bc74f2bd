// semantics/row_updates.h — the per-key rules of the writes, the same way in every backend.
//
// Each is one line, but each is part of the table contract (dualemb_core.h), so it lives here
// once rather than once per backend: TFRA's accum rule, find_or_insert's `exists`, the update
// count, the metadata an import carries in, and the slot count a caller sized its buffer for.
#ifndef DUALEMB_SEMANTICS_ROW_UPDATES_H_
#define DUALEMB_SEMANTICS_ROW_UPDATES_H_

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "../de_hd.h"

namespace dualemb {

// TFRA's accum rule for one key: absent and !exists -> insert the delta as the row; present and
// exists -> add the delta; anything else -> leave the key alone. DE_HD: the GPU table's accum
// kernel runs this very function.
enum class AccumAction { kInsert, kAdd, kIgnore };
DE_HD inline AccumAction accum_action(bool present, bool exists) {
  if (!present && !exists) return AccumAction::kInsert;
  if (present && exists) return AccumAction::kAdd;
  return AccumAction::kIgnore;
}

// find_or_insert's `exists`: a row found with the stamp of this very call was inserted by an
// earlier duplicate of the key in the same batch, so it did not exist before the call.
inline bool stamped_by_this_call(int64_t last_update, int64_t stamp) {
  return last_update == stamp;
}

// A row's update count after one more update; it saturates instead of wrapping around.
inline void bump_count(uint32_t& c) { c += c != UINT32_MAX; }

// An imported update count, clamped to what a row stores.
inline uint32_t imported_count(int64_t c) {
  return static_cast<uint32_t>(std::min<int64_t>(std::max<int64_t>(c, 0), UINT32_MAX));
}

// The clock after importing rows stamped `last_update`: ahead of every imported stamp, so
// recency stays meaningful (a later write ranks above every imported row).
inline int64_t clock_after_import(int64_t clock, const int64_t* last_update, int64_t n) {
  int64_t mx = 0;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, last_update[i]);
  return mx >= clock ? mx + 1 : clock;
}

// `given` is the slot count the caller sized its slots buffer for (-1: no slots buffer).
inline void check_slot_count(int given, int actual) {
  if (given >= 0 && given != actual)
    throw std::invalid_argument("slots buffer sized for " + std::to_string(given) +
                                " slots per row but the table has " + std::to_string(actual) +
                                " (its optimizer changed?)");
}

}  // namespace dualemb

#endif  // DUALEMB_SEMANTICS_ROW_UPDATES_H_
