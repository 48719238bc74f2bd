// C ABI tests of string keys (DE_KEY_STRING), run under ASan + UBSan by tests/core/test_sanitizers.py.
// Forced collisions: de_testing_string_id_bits(1) leaves two base ids, so most strings probe.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "dualemb_core.h"

extern int g_string_failures;
int g_string_failures = 0;
#define SCHECK(cond) DE_TEST_CHECK(g_string_failures, cond)

namespace {

struct Packed {
  std::string bytes;
  std::vector<int64_t> offsets{0};
  de_string_keys view() const { return {bytes.data(), offsets.data()}; }
  void add(const std::string& s) {
    bytes += s;
    offsets.push_back(static_cast<int64_t>(bytes.size()));
  }
  int64_t n() const { return static_cast<int64_t>(offsets.size()) - 1; }
};

void run_with_id_bits(int bits) {
  SCHECK(de_testing_string_id_bits(bits) == 0);
  int64_t id = 0;
  SCHECK(de_table_create(0, R"({"dim": 2, "key_dtype": "string", "initializer": "normal", "seed": 3})", &id) == 0);
  Packed k;
  const std::string nul("a\0b", 3);
  for (const std::string& s : {std::string(""), nul, std::string("a"), std::string("\xc3\xa9"),
                               std::string(100, 'z'), std::string("q")})
    k.add(s);
  de_string_keys kv = k.view();
  std::vector<float> vals(k.n() * 2), init(k.n() * 2);
  std::vector<uint8_t> ex(k.n());
  SCHECK(de_find(id, DE_KEY_STRING, &kv, k.n(), vals.data(), ex.data()) == 0);
  SCHECK(de_initial_values(id, DE_KEY_STRING, &kv, k.n(), init.data()) == 0);
  SCHECK(vals == init);
  int64_t entries = -1, key_bytes = -1;
  SCHECK(de_string_keys_stats(id, &entries, &key_bytes) == 0 && entries == 0);
  std::vector<float> rows(k.n() * 2);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<float>(i);
  SCHECK(de_insert_or_assign(id, DE_KEY_STRING, &kv, k.n(), rows.data(), nullptr) == 0);
  SCHECK(de_find(id, DE_KEY_STRING, &kv, k.n(), vals.data(), ex.data()) == 0);
  SCHECK(vals == rows);
  for (auto e : ex) SCHECK(e == 1);
  SCHECK(de_string_keys_stats(id, &entries, &key_bytes) == 0 && entries == 6 && key_bytes == 107);

  // Export with a 4-byte key buffer: pages stop before a key that does not fit.
  std::vector<char> buf(4);
  std::vector<int64_t> offs(k.n() + 1);
  std::vector<float> out(k.n() * 2);
  de_string_keys_out o{buf.data(), 4, offs.data(), 0};
  int64_t got = -1, total = 0, offset = 0;
  std::string seen;
  while (offset < 6) {
    SCHECK(de_export(id, offset, 6, DE_KEY_STRING, &o, out.data(), nullptr, 0, nullptr, nullptr, nullptr, &got) == 0);
    if (got == 0) {
      SCHECK(o.needed > static_cast<int64_t>(buf.size()));
      buf.resize(o.needed);
      o = {buf.data(), static_cast<int64_t>(buf.size()), offs.data(), 0};
      continue;
    }
    for (int64_t i = 0; i < got; ++i) seen += std::string(buf.data() + offs[i], offs[i + 1] - offs[i]) + "|";
    total += got;
    offset += got;
  }
  SCHECK(total == 6 && seen.size() == 107 + 6);

  // Erase, wrong dtypes, bad offsets.
  Packed e;
  e.add(nul);
  e.add("never");
  de_string_keys ev = e.view();
  SCHECK(de_erase(id, DE_KEY_STRING, &ev, 2) == 0);
  int64_t size = 0;
  SCHECK(de_size(id, &size) == 0 && size == 5);
  int64_t ik = 1;
  SCHECK(de_find(id, DE_KEY_INT64, &ik, 1, vals.data(), nullptr) == -1);
  SCHECK(std::strstr(de_last_error(), "string") != nullptr);
  int64_t bad_offsets[3] = {0, 2, 1};
  de_string_keys bad{"ab", bad_offsets};
  SCHECK(de_insert_or_assign(id, DE_KEY_STRING, &bad, 2, rows.data(), nullptr) == -1);
  SCHECK(de_size(id, &size) == 0 && size == 5);
  SCHECK(de_clear(id) == 0);
  SCHECK(de_string_keys_stats(id, &entries, &key_bytes) == 0 && entries == 0 && key_bytes == 0);
  SCHECK(de_table_destroy(id) == 0);
  SCHECK(de_testing_string_id_bits(63) == 0);
}

}  // namespace

int run_string_key_tests() {
  run_with_id_bits(63);
  run_with_id_bits(1);
  int64_t id = 0;
  SCHECK(de_table_create(0, R"({"dim": 2})", &id) == 0);
  Packed k;
  k.add("a");
  de_string_keys kv = k.view();
  float v[2];
  SCHECK(de_find(id, DE_KEY_STRING, &kv, 1, v, nullptr) == -1);  // an int64 table
  SCHECK(de_table_destroy(id) == 0);
  return g_string_failures;
}
