// registry.h — the process-wide map from table id to table. It lives in libdualemb_core.so, so
// the pybind11 module, the TF ops and the XLA FFI handlers all see the same tables.
#ifndef DUALEMB_REGISTRY_H_
#define DUALEMB_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "storage/storage.h"

namespace dualemb {

// get-or-create. id 0 draws a fresh random 63-bit id. An existing id must have the same dim and
// key dtype as `config` asks for.
int64_t create_table(int64_t id, const std::string& config);
// Throws std::out_of_range naming the id if no such table exists.
std::shared_ptr<Storage> get_table(int64_t id);
bool table_exists(int64_t id);
bool destroy_table(int64_t id);

}  // namespace dualemb

#endif  // DUALEMB_REGISTRY_H_
