// bucket_math_tests.cc — the GPU table's probe and duplicate-summing logic on the CPU
// (bucket_math.h), against std::unordered_map and against the CPU table's summing rule.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <unordered_map>
#include <vector>

#include "../bucket_math.h"

namespace g = dualemb::gpu;

#define BCHECK(cond)                                                                \
  do {                                                                              \
    ++*checks;                                                                      \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      ++*failures;                                                                  \
    }                                                                               \
  } while (0)

static void probe_tests(int* checks, int* failures) {
  // Fill to load 1.0 (every slot), with keys that collide on purpose (multiples of a power of
  // two share low hash bits only by chance; include int64 extremes too).
  for (uint64_t buckets : {1ull, 4ull, 64ull}) {
    const int64_t cap = static_cast<int64_t>(buckets) * g::kBucketSlots;
    std::vector<int64_t> keys(cap, 0);
    std::vector<int32_t> occ(cap, g::kEmpty);
    std::unordered_map<int64_t, int64_t> ref;
    std::mt19937_64 rng(buckets);
    std::vector<int64_t> inserted;
    while (static_cast<int64_t>(inserted.size()) < cap) {
      int64_t k = static_cast<int64_t>(rng());
      if (inserted.size() == 0) k = INT64_MIN;
      if (inserted.size() == 1) k = INT64_MAX;
      if (inserted.size() == 2) k = 0;
      if (ref.count(k)) continue;
      BCHECK(g::probe_find(keys.data(), occ.data(), buckets, k) == -1);
      const int64_t s = g::probe_insert_serial(keys.data(), occ.data(), buckets, k);
      BCHECK(s >= 0);
      ref[k] = s;
      inserted.push_back(k);
    }
    // Full: one more insert fails, every key is found at its slot.
    BCHECK(g::probe_insert_serial(keys.data(), occ.data(), buckets, 12345678912345ll) == -1 ||
           ref.count(12345678912345ll));
    for (int64_t k : inserted) BCHECK(g::probe_find(keys.data(), occ.data(), buckets, k) == ref[k]);
    // Erase every third key (tombstones): the others are still found past them, erased ones not;
    // a re-insert reuses a tombstone.
    for (size_t i = 0; i < inserted.size(); i += 3) occ[ref[inserted[i]]] = g::kTombstone;
    for (size_t i = 0; i < inserted.size(); ++i) {
      const int64_t s = g::probe_find(keys.data(), occ.data(), buckets, inserted[i]);
      BCHECK(i % 3 == 0 ? s == -1 : s == ref[inserted[i]]);
    }
    const int64_t s = g::probe_insert_serial(keys.data(), occ.data(), buckets, inserted[0]);
    BCHECK(s >= 0 && occ[s] == g::kFull);
    BCHECK(g::probe_find(keys.data(), occ.data(), buckets, inserted[0]) == s);
  }
  BCHECK(g::buckets_for(0, 0.75) == 1);
  BCHECK(g::buckets_for(16, 1.0) == 1 && g::buckets_for(17, 1.0) == 2);
  BCHECK(g::buckets_for(1000, 0.5) == 128);
}

// The CPU table's rule: a copy of the first occurrence's gradient, then += each later one in
// batch order. Sorting positions stably by key and summing segments must give the same bits.
static void segment_tests(int* checks, int* failures) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  const int64_t n = 500, dim = 5;
  std::vector<int64_t> ids(n);
  for (auto& k : ids) k = static_cast<int64_t>(rng() % 37) - 18;
  std::vector<float> grads(n * dim);
  for (auto& x : grads) x = nd(rng) * (rng() % 2 ? 1e-4f : 1e4f);  // order-sensitive sums
  std::unordered_map<int64_t, std::vector<float>> cpu;
  for (int64_t p = 0; p < n; ++p) {
    auto it = cpu.find(ids[p]);
    if (it == cpu.end()) {
      cpu[ids[p]] = std::vector<float>(grads.begin() + p * dim, grads.begin() + (p + 1) * dim);
    } else {
      for (int64_t j = 0; j < dim; ++j) it->second[j] += grads[p * dim + j];
    }
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int64_t> sorted(n);
  for (int64_t q = 0; q < n; ++q) sorted[q] = ids[order[q]];
  int64_t segments = 0;
  for (int64_t q = 0; q < n;) {
    BCHECK(g::starts_segment(sorted.data(), q));
    int64_t e = q + 1;
    while (e < n && !g::starts_segment(sorted.data(), e)) ++e;
    for (int64_t j = 0; j < dim; ++j) {
      const float s = g::segment_sum(order.data(), q, e, grads.data(), dim, j);
      BCHECK(std::memcmp(&s, &cpu[sorted[q]][j], 4) == 0);
    }
    ++segments;
    q = e;
  }
  BCHECK(segments == static_cast<int64_t>(cpu.size()));
}

// accum: the per-key segment walk (accum_inserts, accum_segment) against the CPU table's loop —
// every position in batch order against a map of present rows, applying accum_action — on a
// batch with repeated keys, present and absent keys and exists flags of both kinds.
static void accum_tests(int* checks, int* failures) {
  const int64_t n = 3000, dim = 3;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  std::vector<int64_t> ids(n);
  std::vector<uint8_t> exists(n);
  std::vector<float> deltas(n * dim), old(n * dim);
  for (int64_t i = 0; i < n; ++i) {
    ids[i] = static_cast<int64_t>(rng() % 300);
    exists[i] = rng() % 2;
  }
  for (auto& d : deltas) d = u(rng);
  for (auto& d : old) d = u(rng);
  for (const float* o :
       {static_cast<const float*>(nullptr), static_cast<const float*>(old.data())}) {
    // Keys 0..149 are present before the call with a known row.
    std::unordered_map<int64_t, std::vector<float>> cpu;
    std::unordered_map<int64_t, int64_t> applied;
    for (int64_t k = 0; k < 150; ++k) cpu[k] = std::vector<float>(dim, 0.5f * k);
    const auto initial = cpu;
    for (int64_t i = 0; i < n; ++i) {  // table.cc's accum_impl, one position after another
      auto it = cpu.find(ids[i]);
      switch (dualemb::accum_action(it != cpu.end(), exists[i] != 0)) {
        case dualemb::AccumAction::kInsert:
          cpu[ids[i]] =
              std::vector<float>(deltas.begin() + i * dim, deltas.begin() + (i + 1) * dim);
          ++applied[ids[i]];
          break;
        case dualemb::AccumAction::kAdd:
          for (int64_t j = 0; j < dim; ++j) {
            float d = deltas[i * dim + j];
            if (o) d = d - o[i * dim + j];
            it->second[j] += d;
          }
          ++applied[ids[i]];
          break;
        case dualemb::AccumAction::kIgnore: break;
      }
    }
    std::vector<int64_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    std::vector<int64_t> sorted(n);
    for (int64_t q = 0; q < n; ++q) sorted[q] = ids[order[q]];
    int64_t kept = 0;
    for (int64_t q = 0; q < n;) {
      int64_t e = q + 1;
      while (e < n && !g::starts_segment(sorted.data(), e)) ++e;
      const int64_t key = sorted[q];
      const bool present = initial.count(key) != 0;
      const bool inserted = !present && g::accum_inserts(order.data(), q, e, exists.data());
      BCHECK((present || inserted) == (cpu.count(key) != 0));
      if (present || inserted) {
        ++kept;
        for (int64_t j = 0; j < dim; ++j) {
          float cell = present ? initial.at(key)[j] : 12345.0f;  // an insert overwrites it
          const int64_t a = g::accum_segment(order.data(), q, e, exists.data(), deltas.data(), o,
                                             dim, j, present, &cell);
          BCHECK(std::memcmp(&cell, &cpu[key][j], 4) == 0);
          BCHECK(a == applied[key]);
        }
      }
      q = e;
    }
    int64_t untouched = 0;  // present keys the batch does not name: no segment of theirs
    for (int64_t k = 0; k < 150; ++k)
      untouched += std::find(ids.begin(), ids.end(), k) == ids.end();
    BCHECK(kept + untouched == static_cast<int64_t>(cpu.size()));
  }
}

void run_bucket_math_tests(int* checks, int* failures) {
  probe_tests(checks, failures);
  segment_tests(checks, failures);
  accum_tests(checks, failures);
}
