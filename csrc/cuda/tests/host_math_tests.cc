// host_math_tests.cc — the GPU table's per-element math, compiled as host code, against the CPU
// core's row functions: bit for bit, for every optimizer variant and every initializer.
//
// The GPU table runs kernels::apply_element() and kernels::initial_value() (optimizer_math.h,
// init_math.h) one element per thread, dispatching on plain-data descriptors; the CPU core runs
// the same element functions in its own vectorized loops. This checks, without a GPU, that the
// descriptors and the dispatch reproduce every CPU variant exactly (what remains for a GPU run is
// only the device compiler: tests/gpu/). Built with -DDUALEMB_BUILD_TESTS=ON; links the
// core's optimizer and initializer sources directly (their symbols are hidden in the shared core).
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "config.h"
#include "init_math.h"
#include "initializer.h"
#include "optimizer.h"
#include "optimizer_math.h"

static int g_failures = 0;
static int g_checks = 0;
#define CHECK(cond, ...)                                                            \
  do {                                                                              \
    ++g_checks;                                                                     \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                            \
      std::fprintf(stderr, "\n");                                                   \
      ++g_failures;                                                                 \
    }                                                                               \
  } while (0)

namespace {

using dualemb::kernels::apply_element;

const char* kOptimizerSpecs[] = {
    R"({"name":"sgd","flavor":"keras"})",
    R"({"name":"sgd","flavor":"keras","momentum":0.9})",
    R"({"name":"sgd","flavor":"keras","momentum":0.8,"nesterov":true,"weight_decay":0.1})",
    R"({"name":"sgd","flavor":"optax"})",
    R"({"name":"sgd","flavor":"optax","momentum":0.9})",
    R"({"name":"sgd","flavor":"optax","momentum":0.7,"nesterov":true})",
    R"({"name":"adagrad","flavor":"keras"})",
    R"({"name":"adagrad","flavor":"keras","epsilon_in_sqrt":false,"weight_decay":0.2})",
    R"({"name":"adagrad","flavor":"optax"})",
    R"({"name":"adam","flavor":"keras"})",
    R"({"name":"adam","flavor":"keras","amsgrad":true})",
    R"({"name":"adam","flavor":"keras","weight_decay":0.05})",
    R"({"name":"adamw","flavor":"keras","amsgrad":true})",
    R"({"name":"adam","flavor":"optax"})",
    R"({"name":"adam","flavor":"optax","amsgrad":true,"bias_correction_nu":false})",
    R"({"name":"adam","flavor":"optax","nesterov":true,"eps_root":1e-6})",
    R"({"name":"adamw","flavor":"optax"})",
    R"({"name":"adamw","flavor":"optax","nesterov":true})",
    R"({"name":"adamw","flavor":"optax","weight_decay":0})",
    R"({"name":"nadam","flavor":"optax"})",
    R"({"name":"adamax","flavor":"keras"})",
    R"({"name":"adamax","flavor":"keras","weight_decay":0.01})",
    R"({"name":"adamax","flavor":"optax"})",
    R"({"name":"nadam","flavor":"keras"})",
    R"({"name":"nadam","flavor":"keras","schedule_decay":0.004})",
    R"({"name":"rmsprop","flavor":"keras"})",
    R"({"name":"rmsprop","flavor":"keras","momentum":0.5})",
    R"({"name":"rmsprop","flavor":"keras","centered":true})",
    R"({"name":"rmsprop","flavor":"keras","centered":true,"momentum":0.9,"weight_decay":0.3})",
    R"({"name":"rmsprop","flavor":"keras","epsilon_in_sqrt":false})",
    R"({"name":"rmsprop","flavor":"keras","epsilon_in_sqrt":false,"centered":true})",
    R"({"name":"rmsprop","flavor":"optax"})",
    R"({"name":"rmsprop","flavor":"optax","centered":true,"momentum":0.9})",
    R"({"name":"rmsprop","flavor":"optax","momentum":0.9,"nesterov":true,"bias_correction":true})",
    R"({"name":"rmsprop","flavor":"optax","eps_in_sqrt":false,"centered":true})",
    R"({"name":"ftrl","flavor":"keras"})",
    R"({"name":"ftrl","flavor":"keras","learning_rate_power":0.0,"l2_regularization_strength":0.1})",
    R"({"name":"ftrl","flavor":"keras","learning_rate_power":-0.3,"l1_regularization_strength":0.01,"l2_shrinkage_regularization_strength":0.03,"beta":0.5,"weight_decay":0.1})",
    R"({"name":"adadelta","flavor":"keras"})",
    R"({"name":"adadelta","flavor":"keras","weight_decay":0.02})",
    R"({"name":"adadelta","flavor":"optax"})",
    R"({"name":"adadelta","flavor":"optax","weight_decay":0.01})",
    R"({"name":"lion","flavor":"keras"})",
    R"({"name":"lion","flavor":"keras","weight_decay":0.1})",
    R"({"name":"lion","flavor":"optax"})",
    R"({"name":"lion","flavor":"optax","weight_decay":0})",
};

// Trains one row 5 steps with Optimizer::apply and with apply_element over the kernel()
// descriptor, from the same random start (slots positive: accumulators are), and compares bits.
void check_optimizer(const char* spec, int64_t dim, std::mt19937* rng) {
  std::unique_ptr<dualemb::Optimizer> opt = dualemb::make_optimizer(spec);
  const dualemb::kernels::OptimizerKernel k = opt->kernel();
  const int ns = opt->num_slots();
  CHECK(k.num_slots == ns, "%s: kernel().num_slots %d != %d", spec, k.num_slots, ns);
  std::uniform_real_distribution<float> u(-1.f, 1.f), pos(0.01f, 1.f);
  std::vector<float> row_a(dim), slots_a(ns * dim), grad(dim);
  for (auto& x : row_a) x = u(*rng);
  for (auto& x : slots_a) x = pos(*rng);
  std::vector<float> row_b = row_a, slots_b = slots_a;
  const float lrs[] = {0.05f, 0.1f, 0.02f, 0.3f, 0.07f};
  for (int step = 1; step <= 5; ++step) {
    for (auto& x : grad) x = u(*rng);
    if (dim > 2) grad[1] = 0.f;  // a zero gradient (Optax adagrad's s > 0 branch, sign(0))
    const dualemb::StepArgs args = opt->prepare(lrs[step - 1], step);
    opt->apply(row_a.data(), slots_a.data(), grad.data(), dim, args);
    const dualemb::kernels::StepScalars s = dualemb::step_scalars(args);
    for (int64_t j = 0; j < dim; ++j)
      apply_element(k, s, row_b.data(), slots_b.data(), grad.data(), dim, j);
    CHECK(std::memcmp(row_a.data(), row_b.data(), sizeof(float) * dim) == 0,
          "%s dim=%lld step %d: rows differ", spec, static_cast<long long>(dim), step);
    // ns == 0 (SGD): empty vectors, whose data() may be null, which memcmp must not get.
    CHECK(ns == 0 || std::memcmp(slots_a.data(), slots_b.data(), sizeof(float) * ns * dim) == 0,
          "%s dim=%lld step %d: slots differ", spec, static_cast<long long>(dim), step);
  }
}

const char* kInitializerConfigs[] = {
    R"({"initializer":"zeros"})",
    R"({"initializer":"constant","value":0.25})",
    R"({"initializer":"normal","seed":7,"mean":0.5,"stddev":2.0})",
    R"({"initializer":"normal","seed":0})",
    R"({"initializer":"truncated_normal","seed":3,"stddev":0.1})",
    R"({"initializer":"uniform","seed":11,"minval":-0.3,"maxval":0.7})",
};

void check_initializer(const std::string& config, int64_t dim) {
  dualemb::Config c = dualemb::Config::parse(config, "test initializer");
  const dualemb::Initializer init = dualemb::Initializer::from_config(c, dim);
  const dualemb::kernels::InitKernel k = init.kernel();
  std::vector<float> row(dim);
  const uint64_t keys[] = {0, 1, 2, 42, 0xffffffffffffffffULL, 0x8000000000000000ULL, 123456789};
  for (uint64_t key : keys) {
    init.fill(key, row.data());
    for (int64_t j = 0; j < dim; ++j) {
      const float v = dualemb::kernels::initial_value(k, key, j);
      CHECK(std::memcmp(&v, &row[j], 4) == 0, "%s dim=%lld key=%llu col %lld: %.9g != %.9g",
            config.c_str(), static_cast<long long>(dim), static_cast<unsigned long long>(key),
            static_cast<long long>(j), v, row[j]);
    }
  }
}

}  // namespace

void run_bucket_math_tests(int* checks, int* failures);  // bucket_math_tests.cc

int main() {
  std::mt19937 rng(1234);
  for (const char* spec : kOptimizerSpecs)
    for (int64_t dim : {1, 7, 16, 33}) check_optimizer(spec, dim, &rng);
  for (const char* config : kInitializerConfigs)
    for (int64_t dim : {1, 2, 7, 64, 65}) check_initializer(config, dim);
  check_initializer(R"({"initializer":"vector","values":[1.5,-2,3.25]})", 3);
  run_bucket_math_tests(&g_checks, &g_failures);
  if (g_failures) {
    std::fprintf(stderr, "%d of %d checks failed\n", g_failures, g_checks);
    return 1;
  }
  std::printf("all %d host math checks passed\n", g_checks);
  return 0;
}
