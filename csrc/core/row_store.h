// row_store.h — dense, chunked storage of a shard's rows.
//
// Row i holds [value (dim) | slots (num_slots * dim)] plus its key and metadata. Rows stay dense
// (erase moves the last row into the hole), so export pages are plain index ranges. Storage
// grows by fixed-size chunks: no 2x reallocation peaks, and row pointers stay valid as it grows.
#ifndef DUALEMB_ROW_STORE_H_
#define DUALEMB_ROW_STORE_H_

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace dualemb {

class RowStore {
 public:
  RowStore(int64_t width, int64_t chunk_shift) : width_(width), shift_(chunk_shift) {}

  int64_t size() const { return size_; }
  int64_t width() const { return width_; }

  float* row(int64_t i) { return chunks_[i >> shift_].values.get() + (i & mask()) * width_; }
  const float* row(int64_t i) const {
    return chunks_[i >> shift_].values.get() + (i & mask()) * width_;
  }
  int64_t& key(int64_t i) { return chunks_[i >> shift_].keys[i & mask()]; }
  int64_t key(int64_t i) const { return chunks_[i >> shift_].keys[i & mask()]; }
  int64_t& last_update(int64_t i) { return chunks_[i >> shift_].last[i & mask()]; }
  int64_t last_update(int64_t i) const { return chunks_[i >> shift_].last[i & mask()]; }
  uint32_t& count(int64_t i) { return chunks_[i >> shift_].count[i & mask()]; }
  uint32_t count(int64_t i) const { return chunks_[i >> shift_].count[i & mask()]; }

  // Appends an uninitialised row and returns its index.
  int64_t push_back() {
    if ((size_ >> shift_) >= static_cast<int64_t>(chunks_.size())) add_chunk();
    return size_++;
  }
  // Moves the last row into row i (i < size) and drops the last row.
  void move_last_into(int64_t i) {
    int64_t last = size_ - 1;
    if (i != last) {
      std::memcpy(row(i), row(last), sizeof(float) * width_);
      key(i) = key(last);
      last_update(i) = last_update(last);
      count(i) = count(last);
    }
    --size_;
    // Keep one spare chunk at most, so erase-heavy workloads give memory back.
    while (static_cast<int64_t>(chunks_.size()) > ((size_ + mask()) >> shift_) + 1)
      chunks_.pop_back();
  }
  void clear() {
    chunks_.clear();
    size_ = 0;
  }
  void reserve(int64_t n) {
    while ((static_cast<int64_t>(chunks_.size()) << shift_) < n) add_chunk();
  }
  size_t bytes() const {
    return chunks_.size() * ((size_t(1) << shift_) * (width_ * sizeof(float) + 20));
  }

 private:
  struct Chunk {
    std::unique_ptr<float[]> values;
    std::unique_ptr<int64_t[]> keys;
    std::unique_ptr<int64_t[]> last;
    std::unique_ptr<uint32_t[]> count;
  };
  int64_t mask() const { return (int64_t(1) << shift_) - 1; }
  void add_chunk() {
    const size_t rows = size_t(1) << shift_;
    Chunk c;
    c.values.reset(new float[rows * width_]);
    c.keys.reset(new int64_t[rows]);
    c.last.reset(new int64_t[rows]);
    c.count.reset(new uint32_t[rows]);
    chunks_.push_back(std::move(c));
  }

  int64_t width_;
  int64_t shift_;
  int64_t size_ = 0;
  std::vector<Chunk> chunks_;
};

}  // namespace dualemb

#endif  // DUALEMB_ROW_STORE_H_
