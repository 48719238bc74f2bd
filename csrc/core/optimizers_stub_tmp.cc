// TEMPORARY until csrc/core/optimizers/ lands.
#include <stdexcept>
#include "optimizer.h"
namespace dualemb {
__attribute__((weak)) std::unique_ptr<Optimizer> make_optimizer(const std::string& spec) {
  throw std::invalid_argument("optimizers not built yet: " + spec);
}
}
