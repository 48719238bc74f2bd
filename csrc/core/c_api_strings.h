// c_api_strings.h — the string-key path of the C ABI (dualemb_core.h, "String keys").
//
// c_api.cc hands a call here when its key_dtype is DE_KEY_STRING (or, for clear and restrict,
// when the table has string keys). Each function translates the strings to the table's internal
// int64 ids and runs the storage operation inside one hold of the table's StringKeys lock, so
// no caller sees a half-done call. Values travel as void*: the storage's value layout is its own
// business; only the fix-up of initial rows needs a row's byte size (value_row_bytes).
// Every function throws (naming the problem) on bad input, leaving the table unchanged.
#ifndef DUALEMB_C_API_STRINGS_H_
#define DUALEMB_C_API_STRINGS_H_

#include <cstdint>

#include "dualemb_core.h"

namespace dualemb {
namespace string_api {

bool is_string_table(int64_t id);
void find(int64_t id, const void* keys, int64_t n, void* values, uint8_t* exists);
int64_t find_or_insert(int64_t id, const void* keys, int64_t n, void* values, uint8_t* exists);
int64_t insert_or_assign(int64_t id, const void* keys, int64_t n, const void* values);
int64_t accum(int64_t id, const void* keys, int64_t n, const void* deltas,
              const uint8_t* exists);
void erase(int64_t id, const void* keys, int64_t n);
void clear(int64_t id);
int64_t apply_gradients(int64_t id, const void* keys, int64_t n, const void* grads, float lr,
                        int64_t step);
// keys may be NULL unless policy is DE_RESTRICT_CUSTOM.
int64_t restrict_rows(int64_t id, int64_t num_reserved, int32_t policy, const void* keys,
                      const float* scores, int64_t n);
int64_t export_rows(int64_t id, int64_t offset, int64_t limit, de_string_keys_out* keys,
                    void* values, void* slots, int32_t num_slots, int64_t* last_update,
                    int64_t* update_count);
int64_t import_rows(int64_t id, const void* keys, int64_t n, const void* values,
                    const void* slots, int32_t num_slots, const int64_t* last_update,
                    const int64_t* update_count);
void initial_values(int64_t id, const void* keys, int64_t n, void* values);
void stats(int64_t id, int64_t* entries, int64_t* key_bytes);

}  // namespace string_api
}  // namespace dualemb

#endif  // DUALEMB_C_API_STRINGS_H_
