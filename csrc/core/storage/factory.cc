#include "factory.h"

#include <stdexcept>

#include "../config.h"
#include "../table.h"

namespace dualemb {

std::shared_ptr<Storage> make_storage(const std::string& config) {
  // Only "backend" is read here; each backend parses (and checks) the whole config itself.
  const Config c = Config::parse(config, "table config");
  const std::string backend = c.get_string("backend", "memory");
  if (backend == "memory") return std::make_shared<Table>(config);
  // The Redis backend keys its hashes by int64; string keys would need their own key layout.
  if (c.get_string("key_dtype", "int64") == "string")
    throw std::invalid_argument("table config: backend '" + backend +
                                "' does not support key_dtype 'string' (use the in-memory "
                                "backend)");
  if (c.get_string("value_dtype", "float32") == "string")
    throw std::invalid_argument("table config: backend '" + backend +
                                "' does not support value_dtype 'string' (use the in-memory "
                                "backend)");
  if (backend == "redis") return make_redis_storage(config);
  throw std::invalid_argument("table config: unknown backend '" + backend +
                              "' (known: memory, redis)");
}

}  // namespace dualemb
