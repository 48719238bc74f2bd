// The core was built without hiredis (CMake did not find it): a redis config fails clearly.
#ifndef DUALEMB_HAVE_HIREDIS
#include <stdexcept>

#include "factory.h"

namespace dualemb {

std::shared_ptr<Storage> make_redis_storage(const std::string&) {
  throw std::invalid_argument(
      "table config asks for backend 'redis', but this dualemb was built without the Redis "
      "backend: the hiredis library was not found at build time (Debian/Ubuntu: apt-get install "
      "libhiredis-dev, then rebuild dualemb)");
}

}  // namespace dualemb
#endif
