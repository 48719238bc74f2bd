#include "string_values.h"

#include <algorithm>
#include <stdexcept>

namespace dualemb {
namespace {

// Heap bytes a std::string holds beyond its own object (0 while it fits the small-string buffer).
size_t heap_bytes(const std::string& s) {
  return s.capacity() > std::string().capacity() ? s.capacity() + 1 : 0;
}

}  // namespace

std::vector<std::string> string_default_row(const Config& c, int64_t dim) {
  const std::string kind = c.get_string("initializer", "zeros");
  if (kind == "zeros") return std::vector<std::string>(static_cast<size_t>(dim));
  if (kind == "constant") {
    if (!c.has("value"))
      throw std::invalid_argument("a string table's constant initializer needs 'value' (a string)");
    return std::vector<std::string>(static_cast<size_t>(dim), c.get_string("value", ""));
  }
  if (kind == "vector") {
    if (!c.has("values"))
      throw std::invalid_argument("a string table's vector initializer needs 'values' (strings)");
    std::vector<std::string> v = c.get_strings("values", {});
    if (v.size() == 1) v.assign(static_cast<size_t>(dim), v[0]);
    if (static_cast<int64_t>(v.size()) != dim)
      throw std::invalid_argument("vector initializer has " + std::to_string(v.size()) +
                                  " values; it needs dim=" + std::to_string(dim) + " or 1");
    return v;
  }
  throw std::invalid_argument("a table of value dtype string takes the initializer zeros (empty "
                              "strings), constant (\"value\": a string) or vector (\"values\": "
                              "strings), not '" + kind + "'");
}

std::string_view StringValues::get(int64_t h, int64_t j) const {
  if (h == 0) return defaults_[static_cast<size_t>(j)];
  if (h < 0 || h > static_cast<int64_t>(slots_.size()) || !live_[h - 1])
    throw std::logic_error("internal error: string value handle " + std::to_string(h) +
                           " is not in the pool");
  return slots_[h - 1];
}

void StringValues::add(const std::vector<std::string_view>& strings, int64_t* out) {
  // Everything that can throw happens before the pool changes: the copies, then the room.
  std::vector<std::string> copies(strings.begin(), strings.end());
  const size_t reuse = std::min(free_.size(), copies.size());
  const size_t grow = copies.size() - reuse;
  slots_.reserve(slots_.size() + grow);
  live_.reserve(live_.size() + grow);
  size_t i = 0;
  for (; i < reuse; ++i) {
    const int64_t h = free_.back();
    free_.pop_back();
    slots_[h - 1] = std::move(copies[i]);
    live_[h - 1] = 1;
    string_bytes_ += heap_bytes(slots_[h - 1]);
    out[i] = h;
  }
  for (; i < copies.size(); ++i) {
    slots_.push_back(std::move(copies[i]));  // capacity reserved: no throw
    live_.push_back(1);
    string_bytes_ += heap_bytes(slots_.back());
    out[i] = static_cast<int64_t>(slots_.size());
  }
  entries_ += static_cast<int64_t>(copies.size());
}

void StringValues::release(const int64_t* handles, int64_t n) {
  // Room for the free list first, so freeing cannot fail half way.
  free_.reserve(free_.size() + static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t h = handles[i];
    if (h <= 0 || h > static_cast<int64_t>(slots_.size()) || !live_[h - 1]) continue;
    string_bytes_ -= heap_bytes(slots_[h - 1]);
    std::string().swap(slots_[h - 1]);  // gives the buffer back
    live_[h - 1] = 0;
    free_.push_back(h);
    --entries_;
  }
  if (entries_ == 0) clear();
}

void StringValues::keep_only(const std::vector<int64_t>& live_sorted) {
  std::vector<int64_t> dead;
  for (size_t k = 0; k < slots_.size(); ++k) {
    const int64_t h = static_cast<int64_t>(k) + 1;
    if (live_[k] && !std::binary_search(live_sorted.begin(), live_sorted.end(), h))
      dead.push_back(h);
  }
  release(dead.data(), static_cast<int64_t>(dead.size()));
}

void StringValues::clear() {
  // Swapped with empty vectors so their memory goes back too.
  std::vector<std::string>().swap(slots_);
  std::vector<uint8_t>().swap(live_);
  std::vector<int64_t>().swap(free_);
  entries_ = 0;
  string_bytes_ = 0;
}

size_t StringValues::memory_bytes() const {
  return slots_.capacity() * sizeof(std::string) + live_.capacity() +
         free_.capacity() * sizeof(int64_t) + string_bytes_;
}

}  // namespace dualemb
