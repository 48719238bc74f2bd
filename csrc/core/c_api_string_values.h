// c_api_string_values.h — the string-value path of the C ABI (dualemb_core.h, "String values").
//
// c_api.cc hands a call here when the table's value dtype is string (its keys already checked
// and widened to int64). Each function runs the storage operation, whose rows hold handles, and
// the matching change of the table's StringValues pool inside one hold of the pool's lock, so no
// caller sees a row whose strings are not in the pool. Every function throws (naming the
// problem) on bad input, leaving the table unchanged.
#ifndef DUALEMB_C_API_STRING_VALUES_H_
#define DUALEMB_C_API_STRING_VALUES_H_

#include <cstdint>

#include "dualemb_core.h"
#include "registry.h"

namespace dualemb {
namespace string_values_api {

void find(TableRef& t, const int64_t* keys, int64_t n, void* values, uint8_t* exists);
int64_t find_or_insert(TableRef& t, const int64_t* keys, int64_t n, void* values,
                       uint8_t* exists);
int64_t insert_or_assign(TableRef& t, const int64_t* keys, int64_t n, const void* values);
void erase(TableRef& t, const int64_t* keys, int64_t n);
void clear(TableRef& t);
int64_t restrict_rows(TableRef& t, int64_t num_reserved, RestrictBy by, const int64_t* keys,
                      const float* scores, int64_t n);
int64_t export_rows(TableRef& t, int64_t offset, int64_t limit, int64_t* keys, void* values,
                    void* slots, int32_t num_slots, int64_t* last_update, int64_t* update_count);
int64_t import_rows(TableRef& t, const int64_t* keys, int64_t n, const void* values,
                    const void* slots, int32_t num_slots, const int64_t* last_update,
                    const int64_t* update_count);
void initial_values(TableRef& t, int64_t n, void* values);
// Bytes of the pool (the strings and their bookkeeping).
size_t pool_bytes(TableRef& t);
// Throws std::invalid_argument: `op` (accum, apply_gradients) is not defined for strings.
[[noreturn]] void refuse(const char* op);

}  // namespace string_values_api
}  // namespace dualemb

#endif  // DUALEMB_C_API_STRING_VALUES_H_
