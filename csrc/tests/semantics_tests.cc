// Tests of the shared per-row rules in csrc/core/semantics/ (header-only, so tested directly),
// each against a plain reference written here: restrict's cut against sorting every row, the
// duplicate sums against adding gradients one by one in batch order. Every backend builds its
// loops from these rules, so a mistake here would be the same mistake everywhere.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <vector>

#include "check.h"
#include "hash.h"
#include "semantics/duplicates.h"
#include "semantics/restrict_ranking.h"
#include "semantics/row_updates.h"

extern int g_semantics_failures;
int g_semantics_failures = 0;
#define XCHECK(cond) DE_TEST_CHECK(g_semantics_failures, cond)

namespace {

using dualemb::Ranked;

// The reference: sort by (score descending, key ascending), keep the first num_reserved.
std::vector<int64_t> kept_by_sorting(std::vector<Ranked> all, int64_t num_reserved) {
  std::sort(all.begin(), all.end(), [](const Ranked& a, const Ranked& b) {
    return a.score != b.score ? a.score > b.score : a.key < b.key;
  });
  std::vector<int64_t> kept;
  for (int64_t i = 0; i < std::min<int64_t>(num_reserved, all.size()); ++i)
    kept.push_back(all[i].key);
  std::sort(kept.begin(), kept.end());
  return kept;
}

void restrict_cut_keeps_the_best() {
  std::mt19937_64 rng(7);
  const double inf = std::numeric_limits<double>::infinity();
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + static_cast<int>(rng() % 40);
    std::vector<Ranked> rows;
    for (int i = 0; i < n; ++i) {
      // Few distinct scores (many ties), infinities and extreme keys included.
      const int pick = static_cast<int>(rng() % 6);
      const double score = pick == 0 ? inf : pick == 1 ? -inf : static_cast<double>(pick);
      const int64_t key = i == 0 ? std::numeric_limits<int64_t>::min()
                                 : static_cast<int64_t>(rng() % 1000) * 1000 + i;  // distinct
      rows.push_back({score, key});
    }
    for (int64_t reserved = 0; reserved < n; ++reserved) {
      std::vector<Ranked> work = rows;
      const dualemb::RestrictCut cut(work, reserved);
      std::vector<int64_t> kept;
      for (const Ranked& r : rows)
        if (cut.keeps(r)) kept.push_back(r.key);
      std::sort(kept.begin(), kept.end());
      XCHECK(kept == kept_by_sorting(rows, reserved));
    }
  }
}

void restrict_scorer_reads_the_policy() {
  using dualemb::RestrictBy;
  const dualemb::RestrictScorer recency(RestrictBy::kRecency, nullptr, nullptr, 0);
  const dualemb::RestrictScorer frequency(RestrictBy::kFrequency, nullptr, nullptr, 0);
  XCHECK(recency(5, 17, 3) == 17.0);
  XCHECK(frequency(5, 17, 3) == 3.0);
  const int64_t keys[] = {5, 6, 5};
  const float scores[] = {1.5f, -2.0f, 0.25f};
  const dualemb::RestrictScorer custom(RestrictBy::kCustom, keys, scores, 3);
  XCHECK(custom(5, 17, 3) == 0.25);  // the last of duplicate keys wins
  XCHECK(custom(6, 0, 0) == -2.0);
  XCHECK(custom(7, 99, 99) == -std::numeric_limits<double>::infinity());  // unscored
}

void duplicates_sum_in_batch_order() {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1e3f, 1e3f);
  const int64_t n = 500, dim = 3;
  std::vector<int64_t> keys(n);
  std::vector<float> grads(n * dim);
  for (int64_t i = 0; i < n; ++i) keys[i] = static_cast<int64_t>(rng() % 37) - 18;
  for (float& g : grads) g = u(rng) * (rng() % 2 ? 1e-4f : 1.0f);  // magnitudes that round
  // Reference: a std::map of running sums, first occurrence copied, then added in order.
  std::map<int64_t, std::vector<float>> want;
  std::vector<int64_t> first_order;
  for (int64_t i = 0; i < n; ++i) {
    auto it = want.find(keys[i]);
    if (it == want.end()) {
      want[keys[i]] = std::vector<float>(grads.begin() + i * dim, grads.begin() + (i + 1) * dim);
      first_order.push_back(keys[i]);
    } else {
      for (int64_t j = 0; j < dim; ++j) it->second[j] = it->second[j] + grads[i * dim + j];
    }
  }
  // DedupMap gives dense indexes in first-occurrence order.
  dualemb::DedupMap map(n);
  map.init();
  std::vector<int64_t> group(n);
  int64_t groups = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool fresh = false;
    group[i] = map.get(keys[i], dualemb::hash_key(keys[i]), groups, &fresh);
    if (fresh) {
      XCHECK(first_order[groups] == keys[i]);
      ++groups;
    }
  }
  XCHECK(groups == static_cast<int64_t>(want.size()));
  std::vector<float> sums(groups * dim);
  dualemb::sum_gradients_by_group(
      n, grads.data(), dim, [&](int64_t i) { return group[i]; }, groups, sums.data());
  for (int64_t g = 0; g < groups; ++g)
    XCHECK(std::memcmp(sums.data() + g * dim, want[first_order[g]].data(),
                       sizeof(float) * dim) == 0);  // bit for bit
}

// One DedupMap kept across batches of different sizes (as the table's step scratch keeps it):
// every batch gets the first-occurrence indexes a fresh std::map gives, whatever earlier batches
// left in its slots (emptied by generation, not cleared).
void dedup_map_reused_across_batches() {
  std::mt19937_64 rng(7);
  dualemb::DedupMap map;
  for (int64_t n : {1000, 10, 3000, 1, 0, 500, 2999}) {
    map.reserve(n);
    map.init();
    std::map<int64_t, int64_t> want;
    int64_t groups = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t key = static_cast<int64_t>(rng() % 700);  // repeats within a batch
      bool fresh = false;
      const int64_t got = map.get(key, dualemb::hash_key(key), groups, &fresh);
      auto it = want.find(key);
      XCHECK(fresh == (it == want.end()));
      if (fresh) {
        want[key] = groups;
        XCHECK(got == groups);
        ++groups;
      } else {
        XCHECK(got == it->second);
      }
    }
    XCHECK(groups == static_cast<int64_t>(want.size()));
  }
}

void row_rules() {
  using dualemb::AccumAction;
  XCHECK(dualemb::accum_action(false, false) == AccumAction::kInsert);
  XCHECK(dualemb::accum_action(true, true) == AccumAction::kAdd);
  XCHECK(dualemb::accum_action(true, false) == AccumAction::kIgnore);
  XCHECK(dualemb::accum_action(false, true) == AccumAction::kIgnore);
  uint32_t c = UINT32_MAX - 1;
  dualemb::bump_count(c);
  dualemb::bump_count(c);
  XCHECK(c == UINT32_MAX);  // saturates
  XCHECK(dualemb::imported_count(-5) == 0);
  XCHECK(dualemb::imported_count(int64_t{1} << 40) == UINT32_MAX);
  const int64_t stamps[] = {3, 41, 7};
  XCHECK(dualemb::clock_after_import(10, stamps, 3) == 42);
  XCHECK(dualemb::clock_after_import(50, stamps, 3) == 50);
  bool threw = false;
  try {
    dualemb::check_slot_count(1, 2);
  } catch (const std::invalid_argument&) {
    threw = true;
  }
  XCHECK(threw);
  dualemb::check_slot_count(-1, 2);  // no slots buffer: nothing to check
}

}  // namespace

int run_semantics_tests() {
  restrict_cut_keeps_the_best();
  restrict_scorer_reads_the_policy();
  duplicates_sum_in_batch_order();
  dedup_map_reused_across_batches();
  row_rules();
  return g_semantics_failures;
}
