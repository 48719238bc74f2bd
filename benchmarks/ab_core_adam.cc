// ab_core_adam.cc — two builds of the core side by side in one process: Keras-Adam
// apply_gradients of each, dlopen'ed from their libdualemb_core.so, timed in alternation on the
// same keys and gradients (issue 22's Adam regression; any two builds whose C ABI has
// de_table_create / de_set_optimizer / de_insert_or_assign / de_apply_gradients).
//
//   c++ -O2 -std=c++17 benchmarks/ab_core_adam.cc -o /tmp/ab_core_adam -ldl
//   /tmp/ab_core_adam OLD/libdualemb_core.so NEW/libdualemb_core.so DIM THREADS
//
// A 1M-key table in each, 15 rounds of 10 calls of 65,536 random present keys, the two builds
// taking turns (who goes first alternates); prints one JSON line: median M keys/s of each and
// new/old. Configs are JSON; builds from before JSON configs get the old "name=value;..." form.
#include <dlfcn.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>
using namespace std;
struct Lib {
  int (*create)(int64_t, const char*, int64_t*);
  int (*set_opt)(int64_t, const char*);
  int (*ins)(int64_t, int32_t, const void*, int64_t, const void*, int64_t*);
  int (*apply)(int64_t, int32_t, const void*, int64_t, const float*, float, int64_t, int64_t*);
  int64_t id;
};
Lib load(const char* path, int dim, int threads, const vector<int64_t>& keys,
         const vector<float>& vals) {
  void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    fprintf(stderr, "%s\n", dlerror());
    exit(1);
  }
  Lib l;
  l.create = (decltype(l.create))dlsym(h, "de_table_create");
  l.set_opt = (decltype(l.set_opt))dlsym(h, "de_set_optimizer");
  l.ins = (decltype(l.ins))dlsym(h, "de_insert_or_assign");
  l.apply = (decltype(l.apply))dlsym(h, "de_apply_gradients");
  char cfg[128];
  snprintf(cfg, sizeof cfg, "{\"dim\":%d,\"num_threads\":%d}", dim, threads);
  const char* opt = "{\"name\":\"adam\",\"flavor\":\"keras\"}";
  auto err = (const char* (*)())dlsym(h, "de_last_error");
  if (l.create(0, cfg, &l.id)) {  // a build from before JSON configs
    snprintf(cfg, sizeof cfg, "dim=%d;num_threads=%d", dim, threads);
    opt = "name=adam;flavor=keras";
    if (l.create(0, cfg, &l.id)) {
      fprintf(stderr, "create %s: %s\n", path, err());
      exit(1);
    }
  }
  if (l.set_opt(l.id, opt)) {
    fprintf(stderr, "opt %s: %s\n", path, err());
    exit(1);
  }
  int64_t ev;
  for (size_t s = 0; s < keys.size(); s += 131072) {
    int64_t m = min<int64_t>(131072, keys.size() - s);
    if (l.ins(l.id, 0, &keys[s], m, &vals[s * dim], &ev)) {
      fprintf(stderr, "ins\n");
      exit(1);
    }
  }
  return l;
}
int main(int argc, char** argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: ab_core_adam OLD.so NEW.so DIM THREADS\n");
    return 2;
  }
  int dim = atoi(argv[3]), threads = atoi(argv[4]);
  const int64_t N = 1000000, B = 65536;
  const int calls = 10;
  mt19937_64 g(1);
  vector<int64_t> keys(N);
  for (auto& k : keys) k = (int64_t)(g() >> 2);
  vector<float> vals(N * dim);
  for (auto& v : vals) v = (g() % 1000) * 1e-3f;
  Lib a = load(argv[1], dim, threads, keys, vals), b = load(argv[2], dim, threads, keys, vals);
  vector<int64_t> q(B * calls);
  for (auto& x : q) x = keys[g() % N];
  vector<float> gr(B * dim);
  for (auto& x : gr) x = ((int)(g() % 2001) - 1000) * 1e-5f;
  vector<double> ta, tb;
  int64_t step = 1, ev;
  for (int r = 0; r < 15; ++r) {
    for (int side = 0; side < 2; ++side) {
      Lib& l = ((r + side) % 2) ? b : a;
      auto t0 = chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) l.apply(l.id, 0, &q[c * B], B, gr.data(), 1e-3f, step, &ev);
      double t = chrono::duration<double>(chrono::steady_clock::now() - t0).count();
      (&l == &a ? ta : tb).push_back(B * calls / t / 1e6);
    }
    ++step;
  }
  sort(ta.begin(), ta.end());
  sort(tb.begin(), tb.end());
  printf(
      "{\"dim\": %d, \"threads\": %d, \"old_mkeys\": %.3f, \"new_mkeys\": %.3f, \"new/old\": "
      "%.3f}\n",
      dim, threads, ta[7], tb[7], tb[7] / ta[7]);
}
