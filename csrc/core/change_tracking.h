// change_tracking.h — which rows a table wrote since a mark (delta checkpoints), and the rows a
// write evicted (handed to the caller on request).
//
// Changed rows. A table has a write generation: every write stamps the rows it writes with it
// (row_store.h: change_gen, beside last_update). A checkpoint save first calls begin(), which
// moves the write generation on and returns it as the save's token; rows written from then on
// carry the token or later. Once the save is published, commit(token, label) makes the token the
// mark: "changed since the mark" is then a stamp >= the mark. A save that fails never commits, so
// the next delta still holds its rows. `label` names the checkpoint the mark stands for (the
// SHA-256 of its manifest), so a delta is only ever written on top of the checkpoint the table
// was saved to or loaded from. Keys removed since the mark are found by the delta writer
// (keys of the base minus keys now, dualemb/core/checkpoint/_delta.py), so nothing grows here
// while a table evicts between saves.
//
// Both are plain values (copyable with the table, e.g. for a snapshot), guarded by the table's
// lock like its rows.
#ifndef DUALEMB_CHANGE_TRACKING_H_
#define DUALEMB_CHANGE_TRACKING_H_

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "row_store.h"

namespace dualemb {

struct ChangeMark {
  uint32_t write_gen = 0;  // stamped into every row written now
  uint32_t mark_gen = 0;   // rows stamped >= this changed since the mark
  std::string label;       // the checkpoint of the mark ("" before the first one)

  bool changed(const RowMeta& m) const { return change_gen(m) >= mark_gen; }
  uint32_t begin() {
    // 2^31 - 1 saves: decades at one save per second; refused rather than wrapped.
    if (write_gen >= kChangeGenMask)
      throw std::length_error(
          "change tracking: this table's 2^31 - 1 save generations are used up");
    return ++write_gen;
  }
  void commit(int64_t token, const std::string& mark_label) {
    if (token <= 0 || token > write_gen)
      throw std::invalid_argument("change tracking: token " + std::to_string(token) +
                                  " was not handed out by this table's begin");
    if (mark_label.size() > 256)
      throw std::invalid_argument("change tracking: a mark label has at most 256 bytes");
    mark_gen = static_cast<uint32_t>(token);
    label = mark_label;
  }
};

// Evicted rows kept for the caller (capacity eviction and restrict), while capture is on.
// mode 0: off; 1: keys (and metadata); 2: keys, metadata and the rows (values and slots).
struct EvictedCapture {
  int mode = 0;
  int64_t row_bytes = 0;  // bytes per captured row (value + slots) when mode == 2
  std::vector<int64_t> keys;
  std::vector<int64_t> last_update;
  std::vector<int64_t> update_count;
  std::vector<unsigned char> rows;

  void reset(int new_mode, int64_t new_row_bytes) {
    mode = new_mode;
    row_bytes = new_row_bytes;
    keys.clear();
    last_update.clear();
    update_count.clear();
    rows.clear();
  }
  // Room for n more rows, so capturing during an eviction cannot fail half way. Grows
  // geometrically: rows captured over many writes and taken rarely cost amortised O(1) each.
  void reserve_more(int64_t n) {
    if (!mode || n <= 0) return;
    grow(keys, n);
    grow(last_update, n);
    grow(update_count, n);
    if (mode == 2) grow(rows, n * row_bytes);
  }
  void add(const RowMeta& m, const unsigned char* row) {
    keys.push_back(m.key);
    last_update.push_back(m.last_update);
    update_count.push_back(m.count);
    if (mode == 2) rows.insert(rows.end(), row, row + row_bytes);
  }
  int64_t size() const { return static_cast<int64_t>(keys.size()); }

 private:
  template <class V>
  static void grow(V& v, int64_t more) {
    const size_t need = v.size() + static_cast<size_t>(more);
    if (need > v.capacity()) v.reserve(std::max(need, 2 * v.capacity()));
  }
};

}  // namespace dualemb

#endif  // DUALEMB_CHANGE_TRACKING_H_
