// C++ unit tests of libdualemb_core through its C ABI only (what every front end uses). Built
// with -DDUALEMB_BUILD_TESTS=ON, and with -DDUALEMB_SANITIZE=ON under ASan + UBSan
// (tests/core/test_sanitizers.py runs it that way).
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "dualemb_core.h"

static int g_failures = 0;
#define CHECK(cond) DE_TEST_CHECK(g_failures, cond)
#define OK(call) CHECK((call) == 0)

static int64_t make(const char* config) {
  int64_t id = 0;
  OK(de_table_create(0, config, &id));
  return id;
}

static void test_basic_ops() {
  int64_t id = make(R"({"dim": 4, "initializer": "constant", "value": 0.5})");
  std::vector<int64_t> keys = {1, 2, 3, 1000000007};
  std::vector<float> vals(16), out(16);
  for (int i = 0; i < 16; ++i) vals[i] = static_cast<float>(i);
  std::vector<uint8_t> exists(4);
  OK(de_find(id, DE_KEY_INT64, keys.data(), 4, out.data(), exists.data()));
  CHECK(out[0] == 0.5f && exists[0] == 0);
  OK(de_insert_or_assign(id, DE_KEY_INT64, keys.data(), 4, vals.data(), nullptr));
  OK(de_find(id, DE_KEY_INT64, keys.data(), 4, out.data(), exists.data()));
  CHECK(std::memcmp(out.data(), vals.data(), sizeof(float) * 16) == 0 && exists[3] == 1);
  int64_t n = 0;
  OK(de_size(id, &n));
  CHECK(n == 4);
  OK(de_erase(id, DE_KEY_INT64, keys.data(), 2));
  OK(de_size(id, &n));
  CHECK(n == 2);
  std::vector<int64_t> ek(8);
  std::vector<float> ev(32);
  OK(de_export(id, 0, 8, DE_KEY_INT64, ek.data(), ev.data(), nullptr, 0, nullptr, nullptr, nullptr, &n));
  CHECK(n == 2);
  // Bad input: wrong key dtype, unknown table, unknown optimizer.
  CHECK(de_find(id, DE_KEY_INT32, keys.data(), 4, out.data(), nullptr) == -1);
  CHECK(std::strstr(de_last_error(), "dtype") != nullptr);
  CHECK(de_find(12345, DE_KEY_INT64, keys.data(), 4, out.data(), nullptr) == -1);
  CHECK(std::strstr(de_last_error(), "unknown table id") != nullptr);
  CHECK(de_set_optimizer(id, R"({"name": "nope"})") == -1);
  CHECK(de_table_create(0, R"({"dim": 0})", &n) == -1);
  OK(de_table_destroy(id));
}

static void test_optimizer_step_and_restrict() {
  int64_t id = make(R"({"dim": 2})");
  OK(de_set_optimizer(id, R"({"name": "sgd", "flavor": "keras"})"));
  std::vector<int64_t> keys = {7, 7, 8};
  std::vector<float> grads = {1, 1, 2, 2, 4, 4};
  OK(de_apply_gradients(id, DE_KEY_INT64, keys.data(), 3, grads.data(), 0.5f, 1, nullptr));
  std::vector<float> out(4);
  OK(de_find(id, DE_KEY_INT64, keys.data() + 1, 2, out.data(), nullptr));
  CHECK(std::fabs(out[0] + 1.5f) < 1e-6 && std::fabs(out[2] + 2.0f) < 1e-6);  // summed dup grads
  int64_t removed = 0;
  OK(de_restrict(id, 1, DE_RESTRICT_FREQUENCY, DE_KEY_INT64, nullptr, nullptr, 0, &removed));
  CHECK(removed == 1);
  OK(de_table_destroy(id));
}

// Writers own disjoint key ranges (so the final content is known) while other threads read,
// export and churn a shared range.
static void test_concurrency() {
  int64_t id = make(R"({"dim": 8, "initializer": "normal", "seed": 3, "stddev": 0.1})");
  OK(de_set_optimizer(id, R"({"name": "adam", "flavor": "keras"})"));
  const int kWriters = 3;
  const int kRange = 4000;
  std::vector<std::map<int64_t, float>> model(kWriters);
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937_64 rng(w);
      for (int it = 0; it < 60; ++it) {
        std::vector<int64_t> keys(3000);
        std::vector<float> vals(3000 * 8);
        for (size_t i = 0; i < keys.size(); ++i) {
          keys[i] = 1000000 * (w + 1) + static_cast<int64_t>(rng() % kRange);
          float v = static_cast<float>(it * 10000 + i);
          for (int j = 0; j < 8; ++j) vals[i * 8 + j] = v;
          model[w][keys[i]] = v;
        }
        OK(de_insert_or_assign(id, DE_KEY_INT64, keys.data(), keys.size(), vals.data(), nullptr));
        std::vector<int64_t> gone(500);
        for (auto& k : gone) {
          k = 1000000 * (w + 1) + static_cast<int64_t>(rng() % kRange);
          model[w].erase(k);
        }
        OK(de_erase(id, DE_KEY_INT64, gone.data(), gone.size()));
      }
    });
  }
  threads.emplace_back([&] {  // shared range: gradients, accum, restrict of shared keys only
    std::mt19937_64 rng(99);
    while (!stop) {
      std::vector<int64_t> keys(4096);
      for (auto& k : keys) k = static_cast<int64_t>(rng() % 5000);
      std::vector<float> g(keys.size() * 8, 0.01f);
      std::vector<uint8_t> ex(keys.size(), 0);
      OK(de_apply_gradients(id, DE_KEY_INT64, keys.data(), keys.size(), g.data(), 0.1f, 1, nullptr));
      OK(de_accum(id, DE_KEY_INT64, keys.data(), keys.size(), g.data(), ex.data(), nullptr));
    }
  });
  threads.emplace_back([&] {  // readers and exporters
    std::vector<int64_t> keys(4096), ek(1000);
    std::vector<float> out(4096 * 8), ev(1000 * 8), es(1000 * 16);
    std::mt19937_64 rng(5);
    while (!stop) {
      for (auto& k : keys) k = static_cast<int64_t>(rng() % 4000000);
      OK(de_find(id, DE_KEY_INT64, keys.data(), keys.size(), out.data(), nullptr));
      int64_t n;
      OK(de_export(id, 0, 1000, DE_KEY_INT64, ek.data(), ev.data(), es.data(), 2, nullptr, nullptr, nullptr, &n));
    }
  });
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  stop = true;
  for (size_t t = kWriters; t < threads.size(); ++t) threads[t].join();
  // Drop the shared range; the writers' ranges must equal the model exactly.
  std::vector<int64_t> shared(5000);
  for (int i = 0; i < 5000; ++i) shared[i] = i;
  OK(de_erase(id, DE_KEY_INT64, shared.data(), shared.size()));
  int64_t size = 0;
  OK(de_size(id, &size));
  size_t expected = 0;
  for (auto& m : model) expected += m.size();
  CHECK(static_cast<size_t>(size) == expected);
  std::vector<int64_t> ek(size);
  std::vector<float> ev(size * 8);
  int64_t n = 0;
  OK(de_export(id, 0, size, DE_KEY_INT64, ek.data(), ev.data(), nullptr, 0, nullptr, nullptr, nullptr, &n));
  CHECK(n == size);
  for (int64_t i = 0; i < n; ++i) {
    int w = static_cast<int>(ek[i] / 1000000) - 1;
    CHECK(w >= 0 && w < kWriters && model[w].count(ek[i]) == 1);
    if (w >= 0 && w < kWriters && model[w].count(ek[i])) CHECK(ev[i * 8] == model[w][ek[i]]);
  }
  OK(de_table_destroy(id));
}

static std::string describe(int64_t id) {
  size_t needed = 0;
  OK(de_table_describe(id, nullptr, 0, &needed));
  std::string s(needed, '\0');
  OK(de_table_describe(id, s.data(), s.size(), &needed));
  s.resize(needed - 1);
  return s;
}

// The description echoes the spec with its JSON types (an int stays an int, [0.5] a list) in the
// canonical text Python's json.dumps(sort_keys=True, separators=(",", ":")) writes.
static void test_json_specs_round_trip() {
  int64_t id = make(R"({"values": [0.5], "dim": 3, "initializer": "vector", "capacity": 7})");
  OK(de_set_optimizer(id, R"({"name": "sgd", "flavor": "optax", "momentum": 0, "nesterov": true})"));
  CHECK(describe(id) ==
        R"({"config":{"capacity":7,"dim":3,"evict_policy":"recency","initializer":"vector",)"
        R"("key_dtype":"int64","value_dtype":"float32","values":[0.5]},"optimizer":{)"
        R"("flavor":"optax","momentum":0,"name":"sgd","nesterov":true}})");
  OK(de_table_destroy(id));
  id = make(R"({"dim": 1, "initializer": "normal", "seed": 18446744073709551615,
                "mean": 1e15, "stddev": 5e-324})");
  CHECK(describe(id) ==
        R"({"config":{"capacity":0,"dim":1,"evict_policy":"recency","initializer":"normal",)"
        R"("key_dtype":"int64","mean":1000000000000000.0,"seed":18446744073709551615,)"
        R"("stddev":5e-324,"value_dtype":"float32"},"optimizer":null})");
  OK(de_table_destroy(id));
  int64_t n = 0;
  CHECK(de_table_create(0, R"({"dim": 2, "dim": 3})", &n) == -1);
  CHECK(std::strstr(de_last_error(), "'dim' given twice") != nullptr);
  CHECK(de_table_create(0, R"({"dim": 2.5})", &n) == -1);
  CHECK(std::strstr(de_last_error(), "'dim' must be an integer") != nullptr);
  CHECK(de_table_create(0, R"({"dim": 2, "initializer": "zeros", "seed": 1})", &n) == -1);
  CHECK(de_table_create(0, "dim=2", &n) == -1);
}

// Every output pointer of every C ABI function: a required one that is NULL is an error naming
// it, an optional one (documented "may be NULL") is skipped; never a crash.
static void test_null_outputs() {
  int64_t id = make(R"({"dim": 2})");
  OK(de_set_optimizer(id, R"({"name": "adam", "flavor": "keras"})"));
  int64_t keys[3] = {1, 2, 3};
  float vals[6] = {1, 2, 3, 4, 5, 6};
  uint8_t ex[3] = {0, 0, 0};
  auto fails_naming = [](int rc, const char* name) {
    CHECK(rc == -1);
    CHECK(std::strstr(de_last_error(), name) != nullptr);
    CHECK(de_last_error_kind() == DE_ERROR_OTHER);
  };
  fails_naming(de_size(id, nullptr), "null");
  fails_naming(de_get_clock(id, nullptr), "null");
  fails_naming(de_evicted_total(id, nullptr), "null");
  fails_naming(de_memory_bytes(id, nullptr), "null");
  fails_naming(de_find(id, DE_KEY_INT64, keys, 3, nullptr, nullptr), "values");
  fails_naming(de_find_or_insert(id, DE_KEY_INT64, keys, 3, nullptr, nullptr, nullptr), "values");
  fails_naming(de_insert_or_assign(id, DE_KEY_INT64, keys, 3, nullptr, nullptr), "values");
  fails_naming(de_accum(id, DE_KEY_INT64, keys, 3, vals, nullptr, nullptr), "exists");
  fails_naming(de_accum(id, DE_KEY_INT64, keys, 3, nullptr, ex, nullptr), "deltas");
  fails_naming(de_apply_gradients(id, DE_KEY_INT64, keys, 3, nullptr, 0.1f, 1, nullptr), "grads");
  fails_naming(de_import(id, DE_KEY_INT64, keys, 3, nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr),
               "values");
  fails_naming(de_initial_values(id, DE_KEY_INT64, keys, 3, nullptr), "values");
  fails_naming(de_find(id, DE_KEY_INT64, nullptr, 3, vals, nullptr), "keys");
  fails_naming(de_restrict(id, 1, DE_RESTRICT_CUSTOM, DE_KEY_INT64, nullptr, vals, 3, nullptr), "keys");
  fails_naming(de_restrict(id, 1, DE_RESTRICT_CUSTOM, DE_KEY_INT64, keys, nullptr, 3, nullptr), "scores");
  fails_naming(de_table_create(0, R"({"dim": 2})", nullptr), "out_id");
  int64_t n = -1;
  OK(de_size(id, &n));
  CHECK(n == 0);  // none of the failed writes wrote anything
  // Optional outputs may be NULL.
  OK(de_find(id, DE_KEY_INT64, keys, 3, vals, nullptr));
  OK(de_find_or_insert(id, DE_KEY_INT64, keys, 3, vals, nullptr, nullptr));
  OK(de_insert_or_assign(id, DE_KEY_INT64, keys, 3, vals, nullptr));
  OK(de_accum(id, DE_KEY_INT64, keys, 3, vals, ex, nullptr));
  OK(de_apply_gradients(id, DE_KEY_INT64, keys, 3, vals, 0.1f, 1, nullptr));
  OK(de_import(id, DE_KEY_INT64, keys, 3, vals, nullptr, 0, nullptr, nullptr, nullptr, nullptr));
  OK(de_restrict(id, 3, DE_RESTRICT_RECENCY, DE_KEY_INT64, nullptr, nullptr, 0, nullptr));
  OK(de_export(id, 0, 3, DE_KEY_INT64, nullptr, nullptr, nullptr, 0, nullptr, nullptr, nullptr, nullptr));
  OK(de_table_dims(id, nullptr, nullptr, nullptr));
  OK(de_table_create(id, R"({"dim": 2})", nullptr));  // an existing id needs no out_id
  size_t needed = 0;
  OK(de_table_describe(id, nullptr, 0, &needed));
  OK(de_table_describe(id, nullptr, 0, nullptr));
  OK(de_slot_names(id, nullptr, 0, nullptr));
  char small[4];
  OK(de_slot_names(id, small, sizeof(small), &needed));
  CHECK(small[3] == '\0' && needed == std::strlen("momentum,velocity") + 1);
  OK(de_size(id, &n));
  CHECK(n == 3);
  OK(de_table_destroy(id));
}

// A failed reserve or a refused restrict leaves the table exactly as it was.
static void test_failures_leave_the_table_unchanged() {
  int64_t id = make(R"({"dim": 3})");
  std::vector<int64_t> keys(500);
  std::vector<float> vals(1500);
  for (int i = 0; i < 500; ++i) {
    keys[i] = i * 7919;
    for (int j = 0; j < 3; ++j) vals[i * 3 + j] = static_cast<float>(i + j);
  }
  OK(de_insert_or_assign(id, DE_KEY_INT64, keys.data(), 500, vals.data(), nullptr));
  auto same = [&] {
    std::vector<float> out(1500);
    std::vector<uint8_t> ex(500);
    OK(de_find(id, DE_KEY_INT64, keys.data(), 500, out.data(), ex.data()));
    CHECK(std::memcmp(out.data(), vals.data(), sizeof(float) * 1500) == 0);
    for (auto e : ex) CHECK(e == 1);
    int64_t n = 0;
    OK(de_size(id, &n));
    CHECK(n == 500);
  };
  for (int64_t huge : {int64_t(1) << 40, int64_t(1000000000000), INT64_MAX}) {
    CHECK(de_reserve(id, huge) == -1);
    CHECK(de_last_error_kind() == DE_ERROR_NO_MEMORY);
    CHECK(std::strstr(de_last_error(), "bytes") != nullptr);
    same();
  }
  CHECK(de_reserve(id, -1) == -1);
  std::vector<float> scores(500, 1.0f);
  scores[17] = NAN;
  int64_t removed = -1;
  CHECK(de_restrict(id, 10, DE_RESTRICT_CUSTOM, DE_KEY_INT64, keys.data(), scores.data(), 500,
                    &removed) == -1);
  CHECK(std::strstr(de_last_error(), "NaN") != nullptr);
  same();
  // Equal scores: exactly n keys remain, the smallest ones.
  scores[17] = 1.0f;
  OK(de_restrict(id, 10, DE_RESTRICT_CUSTOM, DE_KEY_INT64, keys.data(), scores.data(), 500,
                 &removed));
  CHECK(removed == 490);
  std::vector<float> out(30);
  std::vector<uint8_t> ex(10);
  OK(de_find(id, DE_KEY_INT64, keys.data(), 10, out.data(), ex.data()));
  for (auto e : ex) CHECK(e == 1);
  OK(de_table_destroy(id));
}

// clear() and erasing every key give the memory back, and memory_bytes says so.
static void test_memory_is_given_back() {
  int64_t id = make(R"({"dim": 4})");
  std::vector<int64_t> keys(1500000);  // about 6 row chunks per shard
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i) * 31;
  std::vector<float> vals(keys.size() * 4, 1.0f);
  int64_t empty = 0, full = 0, after = 0;
  OK(de_memory_bytes(id, &empty));
  OK(de_insert_or_assign(id, DE_KEY_INT64, keys.data(), keys.size(), vals.data(), nullptr));
  OK(de_memory_bytes(id, &full));
  CHECK(full > 1500000 * 40);
  OK(de_clear(id));
  OK(de_memory_bytes(id, &after));
  CHECK(after == empty);
  OK(de_insert_or_assign(id, DE_KEY_INT64, keys.data(), keys.size(), vals.data(), nullptr));
  OK(de_erase(id, DE_KEY_INT64, keys.data(), keys.size()));
  OK(de_memory_bytes(id, &after));
  CHECK(after < full / 4);  // one spare chunk per shard and minimum-size indexes
  OK(de_table_destroy(id));
}



// Owner counts: create gives one owner, retain/release add and drop one, the last release frees
// the table; destroy frees it at once. Calls already running when the last owner goes finish on
// the table they hold (ASan would report a use after free) or fail with "unknown table id".
static void test_ownership() {
  int64_t id = make(R"({"dim": 2})");
  OK(de_table_retain(id));
  OK(de_table_release(id));
  CHECK(de_table_exists(id) == 1);
  OK(de_table_release(id));
  CHECK(de_table_exists(id) == 0);
  CHECK(de_table_release(id) == -1 && std::strstr(de_last_error(), "unknown table id"));
  CHECK(de_table_retain(id) == -1 && std::strstr(de_last_error(), "unknown table id"));

  id = make(R"({"dim": 2})");
  OK(de_table_retain(id));
  OK(de_table_destroy(id));  // explicit destroy ignores the count
  CHECK(de_table_exists(id) == 0);
  CHECK(de_table_release(id) == -1);

  constexpr int64_t n = 4096;
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = i;
  std::vector<float> ones(n * 8, 1.0f);
  for (int round = 0; round < 20; ++round) {
    int64_t t = make(R"({"dim": 8})");
    OK(de_insert_or_assign(t, DE_KEY_INT64, keys.data(), n, ones.data(), nullptr));
    std::atomic<bool> go{false};
    std::atomic<int> bad{0};
    std::vector<std::thread> readers;
    for (int r = 0; r < 3; ++r) {
      readers.emplace_back([&] {
        std::vector<float> out(n * 8);
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < 50; ++i) {
          if (de_find(t, DE_KEY_INT64, keys.data(), n, out.data(), nullptr) != 0) {
            if (!std::strstr(de_last_error(), "unknown table id")) ++bad;
            return;
          }
          if (out[0] != 1.0f || out[n * 8 - 1] != 1.0f) ++bad;
        }
      });
    }
    go = true;
    OK(de_table_release(t));
    for (auto& th : readers) th.join();
    CHECK(bad.load() == 0);
    CHECK(de_table_exists(t) == 0);
  }
}

// Rows in their value dtype through the C ABI: byte-exact storage, int8 accum wrapping around
// (UBSan would flag a signed overflow), float16 accum rounding, slots in the dtype, and training
// refused for integer tables with the table unchanged.
static void test_value_dtypes() {
  int64_t id = make(R"({"dim": 2, "value_dtype": "int8", "initializer": "constant", "value": -3})");
  int32_t vd = -1;
  OK(de_value_dtype(id, &vd));
  CHECK(vd == DE_VALUE_INT8);
  int64_t keys[2] = {7, 8};
  int8_t rows[4] = {127, -128, 5, 6}, out[4] = {0, 0, 0, 0};
  uint8_t exists[2];
  OK(de_find(id, DE_KEY_INT64, keys, 2, out, exists));
  CHECK(out[0] == -3 && out[3] == -3 && exists[0] == 0);
  OK(de_insert_or_assign(id, DE_KEY_INT64, keys, 2, rows, nullptr));
  int8_t deltas[4] = {1, -1, 1, 1};
  uint8_t present[2] = {1, 1};
  OK(de_accum(id, DE_KEY_INT64, keys, 2, deltas, present, nullptr));
  OK(de_find(id, DE_KEY_INT64, keys, 2, out, nullptr));
  CHECK(out[0] == -128 && out[1] == 127 && out[2] == 6 && out[3] == 7);
  float grads[4] = {1, 1, 1, 1};
  CHECK(de_apply_gradients(id, DE_KEY_INT64, keys, 2, grads, 0.1f, 1, nullptr) == -1);
  CHECK(std::strstr(de_last_error(), "int8 cannot be trained") != nullptr);
  CHECK(de_set_optimizer(id, R"({"name": "sgd"})") == -1);
  OK(de_find(id, DE_KEY_INT64, keys, 2, out, nullptr));
  CHECK(out[0] == -128 && out[3] == 7);
  OK(de_table_destroy(id));
  // A random initializer cannot fill an integer row.
  CHECK(de_table_create(0, R"({"dim": 2, "value_dtype": "int32", "initializer": "normal"})",
                        &id) == -1);

  // float16: 1 + 2^-11 is a tie between 1 and 1 + 2^-10, rounded to the even 1.
  id = make(R"({"dim": 1, "value_dtype": "float16"})");
  uint16_t one = 0x3c00, tiny = 0x1000, got = 0;  // 1.0 and 2^-11
  OK(de_insert_or_assign(id, DE_KEY_INT64, keys, 1, &one, nullptr));
  OK(de_accum(id, DE_KEY_INT64, keys, 1, &tiny, present, nullptr));
  OK(de_find(id, DE_KEY_INT64, keys, 1, &got, nullptr));
  CHECK(got == 0x3c00);
  OK(de_set_optimizer(id, R"({"name": "adagrad"})"));  // slot starts at 0.1 -> 0x2e66
  uint16_t v[1], slot[1];
  int64_t k = 0, n = 0;
  OK(de_export(id, 0, 1, DE_KEY_INT64, &k, v, slot, 1, nullptr, nullptr, nullptr, &n));
  CHECK(n == 1 && v[0] == 0x3c00 && slot[0] == 0x2e66);
  OK(de_table_destroy(id));
}

int run_string_key_tests();  // string_keys_tests.cc
int run_string_value_tests();  // string_values_tests.cc
int run_semantics_tests();     // semantics_tests.cc
int run_clone_tests();         // clone_tests.cc

int main() {
  test_json_specs_round_trip();
  test_ownership();
  test_basic_ops();
  test_optimizer_step_and_restrict();
  test_concurrency();
  test_null_outputs();
  test_failures_leave_the_table_unchanged();
  test_memory_is_given_back();
  test_value_dtypes();
  g_failures += run_string_key_tests();
  g_failures += run_string_value_tests();
  g_failures += run_semantics_tests();
  g_failures += run_clone_tests();
  if (g_failures) {
    std::fprintf(stderr, "%d check(s) failed\n", g_failures);
    return 1;
  }
  std::printf("all core tests passed\n");
  return 0;
}
