// registry.h — the process-wide map from table id to table. It lives in libdualemb_core.so, so
// the pybind11 module, the TF ops and the XLA FFI handlers all see the same tables.
//
// Ownership: every entry counts its owners. create_table(0, ...) makes a table with one owner
// (its creator); retain_table adds an owner and release_table drops one, erasing the entry when
// the last owner goes (the TF front end's resources work this way). destroy_table erases the
// entry at once, whatever the count (the explicit destroy of the pybind11 and JAX front ends).
// The table object is a shared_ptr: a call that already holds it finishes safely after its entry
// is erased, and the memory is freed when that call returns.
#ifndef DUALEMB_REGISTRY_H_
#define DUALEMB_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "table_facade.h"

namespace dualemb {

// get-or-create. id 0 draws a fresh random 63-bit id (not a live one; a repeat of a freed id
// is as likely as guessing 63 random bits).
// An existing id must have the same dim and key dtype as `config` asks for; getting an existing
// table does not change its owner count.
int64_t create_table(int64_t id, const std::string& config);
// Registers a copy of table `id` (TableFacade::clone: its state as of the call) under a fresh
// id with one owner, and returns that id. Throws std::out_of_range for an unknown id,
// std::invalid_argument for a backend that cannot be copied, std::bad_alloc for memory.
int64_t clone_table(int64_t id);
// The table (its facade: backend, string layers, every operation). Throws std::out_of_range
// naming the id if no such table exists.
std::shared_ptr<TableFacade> get_table(int64_t id);
bool table_exists(int64_t id);
// Adds an owner; throws std::out_of_range if no such table exists.
void retain_table(int64_t id);
// Drops an owner, erasing the table when none is left. Returns false if no such table exists.
bool release_table(int64_t id);
// Erases the table now. Returns false if no such table exists.
bool destroy_table(int64_t id);

}  // namespace dualemb

#endif  // DUALEMB_REGISTRY_H_
