// dualemb_core.h — the C ABI of libdualemb_core.so.
//
// Every front end (pybind11 module, TF op library, XLA FFI module) links this one shared library,
// so all of them see the same process-wide registry of tables. Only POD arguments cross this
// boundary, which lets each front end be compiled with its own framework's flags and C++ ABI.
//
// Conventions
//  * Every function returns 0 on success and -1 on error; de_last_error() then returns a
//    thread-local message that names the problem. A failed call leaves the table unchanged.
//  * Tables are named by a 63-bit id. de_table_create(0, ...) draws a fresh random id.
//  * Keys are passed as `const void* keys` with `key_dtype` (DE_KEY_INT64 / DE_KEY_INT32 /
//    DE_KEY_STRING); it must equal the table's key dtype. String keys: see "String keys" below.
//  * Values (rows, accum deltas, initial values) are passed as `void*` in the table's value
//    dtype (DE_VALUE_*, de_value_dtype), row-major [n, dim], aligned to the element size.
//    Gradients and restrict scores are always float32.
//  * Slots (optimizer state) are stored beside each row in the value dtype; exported/imported as
//    [n, num_slots, dim] in the value dtype.
//  * Writes that may insert report in *evicted how many keys a capacity limit evicted (may be NULL).
//    An eviction keeps the `capacity` best keys by the table's evict_policy score, ties broken
//    by the smaller key (so a batch larger than the capacity keeps a defined subset).
//  * An output pointer marked "may be NULL" is optional; every other one must be non-NULL, and
//    a NULL there is an error, not a crash.
#ifndef DUALEMB_CORE_H_
#define DUALEMB_CORE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DE_API __attribute__((visibility("default")))

enum { DE_KEY_INT64 = 0, DE_KEY_INT32 = 1, DE_KEY_STRING = 2 };

// String keys (a table created with "key_dtype": "string").
// Every batched function that takes `const void* keys` takes, with key_dtype DE_KEY_STRING, a
// pointer to one de_string_keys: key i is the byte string bytes[offsets[i], offsets[i+1]) (any
// bytes, NUL included; no encoding is assumed). offsets has n + 1 non-decreasing entries,
// offsets[0] >= 0. Keys are compared by their bytes: two different strings are never one key.
// Inside the core each string maps to an internal int64 id (its fingerprint, see below, or the
// next free id when a different string holds that one); the translation and the table operation
// run in one call under the table's string lock, so no caller sees half of either.
//  * de_find never adds a string: an unknown string reads as its initializer row, exists = 0.
//  * A new string's initial row is the initializer's row for the int64 key
//    de_string_fingerprint(string) (never the probe-dependent id), so the same string starts from
//    the same row in every table and process, whatever the insertion order.
//  * The mapping of a string whose row is gone (erase, clear, restrict, capacity eviction) is
//    dropped: erase/clear/restrict drop it at once; evicted ones are dropped when the mapping
//    holds more than 2 * size + 1024 strings (amortised, inside a write). de_string_keys_stats
//    reports the mapping's size.
// de_export with key_dtype DE_KEY_STRING and non-NULL keys takes a de_string_keys_out: the keys
// of the rows written go to bytes/offsets as above (offsets has room for limit + 1 entries). A
// page ends early, before the first key whose bytes would not fit `capacity`; *out_n says how
// many rows were written (values etc. past *out_n are unspecified), and `needed` receives the
// byte length of that first key that did not fit (0 when none stopped the page), so a caller
// that got out_n == 0 with needed > 0 retries with capacity >= needed.
typedef struct {
  const char* bytes;
  const int64_t* offsets;  // n + 1 entries
} de_string_keys;
typedef struct {
  char* bytes;
  int64_t capacity;  // bytes available at `bytes`
  int64_t* offsets;  // limit + 1 entries; offsets[0] = 0
  int64_t needed;    // out: see above
} de_string_keys_out;

// String values (a table created with "value_dtype": "string"; its keys are int64 or int32).
// Each row holds dim byte strings (any bytes, NUL included; no encoding is assumed). For such a
// table every function that takes row values takes, in place of the `void* values` buffer:
//  * as input (de_insert_or_assign, de_import): a pointer to one de_string_values: element e of
//    the n * dim strings (row-major) is bytes[offsets[e], offsets[e+1]); offsets has n * dim + 1
//    non-decreasing entries, offsets[0] >= 0;
//  * as output (de_find, de_find_or_insert, de_export, de_initial_values): a pointer to one
//    de_string_values_out. The call gathers the strings under the table's lock, calls
//    reserve(context, total) exactly once with their total byte length, copies them into the
//    buffer it returns (at least `total` bytes; NULL fails the call as out of memory unless
//    total is 0) and writes offsets (rows * dim + 1 entries, offsets[0] = 0) as above. de_export
//    reports the rows written in *out_n; offsets has room for limit * dim + 1 entries.
// A missing key reads as the table's default row: the config's "initializer" "zeros" (empty
// strings, the default), "constant" ("value": a JSON string) or "vector" ("values": dim or 1
// JSON strings); a default's bytes are the UTF-8 encoding of the JSON text. de_find_or_insert
// inserts that row. de_accum, de_apply_gradients and de_set_optimizer refuse a string table;
// it never has slots. Erase, clear, restrict and capacity evictions drop the strings with their
// rows, and de_memory_bytes counts the strings' memory.
typedef de_string_keys de_string_values;
typedef struct {
  char* (*reserve)(void* context, int64_t total_bytes);
  void* context;
  int64_t* offsets;
} de_string_values_out;

// Value dtypes (the config's "value_dtype" names; dualemb/core/table.py mirrors these codes).
// float16 is IEEE binary16, bfloat16 the top half of a float32. Training (optimizers) needs
// float32, float16 or bfloat16; the others serve every other operation.
enum {
  DE_VALUE_FLOAT32 = 0,
  DE_VALUE_FLOAT16 = 1,
  DE_VALUE_BFLOAT16 = 2,
  DE_VALUE_FLOAT64 = 3,
  DE_VALUE_INT8 = 4,
  DE_VALUE_INT32 = 5,
  DE_VALUE_INT64 = 6,
  DE_VALUE_STRING = 7  // byte strings: see "String values" below
};
enum { DE_RESTRICT_RECENCY = 0, DE_RESTRICT_FREQUENCY = 1, DE_RESTRICT_CUSTOM = 2 };
// What kind of error the last failed call on this thread had (de_last_error_kind).
enum { DE_ERROR_NONE = 0, DE_ERROR_OTHER = 1, DE_ERROR_NO_MEMORY = 2 };

DE_API const char* de_last_error(void);
// DE_ERROR_NO_MEMORY: an allocation failed, or a request (e.g. reserve) was refused up front
// because it needs more than the machine's memory; the message names the size. The table is
// unchanged either way. DE_ERROR_OTHER: anything else (bad argument, unknown table, ...).
DE_API int de_last_error_kind(void);
DE_API const char* de_version(void);

// Specs are JSON objects (UTF-8 text; see docs/checkpoint_format.md §specs). Types are checked:
// integers must be JSON integers, reals any JSON number, flags true/false, names strings; NaN
// and infinities cannot be written in JSON and are refused, as are unknown and repeated members.
//
// Table lifecycle. `config` members: "dim" (int, required), "key_dtype" ("int64" | "int32"),
// "value_dtype" ("float32" | "float16" | "bfloat16" | "float64" | "int8" | "int32" | "int64" |
// "string": see "String values"),
// "initializer" ("zeros" | "constant" | "vector" | "normal" |
// "truncated_normal" | "uniform") with the members of its kind: "value" (constant), "values"
// (vector: a list of dim or 1 numbers), "seed" (uint64), "mean", "stddev" (normal kinds),
// "minval", "maxval" (uniform); integer value dtypes take only zeros, constant and vector, whose
// values must be exactly representable in the dtype (a random initializer is refused), and
// float16/bfloat16/float64 rows start at the float32 initial row converted; "capacity" (int, 0 = unlimited), "evict_policy" ("recency" |
// "frequency"), "num_threads" (int, 0 = all cores). A member the chosen initializer does not use
// is refused.
// get-or-create: if `id` exists already, its dim and key dtype must match `config`.
//
// Ownership: a table made by de_table_create has one owner, its creator. de_table_retain adds
// an owner, de_table_release drops one and frees the table when none is left (the TF front end
// holds one per resource). de_table_destroy frees it at once, whatever the count (the explicit
// destroy of the pybind11 and JAX front ends). A call already running on a table finishes
// safely; later calls with the id fail with "unknown table id".
DE_API int de_table_create(int64_t id, const char* config, int64_t* out_id);
DE_API int de_table_exists(int64_t id);  // 1 or 0, never an error
DE_API int de_table_retain(int64_t id);
DE_API int de_table_release(int64_t id);
DE_API int de_table_destroy(int64_t id);
// A copy of table `id` — rows, optimizer slots, metadata, index, optimizer, initializer, clock —
// as of the call, registered under a fresh id (*out_id) with one owner (free it with
// de_table_destroy or de_table_release). Writers are held off while it is copied (readers go
// on), so no write is half in it; afterwards the two tables are independent. Takes one table's
// memory. Only in-memory tables (int64/int32/string keys, any value dtype): a Redis table is
// refused with an error.
DE_API int de_table_clone(int64_t id, int64_t* out_id);
// Canonical description, one JSON object {"config": {...}, "optimizer": {...} | null}: every member
// as it was given (an integer stays an integer, a float keeps its bits, a list its length), the
// members not given with their defaults (num_threads, a setting of this process, is left out).
// Canonical JSON is the exact text of Python's json.dumps(obj, sort_keys=True,
// separators=(",", ":"), ensure_ascii=True, allow_nan=False). Writes at most buflen bytes (NUL-terminated); *needed receives the full length + 1.
DE_API int de_table_describe(int64_t id, char* buf, size_t buflen, size_t* needed);
DE_API int de_table_dims(int64_t id, int64_t* dim, int32_t* key_dtype, int32_t* num_slots);
// The table's value dtype (DE_VALUE_*).
DE_API int de_value_dtype(int64_t id, int32_t* value_dtype);

// `text`, any JSON value, rewritten as canonical JSON (what describe writes).
DE_API int de_canonical_json(const char* text, char* buf, size_t buflen, size_t* needed);

// Optimizer spec: {"name": "adam", "flavor": "keras" | "optax", "beta_1": 0.9, ...}. Attaching
// one to a non-empty table adds the slot columns to every row (with the optimizer's initial slot values); an empty spec
// detaches it and drops the slots. Attaching the same optimizer again (hyper-parameters equal as
// numbers: 0 equals 0.0) keeps the slots. A table whose value dtype cannot be trained (float64,
// integers) refuses any optimizer.
DE_API int de_set_optimizer(int64_t id, const char* spec);
// Slot names of the attached optimizer, comma separated ("m,v").
DE_API int de_slot_names(int64_t id, char* buf, size_t buflen, size_t* needed);
DE_API int de_set_num_threads(int64_t id, int32_t num_threads);
// Where batched calls made by THIS thread find helper threads (0 = the core's own worker pool,
// the default). A framework whose kernels run on its own thread pool passes a function that
// schedules `task(arg)` on that pool: its idle threads then help instead of spinning beside the
// core's workers. The calling thread always claims work itself and only waits for tasks a helper
// has started, so a scheduler that runs tasks late (or inline) is safe. Every scheduled task
// must eventually run exactly once. Returns the previous setting through prev_* (may be NULL).
typedef void (*de_scheduler_fn)(void* context, void (*task)(void*), void* arg);
DE_API void de_set_thread_scheduler(de_scheduler_fn fn, void* context, de_scheduler_fn* prev_fn,
                                    void** prev_context);

// Batched operations.
DE_API int de_find(int64_t id, int32_t key_dtype, const void* keys, int64_t n, void* values,
                   uint8_t* exists /* may be NULL */);
DE_API int de_find_or_insert(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                             void* values, uint8_t* exists, int64_t* evicted);
DE_API int de_insert_or_assign(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                               const void* values, int64_t* evicted);
// TFRA accum rule, per key: absent && !exists[i] -> insert values[i]; present && exists[i] ->
// row += values[i]; otherwise ignored. Integer rows wrap around on overflow (two's complement);
// float16/bfloat16 rows add in float32 and round to nearest even.
DE_API int de_accum(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                    const void* deltas, const uint8_t* exists, int64_t* evicted);
// de_accum with the deltas still to compute (TFRA's Variable.accum(keys, old, new, exists)):
// delta = new_values[i] - old_values[i] where exists[i], else new_values[i], in the value
// dtype's arithmetic (integers wrap; float16/bfloat16 subtract in float32 and round). The same
// result as computing the deltas and calling de_accum, without a pass over them first.
DE_API int de_accum_rows(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                         const void* old_values, const void* new_values, const uint8_t* exists,
                         int64_t* evicted);
DE_API int de_erase(int64_t id, int32_t key_dtype, const void* keys, int64_t n);
DE_API int de_clear(int64_t id);
DE_API int de_size(int64_t id, int64_t* out);
// Makes room for n keys. A request needing more than the machine's memory (physical RAM, or the
// cgroup limit if lower) fails with DE_ERROR_NO_MEMORY before allocating; any failure leaves
// the table's content unchanged.
DE_API int de_reserve(int64_t id, int64_t n);
// Fused sparse optimizer step. Gradients of duplicate keys are summed first; missing keys are
// inserted with their initializer row (and initial slots) and then updated. `step` is the
// 1-based update count t used for bias correction. Gradients are float32 whatever the value
// dtype; a float16/bfloat16 row and its slots are widened to float32, updated by the same float32
// kernel, and rounded back to nearest even.
DE_API int de_apply_gradients(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                              const float* grads, float lr, int64_t step, int64_t* evicted);
// Multi-table calls: one call does the per-table call (de_find, de_find_or_insert,
// de_apply_gradients) on every entry of `batches`, with the same results bit for bit; distinct
// tables run in parallel on the core's threads. Each entry holds the per-table call's arguments
// (the fields a call does not use are ignored) and receives its `evicted` count.
//  * Checked for every entry before any table changes: the table id exists, key dtype and count,
//    the buffers, and for apply_gradients step >= 1, a trainable value dtype and an optimizer. A
//    bad entry fails the call with an error naming its position and id; no table changes.
//  * A table listed several times runs its entries one after the other, in list order.
//  * A failure while running (out of memory) leaves that table unchanged, as its per-table call
//    would; other tables of the call may have been updated. The error names the table.
typedef struct {
  int64_t id;
  int32_t key_dtype;
  const void* keys;
  int64_t n;
  void* values;        // de_find_many, de_find_or_insert_many: n * dim rows out
  uint8_t* exists;     // de_find_many, de_find_or_insert_many: may be NULL
  const float* grads;  // de_apply_gradients_many: n * dim
  float lr;            // de_apply_gradients_many
  int64_t step;        // de_apply_gradients_many: the 1-based update count
  int64_t evicted;     // out (de_find_or_insert_many, de_apply_gradients_many)
} de_table_batch;
DE_API int de_find_many(de_table_batch* batches, int64_t count);
DE_API int de_find_or_insert_many(de_table_batch* batches, int64_t count);
DE_API int de_apply_gradients_many(de_table_batch* batches, int64_t count);
// Keep the `num_reserved` keys with the highest score, erase the rest (with their slots).
// policy RECENCY scores by last update, FREQUENCY by update count, CUSTOM by `scores` given
// for `keys` (keys not listed score -inf; the last score of a repeated key counts; a NaN score
// is refused, changing nothing). Equal scores rank the smaller key first, so exactly
// min(num_reserved, size) keys remain. *removed (may be NULL) receives how many were erased.
DE_API int de_restrict(int64_t id, int64_t num_reserved, int32_t policy, int32_t key_dtype,
                       const void* keys, const float* scores, int64_t n, int64_t* removed);
// Paged export: rows [offset, offset+limit) of the table's iteration order (stable while the
// table is not modified). Any output pointer may be NULL. `slots` has room for `num_slots`
// slots per row; the call fails (writing nothing) if the table's slot count differs at the time
// it runs, so a concurrent set_optimizer can never overrun the buffer. `stepped[i]` is 1 where
// an optimizer step has updated row i since its slots were initialised (de_apply_gradients sets
// it for every key it is given, whatever the gradient; an insert or a change of optimizer clears
// it): the rows TFRA's slot tables would hold. *out_n receives the rows written.
DE_API int de_export(int64_t id, int64_t offset, int64_t limit, int32_t key_dtype, void* keys,
                     void* values, void* slots, int32_t num_slots, int64_t* last_update,
                     int64_t* update_count, uint8_t* stepped, int64_t* out_n);
// Import rows (insert or overwrite), with optional slots [n, num_slots, dim] (checked against
// the table's slot count under its lock) and metadata. update_count saturates at 2^32 - 1.
// stepped NULL: a row given slots is marked stepped where they differ from the optimizer's
// initial slots, a row given none keeps its mark (a new row has none).
DE_API int de_import(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                     const void* values, const void* slots, int32_t num_slots,
                     const int64_t* last_update, const int64_t* update_count,
                     const uint8_t* stepped, int64_t* evicted);
// de_clear then de_import as one call, under the table's lock (no reader sees it empty in
// between): afterwards the table holds exactly the given rows. The in-memory table refills the
// memory it holds instead of giving it back and faulting in fresh pages.
DE_API int de_replace(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                      const void* values, const void* slots, int32_t num_slots,
                      const int64_t* last_update, const int64_t* update_count,
                      const uint8_t* stepped, int64_t* evicted);
// The table's logical clock (incremented by every write; stamped into last_update).
DE_API int de_get_clock(int64_t id, int64_t* out);
DE_API int de_set_clock(int64_t id, int64_t clock);
// Total keys evicted by the capacity limit since creation.
DE_API int de_evicted_total(int64_t id, int64_t* out);

// Change tracking (delta checkpoints; csrc/core/change_tracking.h). Every write (insert,
// insert_or_assign, accum, optimizer step, import, a change of optimizer) stamps the rows it
// writes with the table's write generation. de_changes_begin moves the generation on and returns
// it as a token (> 0), or 0 for a backend that does not track changes (then committing 0 does
// nothing); de_changes_commit(token, label) makes it the mark, naming the checkpoint it stands
// for (label: NUL-terminated, at most 256 bytes). Rows "changed since the mark" are those stamped
// at or after the committed token: a save that calls begin, writes, and commits only once
// published never loses a change. de_changes_label writes the label (NUL-terminated; *len its
// length without the NUL; capacity >= 257 always suffices; "" before the first commit).
// de_count_changed / de_export_changed are de_export over the changed rows (stepped marks
// included, as de_export writes them; any output may be NULL): *cursor (0 at first)
// is a row position that the call moves past the rows it scanned; *out_n receives the rows
// written (fewer than limit only at the end, or, for string keys, when a key did not fit).
// Backends without tracking (Redis) fail these with a message naming the reason.
DE_API int de_changes_begin(int64_t id, int64_t* token);
DE_API int de_changes_commit(int64_t id, int64_t token, const char* label);
DE_API int de_changes_label(int64_t id, char* label, int64_t capacity, int64_t* len);
DE_API int de_count_changed(int64_t id, int64_t* out);
DE_API int de_export_changed(int64_t id, int64_t* cursor, int64_t limit, int32_t key_dtype,
                             void* keys, void* values, void* slots, int32_t num_slots,
                             int64_t* last_update, int64_t* update_count, uint8_t* stepped,
                             int64_t* out_n);
// Evicted-row capture: with mode 1 (keys and metadata) or 2 (also the rows: values and slots),
// every row a capacity eviction or de_restrict removes is kept until taken; mode 0 stops (each
// call drops what was kept). de_take_evicted hands over the oldest up to `limit` kept rows (any
// output may be NULL; values and slots only with mode 2, slots sized for num_slots like
// de_export) and forgets them; *out_n the rows written, *remaining (may be NULL) those still
// kept. In-memory tables with int64/int32 keys and numeric values only; others refuse mode != 0.
DE_API int de_capture_evicted(int64_t id, int32_t mode);
DE_API int de_take_evicted(int64_t id, int64_t limit, int32_t key_dtype, void* keys, void* values,
                           void* slots, int32_t num_slots, int64_t* last_update,
                           int64_t* update_count, int64_t* out_n, int64_t* remaining);
// Bytes of memory the table's rows, slots, metadata and index occupy (and a string-valued
// table's strings with their pool). clear() and erasing give
// memory back to the OS at once (row chunks are freed as they empty, keeping one spare chunk
// per shard; a shard's index shrinks when under 1/8 full), and this count falls with it.
DE_API int de_memory_bytes(int64_t id, int64_t* out);
// Initializer rows for keys (in the value dtype), without touching any table (pure function of
// seed and key).
DE_API int de_initial_values(int64_t id, int32_t key_dtype, const void* keys, int64_t n,
                             void* values);

// String keys (see "String keys" above).
// The 64-bit fingerprint of a byte string, masked to a non-negative int64: FNV-1a (64-bit)
// of the bytes, then the splitmix64 finalizer (random.h: mix64), & INT64_MAX. Never an error.
DE_API int64_t de_string_fingerprint(const char* bytes, int64_t len);
// Strings held by a string table's mapping, and their total bytes (of the key bytes alone).
DE_API int de_string_keys_stats(int64_t id, int64_t* entries, int64_t* key_bytes);
// Testing only: string tables created after this call take their ids from the low `bits` bits
// of the fingerprint (1..63; 63, the default, restores normal ids), which forces different
// strings onto one id so tests can prove that they stay distinct. Initial rows still follow the
// full fingerprint.
DE_API int de_testing_string_id_bits(int32_t bits);

#ifdef __cplusplus
}
#endif
#endif  // DUALEMB_CORE_H_
