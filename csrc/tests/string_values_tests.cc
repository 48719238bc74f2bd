// C ABI tests of string values (DE_VALUE_STRING), run under ASan + UBSan by
// tests/core/test_sanitizers.py: the pool's handles are freed and reused across writes, erase,
// restrict and capacity evictions, so a stale handle would read freed memory here.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "dualemb_core.h"

namespace {

int g_fail = 0;
#define VCHECK(cond) DE_TEST_CHECK(g_fail, cond)

struct In {
  std::string bytes;
  std::vector<int64_t> offsets{0};
  void add(const std::string& s) {
    bytes += s;
    offsets.push_back(static_cast<int64_t>(bytes.size()));
  }
  de_string_values view() const { return {bytes.data(), offsets.data()}; }
};

struct Out {
  std::string bytes;
  std::vector<int64_t> offsets;
  bool refuse = false;
  de_string_values_out out{};
  explicit Out(int64_t elements) : offsets(static_cast<size_t>(elements) + 1) {
    out = {&Out::reserve, this, offsets.data()};
  }
  static char* reserve(void* self, int64_t total) {
    Out* me = static_cast<Out*>(self);
    if (me->refuse && total > 0) return nullptr;
    me->bytes.resize(static_cast<size_t>(total));
    return &me->bytes[0];
  }
  std::string at(int64_t e) const {
    return bytes.substr(static_cast<size_t>(offsets[e]), static_cast<size_t>(offsets[e + 1] - offsets[e]));
  }
};

const std::string kNul("a\0b", 3);

void basic() {
  int64_t id = 0;
  VCHECK(de_table_create(0, R"({"dim": 2, "value_dtype": "string", "initializer": "vector",
                               "values": ["d0", "d1"]})", &id) == 0);
  int32_t vd = -1;
  VCHECK(de_value_dtype(id, &vd) == 0 && vd == DE_VALUE_STRING);
  int64_t keys[3] = {5, 6, 5};
  In in;
  for (const std::string& s : {std::string(""), kNul, std::string(300, 'x'), std::string("\xff"),
                               std::string("last"), std::string("wins")})
    in.add(s);
  de_string_values v = in.view();
  VCHECK(de_insert_or_assign(id, DE_KEY_INT64, keys, 3, &v, nullptr) == 0);
  int64_t probe[3] = {5, 6, 7};
  Out o(6);
  uint8_t ex[3];
  VCHECK(de_find(id, DE_KEY_INT64, probe, 3, &o.out, ex) == 0);
  VCHECK(o.at(0) == "last" && o.at(1) == "wins");  // the last of a repeated key
  VCHECK(o.at(2) == std::string(300, 'x') && o.at(3) == "\xff");
  VCHECK(o.at(4) == "d0" && o.at(5) == "d1" && ex[0] && ex[1] && !ex[2]);
  // A reserve that fails is an out-of-memory error.
  Out refused(2);
  refused.refuse = true;
  VCHECK(de_find(id, DE_KEY_INT64, probe, 1, &refused.out, nullptr) != 0 &&
         de_last_error_kind() == DE_ERROR_NO_MEMORY);
  // Bad input, and the refused operations, leave the table unchanged.
  std::vector<int64_t> bad_offs = {0, 3, 1, 4, 4};
  de_string_values bad{"abcd", bad_offs.data()};
  VCHECK(de_insert_or_assign(id, DE_KEY_INT64, probe, 2, &bad, nullptr) != 0);
  VCHECK(std::strstr(de_last_error(), "offsets decrease") != nullptr);
  uint8_t yes[1] = {1};
  VCHECK(de_accum(id, DE_KEY_INT64, probe, 1, &v, yes, nullptr) != 0);
  VCHECK(std::strstr(de_last_error(), "accum is not defined for a table of value dtype string"));
  float g[2] = {1, 1};
  VCHECK(de_apply_gradients(id, DE_KEY_INT64, probe, 1, g, 0.1f, 1, nullptr) != 0);
  VCHECK(de_set_optimizer(id, R"({"name": "sgd"})") != 0);
  VCHECK(std::strstr(de_last_error(), "value dtype string cannot be trained"));
  int64_t size = 0;
  VCHECK(de_size(id, &size) == 0 && size == 2);
  Out again(4);
  VCHECK(de_find(id, DE_KEY_INT64, probe, 2, &again.out, nullptr) == 0);
  VCHECK(again.at(0) == "last" && again.at(1) == "wins");
  // Export, erase, clear.
  int64_t ek[2] = {0, 0}, n = 0;
  Out eo(4);
  VCHECK(de_export(id, 0, 2, DE_KEY_INT64, ek, &eo.out, nullptr, 0, nullptr, nullptr, nullptr, &n) == 0);
  VCHECK(n == 2);
  for (int i = 0; i < 2; ++i)
    VCHECK(eo.at(2 * i) == (ek[i] == 5 ? "last" : std::string(300, 'x')));
  VCHECK(de_erase(id, DE_KEY_INT64, probe, 1) == 0);
  VCHECK(de_size(id, &size) == 0 && size == 1);
  VCHECK(de_clear(id) == 0);
  VCHECK(de_size(id, &size) == 0 && size == 0);
  VCHECK(de_table_destroy(id) == 0);
  // String keys with string values do not exist.
  VCHECK(de_table_create(0, R"({"dim": 1, "key_dtype": "string", "value_dtype": "string"})", &id) != 0);
}

void churn() {
  // Many overwrites, erases, restricts and evictions: every handle freed must be unreachable.
  int64_t id = 0;
  VCHECK(de_table_create(0, R"({"dim": 3, "value_dtype": "string", "capacity": 40})", &id) == 0);
  for (int round = 0; round < 200; ++round) {
    std::vector<int64_t> keys;
    In in;
    for (int i = 0; i < 25; ++i) {
      keys.push_back((round * 7 + i) % 90);
      for (int j = 0; j < 3; ++j) in.add(std::to_string(keys.back()) + std::string(40 + j, 'v'));
    }
    de_string_values v = in.view();
    VCHECK(de_insert_or_assign(id, DE_KEY_INT64, keys.data(), 25, &v, nullptr) == 0);
    if (round % 13 == 0) VCHECK(de_erase(id, DE_KEY_INT64, keys.data(), 5) == 0);
    if (round % 29 == 0) VCHECK(de_restrict(id, 10, DE_RESTRICT_RECENCY, DE_KEY_INT64, nullptr,
                                            nullptr, 0, nullptr) == 0);
    int64_t size = 0;
    VCHECK(de_size(id, &size) == 0);
    std::vector<int64_t> ek(static_cast<size_t>(size));
    Out o(size * 3);
    int64_t n = 0;
    VCHECK(de_export(id, 0, size, DE_KEY_INT64, ek.data(), &o.out, nullptr, 0, nullptr, nullptr, nullptr, &n) == 0);
    for (int64_t r = 0; r < n; ++r)
      for (int j = 0; j < 3; ++j)
        VCHECK(o.at(r * 3 + j) == std::to_string(ek[r]) + std::string(40 + j, 'v'));
  }
  VCHECK(de_table_destroy(id) == 0);
}

}  // namespace

int run_string_value_tests() {
  basic();
  churn();
  return g_fail;
}
