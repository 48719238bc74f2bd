#include "factory.h"

#include <stdexcept>

#include "../config.h"
#include "../table.h"

namespace dualemb {

std::shared_ptr<Storage> make_storage(const std::string& config) {
  // Only "backend" is read here; each backend parses (and checks) the whole config itself.
  const std::string backend = Config::parse(config, "table config").get_string("backend", "memory");
  if (backend == "memory") return std::make_shared<Table>(config);
  if (backend == "redis") return make_redis_storage(config);
  throw std::invalid_argument("table config: unknown backend '" + backend +
                              "' (known: memory, redis)");
}

}  // namespace dualemb
