// semantics/restrict_ranking.h — which rows restrict (and capacity eviction) keeps, the same way
// in every backend.
//
// restrict(num_reserved, by) keeps the num_reserved best rows and erases the rest. A row's score
// is its last-update stamp (recency), its update count (frequency) or the caller's score for its
// key (custom: the last of duplicate keys wins; a row without a score ranks below every scored
// one, at -inf). Higher scores rank first, ties go to the smaller key, so every row has a
// distinct rank and exactly min(num_reserved, size) rows stay, whatever the ties and whatever
// order a backend lists its rows in.
#ifndef DUALEMB_SEMANTICS_RESTRICT_RANKING_H_
#define DUALEMB_SEMANTICS_RESTRICT_RANKING_H_

#include <algorithm>
#include <cstdint>
#include <limits>
#include <unordered_map>
#include <vector>

#include "../storage/storage.h"

namespace dualemb {

// One row's place in a restrict ranking.
struct Ranked {
  double score;
  int64_t key;
};

inline bool ranks_before(const Ranked& a, const Ranked& b) {
  return a.score > b.score || (a.score == b.score && a.key < b.key);
}

// A row's restrict score from its metadata. Builds the custom scores' map (allocates) up front.
class RestrictScorer {
 public:
  RestrictScorer(RestrictBy by, const int64_t* keys, const float* scores, int64_t n) : by_(by) {
    if (by != RestrictBy::kCustom) return;
    custom_.reserve(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) custom_[keys[i]] = scores[i];  // the last of duplicates wins
  }
  double operator()(int64_t key, int64_t last_update, uint32_t count) const {
    switch (by_) {
      case RestrictBy::kRecency: return static_cast<double>(last_update);
      case RestrictBy::kFrequency: return static_cast<double>(count);
      case RestrictBy::kCustom: {
        auto it = custom_.find(key);
        return it == custom_.end() ? -std::numeric_limits<double>::infinity() : it->second;
      }
    }
    return 0.0;
  }
  Ranked rank(int64_t key, int64_t last_update, uint32_t count) const {
    return Ranked{(*this)(key, last_update, count), key};
  }

 private:
  RestrictBy by_;
  std::unordered_map<int64_t, float> custom_;
};

// The boundary of a restrict: a row is kept iff keeps(its rank). Deciding per row against one
// boundary lets a backend erase while it walks its rows, without a list of keys to erase.
class RestrictCut {
 public:
  // From every row's rank (reordered here); num_reserved < all.size() (else nothing is erased
  // and no cut is needed).
  RestrictCut(std::vector<Ranked>& all, int64_t num_reserved) : keep_none_(num_reserved == 0) {
    if (keep_none_) return;
    std::nth_element(all.begin(), all.begin() + (num_reserved - 1), all.end(), ranks_before);
    kth_ = all[static_cast<size_t>(num_reserved - 1)];
  }
  bool keeps(const Ranked& r) const { return !keep_none_ && !ranks_before(kth_, r); }
  // Whether no row is kept (num_reserved 0): a caller may skip ranking the rows.
  bool keeps_none() const { return keep_none_; }

 private:
  bool keep_none_;
  Ranked kth_{0.0, 0};  // the num_reserved-th best rank
};

}  // namespace dualemb

#endif  // DUALEMB_SEMANTICS_RESTRICT_RANKING_H_
