// RowStore's chunks in slabs (row_store.h, memory_block.h): rows keep their values across slab
// boundaries, erasures, clear_keeping and copies (checked against a plain vector of the same
// rows); slabs sit on huge-page boundaries; a slab whose chunks are all in use is marked for huge
// pages and a partly used one is not (the kernel's THPeligible flag of its mapping, where the
// kernel offers transparent huge pages); bytes() follows the rows in use, not the slabs mapped.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "row_store.h"

static int g_row_store_failures = 0;
#define RCHECK(cond) DE_TEST_CHECK(g_row_store_failures, cond)

namespace {

using dualemb::RowStore;
constexpr int64_t kWidth = 8;  // float32: 56-byte rows padded to 64
constexpr int64_t kShift = 12;  // 4,096 rows = 256 KiB a chunk, 8 chunks a slab
constexpr int64_t kRowsPerSlab = int64_t(8) << kShift;

float value_of(int64_t key, int j) {
  return static_cast<float>(key) * 16.0f + static_cast<float>(j);
}

void write_row(RowStore& rs, int64_t i, int64_t key) {
  rs.meta(i) = dualemb::RowMeta{key, key + 1, 1, 0};
  for (int j = 0; j < kWidth; ++j) rs.row_as<float>(i)[j] = value_of(key, j);
}

// Every row i holds keys[i] and its values.
bool holds(const RowStore& rs, const std::vector<int64_t>& keys) {
  if (rs.size() != static_cast<int64_t>(keys.size())) return false;
  for (int64_t i = 0; i < rs.size(); ++i) {
    if (rs.meta(i).key != keys[i] || rs.meta(i).last_update != keys[i] + 1) return false;
    const float* v = reinterpret_cast<const float*>(rs.row(i));
    for (int j = 0; j < kWidth; ++j)
      if (v[j] != value_of(keys[i], j)) return false;
  }
  return true;
}

// The THPeligible flag of the mapping holding p: 1 or 0, -1 where smaps does not say.
int thp_eligible(const void* p) {
  std::ifstream f("/proc/self/smaps");
  std::string line;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  while (std::getline(f, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2 && line.find(':') > line.find('-')) {
      inside = a >= lo && a < hi;
    } else if (inside && line.rfind("THPeligible:", 0) == 0) {
      return std::stoi(line.substr(12));
    }
  }
  return -1;
}

bool thp_offered() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return !s.empty() && s.find("[never]") == std::string::npos;
}

bool thp_always() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string s;
  std::getline(f, s);
  return s.find("[always]") != std::string::npos;
}

void test_rows_across_slabs() {
  RowStore rs(kWidth, sizeof(float), kShift);
  RCHECK(rs.stride() == 64);
  std::vector<int64_t> keys;
  const int64_t n = 3 * kRowsPerSlab + 5000;  // three full slabs and part of a fourth
  for (int64_t k = 0; k < n; ++k) {
    write_row(rs, rs.push_back(), 1000 + k);
    keys.push_back(1000 + k);
  }
  RCHECK(holds(rs, keys));
  const unsigned char* first = rs.row(0) - sizeof(dualemb::RowMeta);
  RCHECK(reinterpret_cast<uintptr_t>(first) % dualemb::kHugePageBytes == 0);
  // Rows in use, rounded to pages, plus whole huge pages for the full slabs: not 4 whole slabs.
  RCHECK(rs.bytes() >= static_cast<size_t>(n) * 64);
  RCHECK(rs.bytes() < static_cast<size_t>(n) * 64 + (size_t(1) << 20));
  if (thp_offered()) {
    RCHECK(thp_eligible(rs.row(0)) == 1);                    // a full slab
    RCHECK(thp_eligible(rs.row(n - 1)) == 0);                // the partly used last one
    RCHECK(thp_eligible(rs.row(2 * kRowsPerSlab + 7)) == 1);
  } else {
    std::printf("row_store_tests: THP not offered by this kernel, huge-page marks not checked\n");
  }

  // Erase rows at random positions (the last row moves into the hole), mirrored on the vector,
  // down into the second slab: the dropped slabs are freed, the rows that stay are intact.
  std::mt19937_64 rng(7);
  while (static_cast<int64_t>(keys.size()) > kRowsPerSlab + 3000) {
    const int64_t i = static_cast<int64_t>(rng() % keys.size());
    keys[i] = keys.back();
    keys.pop_back();
    rs.move_last_into(i);
  }
  RCHECK(holds(rs, keys));
  RCHECK(rs.capacity() <=
         (rs.size() >> kShift) * (int64_t(1) << kShift) + 2 * (int64_t(1) << kShift));
  if (thp_offered()) {
    RCHECK(thp_eligible(rs.row(0)) == 1);  // the first slab is still full
    RCHECK(thp_eligible(rs.row(rs.size() - 1)) == 0);  // the second gave its tail back
  }

  // Grow again over the slab boundary (reusing the kept slab, then new ones), copy, refill.
  for (int64_t k = 0; k < 2 * kRowsPerSlab; ++k) {
    write_row(rs, rs.push_back(), 5000000 + k);
    keys.push_back(5000000 + k);
  }
  RCHECK(holds(rs, keys));
  RowStore copy(rs);
  RCHECK(holds(copy, keys));
  RCHECK(reinterpret_cast<uintptr_t>(copy.row(0) - sizeof(dualemb::RowMeta)) %
             dualemb::kHugePageBytes ==
         0);
  rs.clear_keeping(kRowsPerSlab + 10);
  RCHECK(rs.size() == 0 && rs.capacity() >= kRowsPerSlab + 10);
  std::vector<int64_t> refill;
  for (int64_t k = 0; k < kRowsPerSlab + 10; ++k) {
    write_row(rs, rs.push_back(), -k);
    refill.push_back(-k);
  }
  RCHECK(holds(rs, refill));
  RCHECK(holds(copy, keys));  // the copy owns its memory
  rs.clear();
  RCHECK(rs.size() == 0 && rs.capacity() == 0);
}

// A chunk too large for a slab gets a block of its own (huge rows: dim 40,000 float32).
void test_rows_larger_than_a_slab() {
  RowStore rs(40000, sizeof(float), 4);
  for (int64_t k = 0; k < 40; ++k) {
    const int64_t i = rs.push_back();
    rs.meta(i) = dualemb::RowMeta{k, 0, 0, 0};
    rs.row_as<float>(i)[39999] = static_cast<float>(k);
  }
  bool ok = true;
  for (int64_t i = 0; i < 40; ++i)
    ok = ok && rs.meta(i).key == i && rs.row_as<float>(i)[39999] == i;
  RCHECK(ok);
  RowStore copy(rs);
  RCHECK(copy.meta(39).key == 39 && copy.row_as<float>(39)[39999] == 39.0f);
}

// A block of whole huge pages (an index array of 2 MiB or more) is aligned and marked for them;
// another size is not.
void test_huge_page_blocks() {
  dualemb::Block whole(2 * dualemb::kHugePageBytes), other(dualemb::kHugePageBytes + 4096);
  RCHECK(reinterpret_cast<uintptr_t>(whole.data()) % dualemb::kHugePageBytes == 0);
  std::memset(whole.data(), 1, 2 * dualemb::kHugePageBytes);
  std::memset(other.data(), 1, dualemb::kHugePageBytes + 4096);
  if (thp_offered()) {
    RCHECK(thp_eligible(whole.data()) == 1);
    RCHECK(thp_eligible(whole.data() + 2 * dualemb::kHugePageBytes - 1) == 1);
    RCHECK(thp_eligible(other.data()) == 0 || thp_always());
  }
}

}  // namespace

int run_row_store_tests() {
  test_huge_page_blocks();
  test_rows_across_slabs();
  test_rows_larger_than_a_slab();
  return g_row_store_failures;
}
