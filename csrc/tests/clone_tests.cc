// C ABI tests of de_table_clone, run under ASan + UBSan by tests/core/test_sanitizers.py: a copy
// holds exactly the source's rows, slots and metadata, owns its memory (both tables are written
// and freed in either order), and a copy taken while another thread trains is a whole number of
// steps.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "dualemb_core.h"

static int g_clone_failures = 0;
#define CCHECK(cond) DE_TEST_CHECK(g_clone_failures, cond)
#define COK(call) CCHECK((call) == 0)

namespace {

constexpr int kDim = 3;

struct Rows {
  std::vector<int64_t> keys, last_update, count;
  std::vector<float> values, slots;
};

// Every row, ordered by key (export order is the table's own).
Rows export_sorted(int64_t id, int num_slots) {
  int64_t n = 0;
  COK(de_size(id, &n));
  Rows r;
  r.keys.resize(n);
  r.last_update.resize(n);
  r.count.resize(n);
  r.values.resize(n * kDim);
  r.slots.resize(n * kDim * num_slots + 1);
  int64_t got = 0;
  COK(de_export(id, 0, n, DE_KEY_INT64, r.keys.data(), r.values.data(),
                num_slots ? r.slots.data() : nullptr, num_slots, r.last_update.data(),
                r.count.data(), /*stepped=*/nullptr, &got));
  CCHECK(got == n);
  std::vector<int64_t> order(n);
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](int64_t a, int64_t b) { return r.keys[a] < r.keys[b]; });
  Rows s;
  for (int64_t i : order) {
    s.keys.push_back(r.keys[i]);
    s.last_update.push_back(r.last_update[i]);
    s.count.push_back(r.count[i]);
    s.values.insert(s.values.end(), &r.values[i * kDim], &r.values[(i + 1) * kDim]);
    const size_t w = static_cast<size_t>(kDim) * num_slots;
    s.slots.insert(s.slots.end(), r.slots.begin() + i * w, r.slots.begin() + (i + 1) * w);
  }
  return s;
}

bool same(const Rows& a, const Rows& b) {
  return a.keys == b.keys && a.last_update == b.last_update && a.count == b.count &&
         std::memcmp(a.values.data(), b.values.data(), a.values.size() * sizeof(float)) == 0 &&
         a.values.size() == b.values.size() && a.slots.size() == b.slots.size() &&
         (a.slots.empty() ||
          std::memcmp(a.slots.data(), b.slots.data(), a.slots.size() * sizeof(float)) == 0);
}

void train(int64_t id, int64_t step, int64_t first_key, int64_t n) {
  std::vector<int64_t> keys(n);
  std::vector<float> grads(n * kDim);
  for (int64_t i = 0; i < n; ++i) keys[i] = first_key + (i * 7919) % (4 * n);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.001f * static_cast<float>(i % 97);
  COK(de_apply_gradients(id, DE_KEY_INT64, keys.data(), n, grads.data(), 0.1f, step, nullptr));
}

void test_clone_of_a_trained_table() {
  int64_t id = 0;
  COK(de_table_create(0, R"({"dim": 3, "initializer": "normal", "seed": 2, "capacity": 50000})",
                      &id));
  COK(de_set_optimizer(id, R"({"name": "adam"})"));
  for (int64_t step = 1; step <= 4; ++step) train(id, step, step * 1000, 20000);  // many chunks
  std::vector<int64_t> gone = {1000, 1007, 2000};
  COK(de_erase(id, DE_KEY_INT64, gone.data(), 3));
  const Rows before = export_sorted(id, 2);
  int64_t copy = 0;
  COK(de_table_clone(id, &copy));
  CCHECK(copy != id && copy != 0);
  CCHECK(same(export_sorted(copy, 2), before));
  int64_t c1 = 0, c2 = 0;
  COK(de_get_clock(id, &c1));
  COK(de_get_clock(copy, &c2));
  CCHECK(c1 == c2);
  // Independent: training the source and erasing from the copy leave the other as it was.
  train(id, 5, 500, 20000);
  COK(de_erase(copy, DE_KEY_INT64, before.keys.data(), 100));
  Rows after = export_sorted(copy, 2);
  CCHECK(after.keys.size() == before.keys.size() - 100);
  // Freed in either order: each owns its rows and index.
  COK(de_table_destroy(id));
  train(copy, 5, 0, 1000);
  COK(de_table_destroy(copy));
  CCHECK(de_table_clone(id, &copy) == -1 && std::strstr(de_last_error(), "unknown table id"));
  CCHECK(de_table_clone(12345, nullptr) == -1);
}

void test_clone_while_training() {
  int64_t id = 0;
  COK(de_table_create(0, R"({"dim": 3})", &id));
  COK(de_set_optimizer(id, R"({"name": "sgd"})"));
  std::atomic<bool> done{false};
  std::thread trainer([&] {
    for (int64_t step = 1; step <= 30; ++step) {
      std::vector<int64_t> keys(2000);
      for (int64_t i = 0; i < 2000; ++i) keys[i] = i;
      std::vector<float> grads(2000 * kDim, 1.0f);
      COK(de_apply_gradients(id, DE_KEY_INT64, keys.data(), 2000, grads.data(), 1.0f, step,
                             nullptr));
    }
    done = true;
  });
  int copies = 0;
  while (!done && copies < 20) {
    int64_t copy = 0;
    COK(de_table_clone(id, &copy));
    // Every row took the same steps: a half-applied batch would give two values.
    Rows r = export_sorted(copy, 0);
    for (float v : r.values) CCHECK(r.values.empty() || v == r.values[0]);
    COK(de_table_destroy(copy));
    ++copies;
  }
  trainer.join();
  COK(de_table_destroy(id));
}

void test_clone_of_string_keys_and_values() {
  // String keys: the copy's map must point at its own strings (ASan catches a shared view).
  int64_t id = 0;
  COK(de_table_create(0, R"({"dim": 3, "key_dtype": "string"})", &id));
  std::string bytes;
  std::vector<int64_t> offsets{0};
  for (int i = 0; i < 300; ++i) {
    bytes += "key-" + std::to_string(i) + std::string(i % 40, 'x');
    offsets.push_back(static_cast<int64_t>(bytes.size()));
  }
  de_string_keys kv{bytes.data(), offsets.data()};
  std::vector<float> vals(300 * kDim, 2.5f), out(300 * kDim);
  std::vector<uint8_t> ex(300);
  COK(de_insert_or_assign(id, DE_KEY_STRING, &kv, 300, vals.data(), nullptr));
  int64_t copy = 0;
  COK(de_table_clone(id, &copy));
  COK(de_table_destroy(id));  // the copy's strings must outlive the source's
  COK(de_find(copy, DE_KEY_STRING, &kv, 300, out.data(), ex.data()));
  for (uint8_t e : ex) CCHECK(e == 1);
  CCHECK(out == vals);
  COK(de_erase(copy, DE_KEY_STRING, &kv, 150));
  COK(de_table_destroy(copy));

  // String values: the copy has its own pool.
  COK(de_table_create(0, R"({"dim": 1, "value_dtype": "string"})", &id));
  std::vector<int64_t> keys = {1, 2, 3};
  std::string sv = std::string(100, 'a') + "b" + "";
  std::vector<int64_t> soff = {0, 100, 101, 101};
  de_string_values values{sv.data(), soff.data()};
  COK(de_insert_or_assign(id, DE_KEY_INT64, keys.data(), 3, &values, nullptr));
  COK(de_table_clone(id, &copy));
  COK(de_erase(id, DE_KEY_INT64, keys.data(), 3));
  COK(de_table_destroy(id));
  struct Buf {
    std::string s;
    static char* reserve(void* c, int64_t n) {
      auto* b = static_cast<Buf*>(c);
      b->s.resize(n);
      return b->s.data();
    }
  } buf;
  std::vector<int64_t> got_off(4);
  de_string_values_out o{&Buf::reserve, &buf, got_off.data()};
  COK(de_find(copy, DE_KEY_INT64, keys.data(), 3, &o, ex.data()));
  CCHECK(buf.s == sv && got_off[1] == 100 && got_off[3] == 101);
  COK(de_table_destroy(copy));
}

}  // namespace

int run_clone_tests() {
  test_clone_of_a_trained_table();
  test_clone_while_training();
  test_clone_of_string_keys_and_values();
  return g_clone_failures;
}
