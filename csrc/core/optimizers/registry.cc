// registry.cc — make_optimizer(): parses a spec and dispatches to the optimizer families; the
// shared HyperParams / OptimizerBase helpers.
#include <cmath>
#include <stdexcept>
#include <string>

#include "config.h"
#include "optimizer.h"
#include "optimizers/common.h"

namespace dualemb {
namespace optimizers {

HyperParams::HyperParams(const Config& cfg, const std::string& name, Flavor flavor)
    : cfg_(cfg),
      context_("optimizer '" + name + "' (flavor=" + flavor_name(flavor) + ")"),
      known_{"name", "flavor"} {
  // The canonical name and flavor replace what was given ("amsgrad" is recorded as "adam").
  cfg_.set_echo("name", canonical_json(name));
  cfg_.set_echo("flavor", canonical_json(std::string(flavor_name(flavor))));
}

void HyperParams::fail(const std::string& what) const {
  throw std::invalid_argument(context_ + ": " + what);
}

double HyperParams::real(const std::string& key, double fallback, Range range) {
  known_.insert(key);
  double v;
  try {
    v = cfg_.get_double(key, fallback);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  bool ok = std::isfinite(v) && (range.lo_open ? v > range.lo : v >= range.lo) &&
            (range.hi_open ? v < range.hi : v <= range.hi);
  if (!ok) {
    std::string lo = std::isinf(range.lo) ? "-inf" : format_double(range.lo);
    std::string hi = std::isinf(range.hi) ? "inf" : format_double(range.hi);
    fail(key + "=" + format_double(v) + " is out of range: must be in " +
         (range.lo_open ? "(" : "[") + lo + ", " + hi + (range.hi_open ? ")" : "]"));
  }
  return v;
}

bool HyperParams::flag(const std::string& key, bool fallback) {
  known_.insert(key);
  bool v;
  try {
    v = cfg_.get_bool(key, fallback);
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  return v;
}

std::string HyperParams::finish() const {
  cfg_.check_known(known_, context_);
  return cfg_.echo();
}

float OptimizerBase::slot_initial_value(int slot) const {
  if (slot < 0 || slot >= num_slots())
    throw std::out_of_range("slot index " + std::to_string(slot) + " out of range for " + spec_);
  return slot_init_[slot];
}

StepArgs OptimizerBase::start(float lr, int64_t step) const {
  if (step < 1)
    throw std::invalid_argument("apply_gradients: step must be >= 1 (1-based), got " +
                                std::to_string(step));
  if (!std::isfinite(lr))
    throw std::invalid_argument("apply_gradients: learning rate must be finite, got " +
                                format_double(lr));
  StepArgs a;
  a.lr = lr;
  a.step = step;
  return a;
}

void OptimizerBase::read_keras_weight_decay(const Config& cfg, HyperParams& hp) {
  if (!cfg.has("weight_decay")) return;
  set_keras_weight_decay(static_cast<float>(hp.real("weight_decay", 0.0, kNonNegative)));
}

namespace {

struct Entry {
  const char* name;
  Factory factory;
};

// `amsgrad` is an alias of adam with amsgrad=true (optax.amsgrad); its canonical name is adam.
const Entry kOptimizers[] = {
    {"sgd", make_sgd},         {"adagrad", make_adagrad}, {"adam", make_adam},
    {"amsgrad", make_adam},    {"adamw", make_adam},      {"adamax", make_adamax},
    {"nadam", make_nadam},     {"rmsprop", make_rmsprop}, {"ftrl", make_ftrl},
    {"adadelta", make_adadelta}, {"lion", make_lion},
};

}  // namespace
}  // namespace optimizers

std::unique_ptr<Optimizer> make_optimizer(const std::string& spec) {
  using namespace optimizers;
  Config cfg = Config::parse(spec, "optimizer spec");
  if (!cfg.has("name"))
    throw std::invalid_argument("optimizer spec '" + spec + "' has no \"name\" member");
  const std::string name = cfg.get_string("name", "");
  Factory factory = nullptr;
  std::string known;
  for (const Entry& e : kOptimizers) {
    if (name == e.name) factory = e.factory;
    known += (known.empty() ? "" : ", ") + std::string(e.name);
  }
  if (!factory)
    throw std::invalid_argument("unknown optimizer '" + name + "' (known: " + known + ")");
  // Like dualemb.core.optimizers.canonical(), a spec without a flavor means flavor=keras.
  const std::string flavor = cfg.get_string("flavor", "keras");
  Flavor f;
  if (flavor == "keras") {
    f = Flavor::kKeras;
  } else if (flavor == "optax") {
    f = Flavor::kOptax;
  } else {
    throw std::invalid_argument("optimizer '" + name + "': unknown flavor '" + flavor +
                                "' (known: keras, optax)");
  }
  return factory(cfg, name, f);
}

}  // namespace dualemb
