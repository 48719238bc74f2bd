// factory.h — builds the storage a table config asks for: "backend" absent or "memory" gives the
// in-memory Table, "redis" a RedisTable (when the core was built with hiredis).
#ifndef DUALEMB_STORAGE_FACTORY_H_
#define DUALEMB_STORAGE_FACTORY_H_

#include <memory>
#include <string>

#include "storage.h"

namespace dualemb {

// Throws std::invalid_argument for a bad config or an unknown backend.
std::shared_ptr<Storage> make_storage(const std::string& config);

// Defined in redis_table.cc, or in redis_missing.cc when hiredis was not found at build time.
std::shared_ptr<Storage> make_redis_storage(const std::string& config);

}  // namespace dualemb

#endif  // DUALEMB_STORAGE_FACTORY_H_
